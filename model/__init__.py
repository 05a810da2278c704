"""Capsule network models in pure PyTorch (no I/O)."""

from model.capsnet import CapsNet, CapsNetOutput, capsule_length, count_parameters, squash
from model.config import CapsNetConfig

__all__ = ["CapsNet", "CapsNetConfig", "CapsNetOutput", "capsule_length", "count_parameters", "squash"]

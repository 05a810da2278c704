"""The trainable architectures: how to build each, its loss and its class scores.

One table keeps the train loop, evaluation and export free of per-architecture branches.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from model.capsnet import CapsNet
from model.config import CapsNetConfig
from model.losses import margin_loss, reconstruction_loss


@dataclass(frozen=True)
class LossParts:
    total: torch.Tensor
    parts: dict[str, torch.Tensor]


@dataclass(frozen=True)
class Architecture:
    """Args:
    build: model config dict -> module.
    make_config: (preset name, overrides) -> model config dict.
    loss: (outputs, images, labels, training progress in [0, 1]) -> LossParts.
    scores: outputs -> class scores (B, K); the argmax is the prediction.
    forward: (model, images, labels or None) -> outputs.
    """

    name: str
    build: Callable[[dict[str, Any]], nn.Module]
    make_config: Callable[[str, dict[str, Any]], dict[str, Any]]
    loss: Callable[[Any, torch.Tensor, torch.Tensor, float], LossParts]
    scores: Callable[[Any], torch.Tensor]
    forward: Callable[[nn.Module, torch.Tensor, torch.Tensor | None], Any]


RECONSTRUCTION_WEIGHT = 0.0005  # Sabour et al. 2017 §4.1


def _dynamic_config(preset: str, overrides: dict[str, Any]) -> dict[str, Any]:
    clean = {k: v for k, v in overrides.items() if v is not None}
    if preset == "paper":
        return CapsNetConfig(**clean).to_dict()
    if preset == "tiny":
        return CapsNetConfig.tiny(**clean).to_dict()
    raise ValueError(f"unknown preset {preset!r} for arch 'dynamic' (choose paper or tiny)")


def _dynamic_loss(out: Any, images: torch.Tensor, labels: torch.Tensor, progress: float) -> LossParts:
    margin = margin_loss(out.lengths.float(), labels)
    recon = reconstruction_loss(out.reconstruction.float(), images)
    return LossParts(margin + RECONSTRUCTION_WEIGHT * recon, {"margin_loss": margin, "reconstruction_loss": recon})


ARCHITECTURES: dict[str, Architecture] = {
    "dynamic": Architecture(
        name="dynamic",
        build=lambda cfg: CapsNet(CapsNetConfig.from_dict(cfg)),
        make_config=_dynamic_config,
        loss=_dynamic_loss,
        scores=lambda out: out.lengths,
        forward=lambda model, images, labels: model(images, labels),
    ),
}


def get_architecture(name: str) -> Architecture:
    if name not in ARCHITECTURES:
        raise ValueError(f"unknown architecture {name!r}; choose one of {sorted(ARCHITECTURES)}")
    return ARCHITECTURES[name]

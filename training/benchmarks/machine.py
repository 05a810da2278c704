"""What machine a training measurement ran on: service.machine's torch-free facts plus torch's threads and device."""

from __future__ import annotations

import os
import platform
from typing import Any

import torch

from service.contract import cpu_busy_percent, cpu_model

__all__ = ["cpu_busy_percent", "machine_description"]  # cpu_busy_percent: the report samples it through here


def machine_description(device: torch.device) -> dict[str, Any]:
    """Platform, CPU, thread counts, torch version and device (and the GPU's name on CUDA)."""
    info: dict[str, Any] = {
        "platform": platform.platform(),
        "processor": cpu_model(),
        "cpu_count": os.cpu_count() or 0,
        "torch": torch.__version__,
        "torch_threads": torch.get_num_threads(),
        "device": str(device),
    }
    if device.type == "cuda":
        info["gpu"] = torch.cuda.get_device_name(device)
    return info

"""Device choice for training, evaluation and benchmarks: auto/cpu/cuda, bfloat16 support, synchronisation.

torch is imported inside the functions, so torch-free code (capsnet-evaluate --model) may import the choices.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import torch

log = logging.getLogger(__name__)

DEVICE_CHOICES = ("auto", "cpu", "cuda")


def resolve_device(name: str) -> torch.device:
    """`auto`: CUDA where it is available, else the CPU; `cuda` without CUDA is an error."""
    import torch

    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if name == "cuda" and not torch.cuda.is_available():
        raise ValueError("--device cuda was asked for but CUDA is not available")
    return torch.device(name)


def bf16_supported(device: torch.device) -> bool:
    """Whether bfloat16 autocast is fast here: any CUDA device, or a CPU with AVX512-BF16 or AMX (oneDNN)."""
    import torch

    if device.type == "cuda":
        return True
    if device.type == "cpu":
        # Native bfloat16 only: AVX512 without the BF16 extension passes oneDNN's check but emulates it, slower.
        return bool(torch.cpu._is_avx512_bf16_supported() or torch.cpu._is_amx_tile_supported())
    return False


def use_amp(requested: bool, device: torch.device) -> bool:
    """`--amp` where it helps; on a CPU without native bfloat16 it would be slower, so warn and stay float32."""
    if requested and not bf16_supported(device):
        log.warning("--amp ignored: this %s has no native bfloat16 support; training in float32", device.type)
        return False
    return requested


def synchronize(device: torch.device) -> None:
    """Wait for the device's queued work (a no-op on the CPU), so timings measure the work itself."""
    if device.type == "cuda":
        import torch

        torch.cuda.synchronize(device)

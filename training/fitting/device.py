"""Device choice for training, evaluation and benchmarks: auto/cpu/cuda, bfloat16 support, synchronisation, and
glibc's malloc tuned for training on the CPU.

torch is imported inside the functions, so torch-free code (capsnet-evaluate --model) may import the choices.
"""

from __future__ import annotations

import ctypes
import logging
import sys
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import torch

log = logging.getLogger(__name__)

DEVICE_CHOICES = ("auto", "cpu", "cuda")
M_TRIM_THRESHOLD, M_MMAP_THRESHOLD = -1, -3  # mallopt's parameters (glibc's malloc.h)
MMAP_THRESHOLD = 32 * 2**20  # the largest glibc accepts on 64-bit (half its heap size)
TRIM_THRESHOLD = 2**30


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


def keep_freed_memory() -> bool:
    """Have glibc's malloc reuse freed memory for the next tensors instead of returning it to the kernel.

    A training step allocates and frees the same megabyte-sized temporaries over and over. By default glibc maps
    an allocation above its mmap threshold (which it adjusts to the largest block freed so far) afresh and unmaps it
    when freed, so each such tensor is faulted in page by page, one page fault per 4 KiB, while the other threads
    wait (the README's "Training speed" has the figures). Blocks up to 32 MiB now come from the heap, and up to
    1 GiB of free heap is kept rather than trimmed: the freed memory is what the next step needs.

    Returns True once both settings are made; False off Linux, or where the C library has no mallopt or refuses
    a setting.
    """
    if not sys.platform.startswith("linux"):
        return False
    try:
        mallopt = ctypes.CDLL(None).mallopt  # the C library this process runs on
    except (OSError, AttributeError):  # a C library without mallopt
        return False
    mallopt.argtypes, mallopt.restype = [ctypes.c_int, ctypes.c_int], ctypes.c_int
    return bool(mallopt(M_MMAP_THRESHOLD, MMAP_THRESHOLD)) and bool(mallopt(M_TRIM_THRESHOLD, TRIM_THRESHOLD))

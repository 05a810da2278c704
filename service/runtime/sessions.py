"""ONNX Runtime sessions: execution provider choice (CUDA where a GPU is visible, else CPU) and thread settings."""

from __future__ import annotations

import logging
from pathlib import Path

import onnxruntime as ort

logger = logging.getLogger(__name__)

CUDA = "CUDAExecutionProvider"
CPU = "CPUExecutionProvider"
NVIDIA_DEVICE_FILES = (Path("/dev/nvidia0"), Path("/dev/nvidiactl"))


class ProviderUnavailable(RuntimeError):
    """A forced provider cannot be used on this machine."""


def gpu_visible() -> bool:
    """A CUDA device node is present (onnxruntime-gpu lists CUDA as available even on machines without a GPU)."""
    return any(p.exists() for p in NVIDIA_DEVICE_FILES)


def requested_providers(choice: str) -> list[str]:
    """The provider list to try for `auto`, `cuda` or `cpu`."""
    available = ort.get_available_providers()
    if choice == "cpu":
        return [CPU]
    if choice == "cuda":
        if CUDA not in available:
            raise ProviderUnavailable(f"CAPSNET_PROVIDER=cuda but this onnxruntime build offers only {available}")
        return [CUDA, CPU]
    return [CUDA, CPU] if CUDA in available and gpu_visible() else [CPU]


def preload_cuda_libraries() -> None:
    """Let onnxruntime find CUDA/cuDNN from pip-installed NVIDIA wheels where they are present."""
    preload = getattr(ort, "preload_dlls", None)
    if preload is None:
        return
    try:
        preload()
    except Exception as e:  # the system libraries may still do
        logger.debug("onnxruntime.preload_dlls failed: %s", e)


def create_session(path: Path, choice: str, intra_op_threads: int) -> ort.InferenceSession:
    """One session on the chosen provider; with `cuda` forced, a silent fallback to CPU is an error."""
    providers = requested_providers(choice)
    if CUDA in providers:
        preload_cuda_libraries()
    options = ort.SessionOptions()
    options.intra_op_num_threads = intra_op_threads
    options.inter_op_num_threads = 1
    options.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    # Idle worker threads would otherwise spin and take CPU from the event loop that parses requests.
    options.add_session_config_entry("session.intra_op.allow_spinning", "0")
    options.log_severity_level = 3
    session = ort.InferenceSession(str(path), sess_options=options, providers=providers)
    actual = session.get_providers()
    if choice == "cuda" and CUDA not in actual:
        raise ProviderUnavailable(f"CAPSNET_PROVIDER=cuda but {path.name} fell back to {actual[0]} (no usable GPU)")
    return session


def active_provider(session: ort.InferenceSession) -> str:
    return str(session.get_providers()[0])

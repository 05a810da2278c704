"""Checkpoints that hold everything needed to rebuild the model and resume training exactly."""

from __future__ import annotations

import os
from collections.abc import Collection
from pathlib import Path
from typing import Any

import torch
from torch import nn

from training.fitting.architectures import Architecture, get_architecture

CHECKPOINT_FORMAT = 1


class CheckpointMismatch(ValueError):
    """A checkpoint to continue from was made with other settings than the run asks for."""


def check_resumable(
    path: Path | str,
    saved: dict[str, Any],
    wanted: dict[str, Any],
    epochs_done: int,
    epochs: int,
    may_change: Collection[str] = ("epochs",),
) -> None:
    """Refuse to continue a checkpoint made with other settings (bar `may_change`) or with more epochs than asked."""
    differ = sorted(k for k in wanted.keys() | saved.keys() if k not in may_change and saved.get(k) != wanted.get(k))
    if differ:
        raise CheckpointMismatch(
            f"{path} was trained with other settings ({', '.join(differ)}); remove it to start over"
        )
    if epochs_done > epochs:
        raise CheckpointMismatch(f"{path} has {epochs_done} epochs, more than the {epochs} asked for; remove it")


def rng_states() -> dict[str, Any]:
    """The random-number states a run needs to continue exactly: the CPU's, and every CUDA device's."""
    states: dict[str, Any] = {"torch_rng": torch.get_rng_state()}
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        states["cuda_rng"] = torch.cuda.get_rng_state_all()
    return states


def restore_rng_states(state: dict[str, Any]) -> None:
    torch.set_rng_state(state["torch_rng"])
    cuda = state.get("cuda_rng")
    if cuda is not None and torch.cuda.is_available() and len(cuda) == torch.cuda.device_count():
        torch.cuda.set_rng_state_all(cuda)


def save_checkpoint(path: Path, state: dict[str, Any]) -> None:
    """Write atomically (temp file + rename) so an interrupted save never leaves a broken file."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(path.suffix + ".tmp")
    torch.save({"format": CHECKPOINT_FORMAT, **state}, tmp)
    os.replace(tmp, path)


def load_checkpoint(path: str | os.PathLike[str]) -> dict[str, Any]:
    p = Path(path)
    if not p.is_file():
        raise FileNotFoundError(f"checkpoint {p} not found")
    try:
        state: dict[str, Any] = torch.load(p, map_location="cpu", weights_only=False)
    except Exception as e:
        raise ValueError(f"checkpoint {p} cannot be read: {e}") from e
    if not isinstance(state, dict) or state.get("format") != CHECKPOINT_FORMAT:
        raise ValueError(f"checkpoint {p} is not a capsnet-serve checkpoint (format {CHECKPOINT_FORMAT})")
    return state


def load_model(
    path: str | os.PathLike[str], device: torch.device | str = "cpu"
) -> tuple[nn.Module, Architecture, dict[str, Any]]:
    """Rebuild the model of a checkpoint in eval mode; also returns its architecture and the state."""
    state = load_checkpoint(path)
    arch = get_architecture(state["arch"])
    model = arch.build(state["model_config"])
    model.load_state_dict(state["model"])
    return model.to(device).eval(), arch, state


def training_command(argv: list[str]) -> list[str]:
    """The command line as `capsnet-train …`: `python -m training.fitting.train` runs the same program."""
    program = Path(argv[0]).name if argv else "capsnet-train"
    if program in ("train.py", "__main__.py", "-m", "-c", ""):
        program = "capsnet-train"
    return [program, *argv[1:]]

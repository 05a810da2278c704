"""The options several commands share, defined once: `--data-dir`, `--device` and `--threads`.

Each command names what the option is for it; the flag, its type, choices and default text are the same everywhere.
"""

from __future__ import annotations

import argparse

from training.data.mnist import DATA_DIR_ENV
from training.fitting.device import DEVICE_CHOICES


def add_data_dir(parser: argparse.ArgumentParser, what: str = "MNIST IDX directory") -> None:
    """`--data-dir DIR`, default None: the commands read $CAPSNET_DATA_DIR then (training.data.mnist)."""
    parser.add_argument("--data-dir", default=None, help=f"{what} (default: ${DATA_DIR_ENV})")


def add_device(parser: argparse.ArgumentParser, what: str = "device") -> None:
    """`--device auto|cpu|cuda`, default auto (training.fitting.device.resolve_device)."""
    parser.add_argument("--device", default="auto", choices=DEVICE_CHOICES, help=f"{what} (default: auto)")


def add_threads(
    parser: argparse.ArgumentParser, what: str, default: int | None = None, default_text: str | None = None
) -> None:
    """`--threads N`: torch's CPU threads or ONNX Runtime's intra-op threads, as `what` says."""
    shown = default_text if default_text is not None else str(default)
    parser.add_argument("--threads", type=int, default=default, help=f"{what} (default: {shown})")

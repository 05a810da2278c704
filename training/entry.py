"""Console-script entry points: a serving-only install gets one line on how to add the training extra, not a traceback.

`make serve` installs the service without PyTorch or ONNX; the training commands are installed all the same.
"""

from __future__ import annotations

import importlib
import sys
from collections.abc import Callable

OWN_PACKAGES = frozenset({"model", "training", "service"})
INSTALL_HINT = "pip install -e '.[training]' (from a clone) or pip install 'capsnet-serve[training]'"
EXIT_USAGE = 2


def cli_error(prog: str, error: Exception) -> int:
    """Print `error` to stderr as one line, argparse's `PROG: error: message`; return the usage exit status."""
    print(f"{prog}: error: {' '.join(str(error).split())}", file=sys.stderr)
    return EXIT_USAGE


def _run(module: str, prog: str) -> int:
    try:
        main: Callable[[], int] = importlib.import_module(module).main
    except ModuleNotFoundError as e:
        missing = (e.name or "").split(".")[0]
        if not missing or missing in OWN_PACKAGES:
            raise
        print(f"{prog}: error: needs the training extra (no module named {missing!r}): {INSTALL_HINT}", file=sys.stderr)
        return EXIT_USAGE
    return main()


def train() -> int:
    return _run("training.fitting.train", "capsnet-train")


def evaluate() -> int:
    return _run("training.fitting.evaluate", "capsnet-evaluate")


def export() -> int:
    return _run("training.export.exporter", "capsnet-export")


def quantize() -> int:
    return _run("training.quantize.static", "capsnet-quantize")


def ood() -> int:
    return _run("training.ood.calibrate", "capsnet-ood")

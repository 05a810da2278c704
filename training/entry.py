"""Console-script entry points: a serving-only install gets one line on how to add the training extra, not a traceback.

`make serve` installs the service without PyTorch or ONNX; the training commands are installed all the same.
"""

from __future__ import annotations

import importlib
import importlib.util
import os
import shlex
import shutil
import sys
from collections.abc import Callable
from pathlib import Path

OWN_PACKAGES = frozenset({"model", "training", "service"})
INSTALL_HINT = "pip install -e '.[training]' (from a clone) or pip install 'capsnet-serve[training]'"
BATCH_HINT = "pip install -e '.[batch]' (from a clone) or pip install 'capsnet-serve[batch]'"
EXIT_USAGE = 2


def cli_error(prog: str, error: Exception) -> int:
    """Print `error` to stderr as one line, argparse's `PROG: error: message`; return the usage exit status."""
    print(f"{prog}: error: {' '.join(str(error).split())}", file=sys.stderr)
    return EXIT_USAGE


def bundled_repository() -> Path:
    """model/zoo, the repository `make serve` serves (found without importing torch)."""
    spec = importlib.util.find_spec("model")
    locations = list(spec.submodule_search_locations or []) if spec is not None else []
    return Path(locations[0]) / "zoo" if locations else Path("model") / "zoo"


def data_dir_option(data_dir: str | None) -> str:
    """The ` --data-dir ...` to repeat in a suggested command: the one given, none when $CAPSNET_DATA_DIR is set."""
    if data_dir:
        return f" --data-dir {shlex.quote(data_dir)}"
    return "" if os.environ.get("CAPSNET_DATA_DIR") else " --data-dir DIR"


def sibling_command(name: str, argv0: str | None = None) -> str:
    """How to run the console script `name` the way this one was run: bare when PATH finds it there (an activated
    venv), else by the path this one was given, e.g. `.venv/bin/capsnet-evaluate`."""
    invoked = Path(argv0 if argv0 is not None else sys.argv[0])
    if not invoked.name.startswith("capsnet-"):  # python -m training.export, or a test: the bare name
        return name
    found = shutil.which(name)
    if found is not None and Path(found).parent.resolve() == invoked.parent.resolve():
        return name
    directory = invoked.parent if not invoked.is_absolute() else Path(os.path.relpath(invoked.parent))
    return str(directory / name)


def _run(module: str, prog: str, hint: str = INSTALL_HINT, extra: str = "training") -> int:
    try:
        main: Callable[[], int] = importlib.import_module(module).main
    except ModuleNotFoundError as e:
        missing = (e.name or "").split(".")[0]
        if not missing or missing in OWN_PACKAGES:
            raise
        print(f"{prog}: error: needs the {extra} extra (no module named {missing!r}): {hint}", file=sys.stderr)
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


def predict() -> int:
    return _run("training.predict.main", "capsnet-predict", BATCH_HINT, "batch")

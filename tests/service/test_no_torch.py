"""The serving install has no PyTorch: nothing under service/ may import torch, model/ or training/."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[2]

PROBE = """
import pkgutil, importlib, sys
import service
for module in pkgutil.walk_packages(service.__path__, "service."):
    importlib.import_module(module.name)
from service.main import create_app
create_app()
leaked = sorted(m for m in sys.modules if m.split(".")[0] in ("torch", "model", "training"))
print(leaked)
sys.exit(1 if leaked else 0)
"""


def test_service_never_imports_torch_model_or_training() -> None:
    result = subprocess.run(
        [sys.executable, "-c", PROBE], cwd=REPO_ROOT, capture_output=True, text=True, timeout=120, check=False
    )
    assert result.returncode == 0, f"service/ imported {result.stdout.strip()}\n{result.stderr[-2000:]}"

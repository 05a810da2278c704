"""The training commands in a serving-only install (no torch, no onnx): one line saying what to install, exit 2."""

from __future__ import annotations

import subprocess
import sys

import pytest

from tests.conftest import REPO_ROOT

# Runs an entry point with `blocked` made unimportable, as in an install without the training extra.
BLOCKED_RUN = """
import importlib.abc, sys
class Block(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path, target=None):
        if name.split(".")[0] in {blocked!r}:
            raise ModuleNotFoundError(f"No module named {{name!r}}", name=name)
sys.meta_path.insert(0, Block())
for name in list(sys.modules):
    if name.split(".")[0] in {blocked!r}:
        del sys.modules[name]
sys.argv = [{prog!r}, *{args!r}]
from training import entry
sys.exit(entry.{function}())
"""


def run_blocked(function: str, prog: str, blocked: set[str], args: list[str]) -> subprocess.CompletedProcess[str]:
    code = BLOCKED_RUN.format(function=function, prog=prog, blocked=blocked, args=args)
    return subprocess.run(
        [sys.executable, "-c", code], cwd=REPO_ROOT, capture_output=True, text=True, timeout=120, check=False
    )


@pytest.mark.parametrize(
    ("function", "prog", "blocked"),
    [
        ("train", "capsnet-train", {"torch"}),
        ("export", "capsnet-export", {"onnx", "torch"}),
        ("quantize", "capsnet-quantize", {"onnx", "torch"}),
    ],
)
def test_training_command_without_the_training_extra_says_how_to_install_it(
    function: str, prog: str, blocked: set[str]
) -> None:
    result = run_blocked(function, prog, blocked, ["--help"])
    assert result.returncode == 2, result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith(f"{prog}: error: needs the training extra (no module named ")
    assert "pip install -e '.[training]'" in lines[0] and "Traceback" not in result.stderr


def test_evaluate_of_a_model_directory_needs_no_torch() -> None:
    result = run_blocked("evaluate", "capsnet-evaluate", {"torch"}, ["--help"])
    assert result.returncode == 0, result.stderr
    assert "--model" in result.stdout


def test_entry_points_run_the_commands() -> None:
    code = "import sys; sys.argv = ['capsnet-train', '--help']; from training import entry; entry.train()"
    result = subprocess.run(
        [sys.executable, "-c", code], cwd=REPO_ROOT, capture_output=True, text=True, timeout=120, check=False
    )
    assert result.returncode == 0 and "--val-split" in result.stdout, result.stderr

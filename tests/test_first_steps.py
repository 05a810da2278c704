"""Where a newcomer starts: the console scripts are not on PATH, and the Makefile says so when it installs them."""

from __future__ import annotations

import shutil
import subprocess

import pytest

from tests.conftest import REPO_ROOT

ACTIVATE = "source .venv/bin/activate"


@pytest.mark.parametrize("target", [".venv/.serve-installed", ".venv/.dev-installed"])
def test_installing_says_where_the_commands_are(target: str) -> None:
    if shutil.which("make") is None:
        pytest.skip("no make on PATH")
    plan = subprocess.run(["make", "-n", "-B", target], cwd=REPO_ROOT, capture_output=True, text=True, check=True)
    (hint,) = [line for line in plan.stdout.splitlines() if "capsnet-* commands" in line]
    assert ".venv/bin/capsnet-train" in hint and f"'{ACTIVATE}'" in hint

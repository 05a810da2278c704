"""`capsnet-quantize` as a console script never replaces an existing model directory without --force."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import REPO_ROOT

SCRIPT = Path(sys.executable).with_name("capsnet-quantize")


def test_an_existing_out_is_refused_before_any_work(tmp_path: Path) -> None:
    if not SCRIPT.exists():
        pytest.skip(f"capsnet-quantize is not installed beside {sys.executable} (pip install -e .)")
    out = tmp_path / "mine-int8"
    out.mkdir()
    card = {"name": "mine-int8", "version": "3"}
    (out / "model.json").write_text(json.dumps(card))
    command = [str(SCRIPT), str(tmp_path / "no-such-parent"), "--out", str(out), "--data-dir", str(tmp_path)]
    done = subprocess.run(command, cwd=REPO_ROOT, env=dict(os.environ), capture_output=True, text=True, timeout=300)
    assert done.returncode == 2 and done.stdout == ""
    assert done.stderr.splitlines()[-1] == (
        f"capsnet-quantize: error: --out {out} holds model 'mine-int8' version 3: write to a new name (e.g. --out "
        f"{tmp_path / 'mine-int8-2'}), or pass --force to replace it"
    )
    assert json.loads((out / "model.json").read_text()) == card
    forced = subprocess.run([*command, "--force"], cwd=REPO_ROOT, capture_output=True, text=True, timeout=300)
    assert forced.returncode == 2 and "no-such-parent" in forced.stderr  # --force goes on to the parent, missing here

"""The training command a checkpoint (and so a card) records names no absolute path of the machine."""

from __future__ import annotations

from pathlib import Path

import pytest

from training.fitting.checkpoint import training_command


def test_training_command_writes_paths_relative_to_the_working_directory(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    checkout = tmp_path / "checkout"
    checkout.mkdir()
    monkeypatch.chdir(checkout)
    argv = ["/venv/bin/capsnet-train", "--data-dir", str(tmp_path / "shared" / "mnist"), f"--out={checkout}/runs/a"]
    assert training_command(argv) == ["capsnet-train", "--data-dir", "../shared/mnist", "--out=runs/a"]
    assert training_command(["capsnet-train", "--epochs", "3"]) == ["capsnet-train", "--epochs", "3"]

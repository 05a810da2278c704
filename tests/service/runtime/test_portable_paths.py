"""The model directory's path helpers: cards record paths relative to the checkout, clients see no machine path."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from service.runtime.model_dir import portable_command, portable_path, without_machine_paths


def test_portable_path_is_relative_to_the_working_directory(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    checkout = tmp_path / "checkout"
    checkout.mkdir()
    monkeypatch.chdir(checkout)
    assert portable_path(tmp_path / "shared" / "data" / "mnist") == os.path.join("..", "shared", "data", "mnist")
    assert portable_path(checkout / "runs" / "x") == os.path.join("runs", "x")
    assert portable_path("runs/x") == "runs/x"


def test_portable_command_rewrites_bare_and_option_paths(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    argv = ["--data-dir", str(tmp_path / "mnist"), f"--out={tmp_path}/runs/a", "--lr", "0.001", "--note=a/b"]
    assert portable_command(argv) == ["--data-dir", "mnist", "--out=runs/a", "--lr", "0.001", "--note=a/b"]


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("--data-dir /work/shared/data/mnist --epochs 3", "--data-dir …/data/mnist --epochs 3"),
        ("/tmp/x", "…/tmp/x"),
        ("pixel / 255: white digit on black", "pixel / 255: white digit on black"),
        ("see https://example.org/a/b and 1/f noise, and/or ../shared/data", None),
    ],
)
def test_without_machine_paths(text: str, expected: str | None) -> None:
    assert without_machine_paths(text) == (text if expected is None else expected)
    assert without_machine_paths({"a": [text], "n": 3}) == {"a": [without_machine_paths(text)], "n": 3}

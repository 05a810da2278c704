"""The batch-prediction benchmark runs end to end (its figures are printed, never asserted)."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.conftest import REPO_ROOT
from training.benchmarks.predict import main

MODEL = REPO_ROOT / "model" / "zoo" / "capsnet-mnist"


@pytest.mark.slow
def test_dry_run_prints_both_rates(synthetic_mnist: Path, capsys: pytest.CaptureFixture[str]) -> None:
    if not (MODEL / "model.json").is_file():
        pytest.skip("the bundled model is absent")
    assert main(["--dry-run", "--data-dir", str(synthetic_mnist), "--model", str(MODEL), "--images", "32"]) == 0
    out = capsys.readouterr().out
    assert "usable CPUs" in out and "raw ONNX Runtime: best rate at batch 64" in out
    assert "% of raw's best rate" in out and "ms CPU per image" in out

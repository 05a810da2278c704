"""The analysis recipe: the pose dimension that tracks ink is found, and the figure is drawn from a job's output."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from training.predict.main import main as predict_main
from training.predict.recipe import ink_correlations, load, main

pd = pytest.importorskip("pandas", reason="the recipe needs pandas (pip install -e '.[dev]')")


def test_the_dimension_that_follows_ink_is_found() -> None:
    rng = np.random.default_rng(0)
    ink = rng.uniform(50, 200, size=40)
    poses = rng.normal(size=(40, 4))
    poses[:20, 2] = -0.01 * ink[:20]  # class "a": dimension 2 falls as ink rises
    poses[20:, 0] = 0.02 * ink[20:] + rng.normal(scale=0.1, size=20)  # class "b": dimension 0 rises
    df = pd.DataFrame({"predicted_label": ["a"] * 20 + ["b"] * 20, "ink": ink})
    df[[f"d{i}" for i in range(4)]] = poses
    r = ink_correlations(df)
    assert list(r.columns) == ["d0", "d1", "d2", "d3"] and list(r.index) == ["a", "b"]
    assert r.abs().idxmax(axis=1).to_dict() == {"a": "d2", "b": "d0"}
    assert r.loc["a", "d2"] == pytest.approx(-1.0) and r.loc["b", "d0"] > 0.9


@pytest.mark.slow
def test_the_figure_command(
    idx_file: Path, dynamic_model: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    pytest.importorskip("matplotlib", reason="the figure needs matplotlib (the training extra)")
    out = tmp_path / "predictions"
    assert (
        predict_main(
            [
                str(idx_file),
                "--model",
                str(dynamic_model),
                "--out",
                str(out),
                "--all-poses",
                "--threads",
                "1",
                "--no-progress",
            ]
        )
        == 0
    )
    assert len(load(out).filter(regex=r"^d\d+$").columns) == 16
    figure = tmp_path / "figure.png"
    with pytest.raises(ValueError, match="no predicted class has 13 images"):
        main([str(out), "--model", str(dynamic_model), "--out", str(figure), "--min-images", "13"])
    assert main([str(out), "--model", str(dynamic_model), "--out", str(figure), "--min-images", "3"]) == 0
    summary = json.loads(capsys.readouterr().out.splitlines()[-2])
    assert summary["images"] == 12 and 0 <= summary["dimension"] < 16 and -1 <= summary["r"] <= 1
    assert figure.stat().st_size > 10_000

"""The power-law projection of a report run's curve: where it reaches a target, and when it never does."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from training.report.projection import main, project


def curve(a: float, b: float, epochs: int, epoch_images: int, rate: float = 50.0) -> list[dict]:
    return [
        {"epoch": k, "test_error": a * (k * epoch_images) ** -b, "images_per_second": rate}
        for k in range(1, epochs + 1)
    ]


def test_an_exact_power_law_is_followed_to_its_target() -> None:
    rows = curve(a=2.0, b=0.5, epochs=10, epoch_images=1000)  # error 2 / sqrt(images): 0.02 at 10,000 images
    p = project(rows, target=0.01, epoch_images=1000)
    assert p.slope == pytest.approx(0.5) and p.epochs_fitted == 5  # the second half of the curve
    assert p.images_to_target is not None and abs(p.images_to_target - 40_000) <= 1  # 2 / sqrt(40,000) = 0.01
    assert p.images_more == p.images_to_target - 10_000
    assert p.hours_more == pytest.approx(round(p.images_more / 50 / 3600, 1))
    assert not p.reached


def test_a_flat_or_rising_curve_reaches_no_target_and_a_reached_one_says_so() -> None:
    flat = [{"epoch": k, "test_error": 0.02} for k in range(1, 7)]
    p = project(flat, target=0.01, epoch_images=1000)
    assert p.slope == 0 and p.images_to_target is None and p.hours_more is None
    done = curve(a=2.0, b=0.5, epochs=10, epoch_images=10_000)  # 0.0063 at 100,000 images
    q = project(done, target=0.01, epoch_images=10_000)
    assert q.reached and q.images_more == 0


def test_the_command_prints_json_and_names_bad_input(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    metrics = tmp_path / "metrics.jsonl"
    metrics.write_text("\n".join(json.dumps(r) for r in curve(2.0, 0.5, 6, 1000)) + "\n")
    assert main([str(metrics), "--target", "0.01", "--epoch-images", "1000", "--last", "3"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["epochs_fitted"] == 3 and abs(out["images_to_target"] - 40_000) <= 1
    assert main([str(metrics), "--target", "0"]) == 2
    assert "--target must be above 0" in capsys.readouterr().err
    metrics.write_text(json.dumps({"epoch": 1, "test_error": 0.1}) + "\n")
    assert main([str(metrics), "--target", "0.01"]) == 2
    assert "at least 2 epochs" in capsys.readouterr().err
    assert main([str(tmp_path / "missing.jsonl"), "--target", "0.01"]) == 2

"""The EM learning probe: its windows, its reproducibility, and its errors (no claim about learning speed)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from training.benchmarks import em_probe
from training.fitting.train import TrainConfig

TINY = ["--preset", "tiny", "--batch-size", "8", "--images", "32"]


def test_probe_prints_its_settings_then_one_window_per_every_steps(
    mnist_dir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    args = ["--data-dir", str(mnist_dir), *TINY, "--steps", "5", "--every", "2", "--routing-iterations", "1"]
    assert em_probe.main([*args, "--final-inverse-temperature", "1.5", "--beta-u-init", "0.5"]) == 0
    lines = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    settings = lines[0]["probe"]
    assert (settings["routing_iterations"], settings["final_inverse_temperature"], settings["beta_u_init"]) == (
        1,
        1.5,
        0.5,
    )
    assert settings["margin_progress"] == 0.0
    windows = lines[1:]
    assert [w["step"] for w in windows] == [2, 4, 5]  # the last, shorter window is reported too
    for w in windows:
        assert 0.0 <= w["accuracy"] <= 1.0 and 0.0 < w["activation_mean"] < 1.0
        assert w["loss"] > 0 and 0 < w["grad_norm_median"] <= w["grad_norm_max"]


def test_the_settings_reach_the_model() -> None:
    args = em_probe.build_parser().parse_args(["--final-inverse-temperature", "1.5", "--variance-floor", "0.01"])
    assert em_probe.model_overrides(args) == {"final_inverse_temperature": 1.5, "variance_floor": 0.01}


def test_same_seed_same_windows() -> None:
    images, labels = torch.rand(24, 1, 28, 28), torch.randint(0, 10, (24,))
    cfg = TrainConfig(arch="em", preset="tiny", batch_size=8, lr=0.01, seed=3)
    first = list(em_probe.run_probe(cfg, images, labels, steps=4, every=2))
    assert first == list(em_probe.run_probe(cfg, images, labels, steps=4, every=2))
    assert len(first) == 2


def test_batches_reshuffle_each_pass_and_never_span_two() -> None:
    order = em_probe.batches(10, 4, torch.Generator().manual_seed(0))
    first_pass = [next(order) for _ in range(2)]  # 10 // 4 = 2 whole batches per pass
    assert len(torch.cat(first_pass).unique()) == 8
    assert all(len(next(order)) == 4 for _ in range(5))


def test_dry_run_is_one_step(mnist_dir: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert em_probe.main(["--data-dir", str(mnist_dir), *TINY, "--dry-run"]) == 0
    windows = capsys.readouterr().out.splitlines()[1:]
    assert [json.loads(w)["step"] for w in windows] == [1]


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        (["--routing-iterations", "0"], "routing_iterations must be >= 1, got 0"),
        (["--steps", "0"], "--steps must be at least 1, got 0"),
        (["--images", "4"], "4 training images are fewer than one batch of 8"),
    ],
)
def test_bad_settings_exit_2_naming_the_problem(
    mnist_dir: Path, capsys: pytest.CaptureFixture[str], extra: list[str], message: str
) -> None:
    with pytest.raises(SystemExit) as exc:
        em_probe.main(["--data-dir", str(mnist_dir), *TINY, *extra])
    assert exc.value.code == 2
    assert f"python -m training.benchmarks.em_probe: error: {message}" in capsys.readouterr().err


def test_missing_data_directory_exits_2(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exc:
        em_probe.main(["--data-dir", str(tmp_path / "absent"), *TINY])
    assert exc.value.code == 2
    assert "does not exist or is not a directory" in capsys.readouterr().err

"""Outlier exposure: the non-digit pool, the "no class present" losses, and a step that trains on both."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from model.capsnet import CapsNetOutput
from model.em import EMCapsNetOutput
from training.data.mnist import MNISTSplit
from training.fitting import exposure, train
from training.fitting.architectures import get_architecture
from training.fitting.checkpoint import load_checkpoint, save_checkpoint
from training.fitting.train import TrainConfig, mnist_trainer
from training.ood.nondigits import NONDIGIT_SETS

TINY = dict(preset="tiny", batch_size=16, eval_batch_size=32, device="cpu", seed=1)
N_POOL = 2 * (len(NONDIGIT_SETS) + exposure.TURNED_SETS)  # two images of every fitting set, six turned digits


def digits(n: int = 40, canvas: int = 28) -> MNISTSplit:
    rng = np.random.default_rng(0)
    images = np.zeros((n, 1, canvas, canvas), np.uint8)
    images[:, :, 4:10, 8:12] = 255  # a mark in the top half: a quarter turn moves it
    return MNISTSplit(images, rng.integers(0, 10, n).astype(np.int64))


def test_the_pool_holds_every_fitting_set_and_turned_digits_in_equal_shares() -> None:
    sizes = exposure.pool_sizes(N_POOL + 1)
    assert set(sizes) == {*NONDIGIT_SETS, "turned"} and sum(sizes.values()) == N_POOL + 1
    assert {sizes[name] for name in NONDIGIT_SETS} == {2} and sizes["turned"] == 7
    pool = exposure.exposure_pool(N_POOL, 3, digits())
    assert pool.shape == (N_POOL, 1, 28, 28) and pool.dtype == np.uint8
    assert np.array_equal(pool, exposure.exposure_pool(N_POOL, 3, digits()))  # seeded: a resumed run's pool
    assert not np.array_equal(pool, exposure.exposure_pool(N_POOL, 4, digits()))
    turned = pool[-sizes["turned"] + 1 :]  # no turned digit keeps its mark where the upright ones have it
    assert turned[:, :, 4:10, 8:12].max(initial=0) < 255 and turned.max() == 255


def test_the_pool_is_centred_on_larger_canvases_and_refuses_too_few_digits() -> None:
    pool = exposure.exposure_pool(N_POOL, 3, digits(canvas=40))
    assert pool.shape == (N_POOL, 1, 40, 40)
    assert pool[: 2 * len(NONDIGIT_SETS), :, :6].max(initial=0) == 0  # the 28x28 drawings sit inside a 6-pixel frame
    few = MNISTSplit(digits().images[:3], np.array([1, 8, 0]))  # all three stay digits when turned
    with pytest.raises(ValueError, match="asks for more turned digits than 3 training digits give"):
        exposure.exposure_pool(N_POOL, 3, few)


@pytest.mark.parametrize("arch", ["dynamic", "em"])
def test_no_class_present_costs_nothing_below_a_tenth_and_grows_above(arch: str) -> None:
    absent = get_architecture(arch).absent
    assert absent is not None
    low, high = torch.full((2, 10), 0.09), torch.full((2, 10), 0.5)
    if arch == "dynamic":
        make = lambda s: CapsNetOutput(s, torch.zeros(2, 10, 16), torch.zeros(2, 784))  # noqa: E731
    else:
        make = lambda s: EMCapsNetOutput(s, torch.zeros(2, 10, 4, 4), torch.zeros(2, 9, 16))  # noqa: E731
    assert float(absent(make(low))) == 0.0
    assert float(absent(make(high))) == pytest.approx(10 * 0.5 * 0.4**2)  # λ (|v| - m-)² over the 10 classes
    assert get_architecture("baseline").absent is None


def trainer(synthetic_mnist: Path, out: Path | None, **cfg: Any) -> Any:
    """A tiny run with exposure whose capsules start long (a tiny model's start below 0.1: nothing to learn)."""
    config = TrainConfig(**{**TINY, "epochs": 1, "exposure": N_POOL, **cfg})  # type: ignore[arg-type]
    run = mnist_trainer(config, str(synthetic_mnist), out)
    with torch.no_grad():
        run.model.digit.weight.mul_(1000.0)
    return run


def test_a_step_adds_the_weighted_absent_loss_of_half_a_batch_of_non_digits(synthetic_mnist: Path) -> None:
    run = trainer(synthetic_mnist, None)
    task = run.task
    assert isinstance(task, train.ExposureTask) and len(task.pool) == N_POOL
    batch = task.batches(0)[0]
    seen: list[int] = []
    forward = task.arch.forward
    task.arch = replace(task.arch, forward=lambda m, x, y: seen.append(len(x)) or forward(m, x, y))
    first = task.step(run.model, batch, 0.0, run._autocast)
    assert seen == [len(batch) + len(batch) // 2]  # one forward: the digits and half as many non-digits
    parts = {k: float(v) for k, v in first.parts.items()}
    assert parts["absent_loss"] > 0 and first.n == len(batch)
    digit_loss = parts["margin_loss"] + 0.0005 * parts["reconstruction_loss"]
    assert float(first.loss.detach()) == pytest.approx(digit_loss + 0.5 * parts["absent_loss"], rel=1e-5)
    task.cfg = replace(task.cfg, exposure_weight=2.0)
    task.batches(0)  # the same draws again
    again = task.step(run.model, batch, 0.0, run._autocast)
    assert float(again.loss.detach()) == pytest.approx(digit_loss + 2.0 * parts["absent_loss"], rel=1e-5)


def test_training_with_exposure_shortens_the_non_digits_capsules(synthetic_mnist: Path, tmp_path: Path) -> None:
    run = trainer(synthetic_mnist, tmp_path / "run", epochs=3, lr=0.001, exposure_weight=4.0)
    pool = train.to_float_t(run.task.pool)

    def longest() -> float:
        with torch.no_grad():
            return float(run.model(pool).lengths.max(dim=1).values.mean())

    before = longest()
    rows = run.fit()
    assert "absent_loss" in rows[0] and rows[-1]["absent_loss"] < rows[0]["absent_loss"]
    assert longest() < before
    saved = load_checkpoint(tmp_path / "run" / "last.pt")
    assert saved["train_config"]["exposure"] == N_POOL and "draws" in saved["task_state"]


def test_a_checkpoint_from_before_exposure_resumes_strictly(synthetic_mnist: Path, tmp_path: Path) -> None:
    """Settings added to TrainConfig since a checkpoint was written count as their defaults."""
    config = TrainConfig(epochs=1, **TINY)  # type: ignore[arg-type]
    mnist_trainer(config, str(synthetic_mnist), tmp_path / "old").fit()
    state = load_checkpoint(tmp_path / "old" / "last.pt")
    for key in ("exposure", "exposure_weight"):
        del state["train_config"][key]
    save_checkpoint(tmp_path / "old.pt", state)
    longer = TrainConfig(epochs=2, **TINY)  # type: ignore[arg-type]
    resumed = mnist_trainer(longer, str(synthetic_mnist), tmp_path / "old", resume=str(tmp_path / "old.pt"),
                            strict_resume=True)  # fmt: skip
    assert resumed.epoch == 1
    with pytest.raises(ValueError, match="trained with other settings \\(exposure\\)"):
        mnist_trainer(
            TrainConfig(epochs=2, exposure=N_POOL, **TINY),  # type: ignore[arg-type]
            str(synthetic_mnist), tmp_path / "old", resume=str(tmp_path / "old.pt"), strict_resume=True,
        )  # fmt: skip


def test_cli_trains_with_exposure_and_refuses_what_cannot(
    synthetic_mnist: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    argv = ["--data-dir", str(synthetic_mnist), "--preset", "tiny", "--dry-run", "--exposure", str(N_POOL)]
    assert train.main(argv) == 0
    assert json.loads(capsys.readouterr().out)["absent_loss"] >= 0
    for bad, message in [
        (["--exposure", "-1"], "--exposure must be 0 (off) or a number of non-digit images, got -1"),
        (["--exposure", "5", "--arch", "baseline"], "--exposure needs a capsule architecture (dynamic or em), not "
         "--arch baseline"),
        (["--exposure-weight", "0"], "--exposure-weight must be positive, got 0.0"),
    ]:  # fmt: skip
        with pytest.raises(SystemExit) as e:
            train.main(["--data-dir", str(tmp_path), *bad])
        assert e.value.code == 2 and capsys.readouterr().err.splitlines()[-1] == f"capsnet-train: error: {message}"


def test_em_trains_with_exposure_at_the_full_spread_margin_once_warm(synthetic_mnist: Path) -> None:
    config = TrainConfig(**{**TINY, "arch": "em", "batch_size": 4, "epochs": 1, "exposure": N_POOL})  # type: ignore[arg-type]
    run = mnist_trainer(config, str(synthetic_mnist), None)
    batch = run.task.batches(0)[0]
    cold = run.task.step(run.model, batch, 0.0, run._autocast)
    assert float(cold.parts["spread_margin"]) == pytest.approx(0.2) and "absent_loss" in cold.parts
    run.task.warm_start = True  # as after --init-from: the model has been through the margin's ramp
    warm = run.task.step(run.model, batch, 0.0, run._autocast)
    assert float(warm.parts["spread_margin"]) == pytest.approx(0.9)

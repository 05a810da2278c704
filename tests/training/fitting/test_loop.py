"""The one training loop with a task from outside: a toy regression trains, checkpoints and resumes exactly."""

from __future__ import annotations

import json
import math
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from torch import nn

from training.data.mnist import load_split
from training.fitting import loop, multimnist
from training.fitting.checkpoint import CheckpointMismatch, load_checkpoint, save_checkpoint
from training.fitting.config import TrainConfig
from training.fitting.loop import Autocast, Step, Trainer

CFG = TrainConfig(arch="toy", epochs=3, batch_size=8, lr=0.05, seed=0, device="cpu")


class ToyTask:
    """y = x·w on random x, batches in an order drawn from an RNG that the checkpoint must carry."""

    def __init__(self, seed: int = 0) -> None:
        rng = np.random.default_rng(123)
        self.x = torch.from_numpy(rng.normal(size=(40, 3)).astype(np.float32))
        self.y = self.x @ torch.tensor([1.0, -2.0, 0.5])
        self.order = np.random.default_rng(seed)
        self.data_hashes = {"toy": "0" * 64}
        self.autocast_used = 0

    def batches(self, epoch: int) -> list[np.ndarray]:
        order = self.order.permutation(len(self.x))
        return [order[i : i + 8] for i in range(0, len(order), 8)]

    def step(self, model: nn.Module, batch: np.ndarray, progress: float, autocast: Autocast) -> Step:
        with autocast():
            self.autocast_used += 1
            prediction = model(self.x[batch]).squeeze(1)
        loss = ((prediction - self.y[batch]) ** 2).mean()
        return Step(loss, {"progress": progress}, len(batch))

    def evaluate(self, model: nn.Module, max_batches: int | None) -> dict[str, Any]:
        with torch.no_grad():
            mse = float(((model(self.x).squeeze(1) - self.y) ** 2).mean())
        return {"test_error": mse, "test_n": len(self.x)}

    def state_dict(self) -> dict[str, Any]:
        return {"order": self.order.bit_generator.state}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.order.bit_generator.state = state["order"]


def toy_trainer(out: Path | None, epochs: int, resume: str | None = None, ema: float = 0.0) -> Trainer[ToyTask]:
    torch.manual_seed(0)
    model = nn.Linear(3, 1)
    cfg = replace(CFG, epochs=epochs, ema=ema)
    return Trainer(cfg, ToyTask(), model, {"in": 3, "out": 1}, out, resume, strict_resume=True)


def test_a_task_from_outside_trains_and_its_rows_have_no_accuracy(tmp_path: Path) -> None:
    trainer = toy_trainer(tmp_path / "run", epochs=3)
    history = trainer.fit()
    assert [row["epoch"] for row in history] == [1, 2, 3]
    assert history[-1]["test_error"] < history[0]["test_error"]
    assert "train_accuracy" not in history[0] and "test_loss" not in history[0]
    assert history[0]["progress"] == pytest.approx(2 / 15, abs=1e-6)  # steps 0..4 of 15, averaged
    assert trainer.task.autocast_used == 15
    state = load_checkpoint(tmp_path / "run" / "last.pt")
    assert state["arch"] == "toy" and state["data_hashes"] == {"toy": "0" * 64}
    assert state["task_state"]["order"] == trainer.task.order.bit_generator.state
    assert (tmp_path / "run" / "training_curve.png").is_file()


def test_a_task_resumes_exactly_with_its_own_state(tmp_path: Path) -> None:
    whole = toy_trainer(tmp_path / "whole", epochs=3).fit()
    toy_trainer(tmp_path / "part", epochs=1).fit()
    resumed = toy_trainer(tmp_path / "part", epochs=3, resume=str(tmp_path / "part" / "last.pt")).fit()
    timing = ("seconds", "images_per_second", "progress")  # progress: the first call was asked for 1 epoch, not 3
    assert [{k: v for k, v in row.items() if k not in timing} for row in resumed] == [
        {k: v for k, v in row.items() if k not in timing} for row in whole
    ]


def test_resuming_with_other_settings_is_refused(tmp_path: Path) -> None:
    toy_trainer(tmp_path / "run", epochs=1).fit()
    model = nn.Linear(3, 1)
    last = str(tmp_path / "run" / "last.pt")
    with pytest.raises(ValueError, match=r"other settings \(lr\); remove it"):
        Trainer(replace(CFG, lr=0.1), ToyTask(), model, {"in": 3, "out": 1}, None, last, strict_resume=True)
    with pytest.raises(ValueError, match="different architecture or model config"):
        Trainer(CFG, ToyTask(), model, {"in": 4, "out": 1}, None, last, strict_resume=True)


class Recorder:
    """Wraps the toy task's step to record the trained weights after each optimizer step (seen at the next step)."""

    def __init__(self, trainer: Trainer[ToyTask]) -> None:
        self.weights: list[torch.Tensor] = []
        self.trainer = trainer
        step = trainer.task.step

        def recording_step(*args: Any) -> Step:
            self.weights.append(torch.cat([p.detach().flatten().clone() for p in trainer.model.parameters()]))
            return step(*args)

        trainer.task.step = recording_step  # type: ignore[method-assign]

    def trained(self) -> list[torch.Tensor]:
        """The weights after every step taken so far (the first recorded ones are the starting weights)."""
        final = torch.cat([p.detach().flatten() for p in self.trainer.model.parameters()])
        return [*self.weights[1:], final]


def flat(state: dict[str, torch.Tensor]) -> torch.Tensor:
    return torch.cat([state["weight"].flatten(), state["bias"].flatten()])


def moving_average(weights: list[torch.Tensor], decay: float) -> torch.Tensor:
    """The first update copies, then the n-th after it avg = d avg + (1 - d) w with d = min(decay, (1+n)/(10+n))."""
    average = weights[0].clone()
    for n, w in enumerate(weights[1:], start=1):
        d = min(decay, (1 + n) / (10 + n))
        average = d * average + (1 - d) * w
    return average


def test_ema_evaluates_and_saves_the_average_and_keeps_the_trained_weights(tmp_path: Path) -> None:
    trainer = toy_trainer(tmp_path / "run", epochs=2, ema=0.9)
    recorder = Recorder(trainer)
    history = trainer.fit()
    average = moving_average(recorder.trained(), 0.9)
    state = load_checkpoint(tmp_path / "run" / "last.pt")
    assert torch.allclose(flat(state["model"]), average, atol=1e-6)
    assert torch.equal(flat(state["training_model"]), recorder.trained()[-1])
    assert state["ema_updates"] == 10 and not torch.allclose(average, recorder.trained()[-1])
    averaged = nn.Linear(3, 1)
    averaged.load_state_dict(state["model"])
    assert history[-1]["test_error"] == pytest.approx(trainer.task.evaluate(averaged, None)["test_error"])
    assert [row["ema"] for row in history] == [0.9, 0.9]
    assert "training_model" in load_checkpoint(tmp_path / "run" / "best.pt")  # best.pt can be resumed as well


def test_the_average_warms_up_then_keeps_its_decay() -> None:
    update = loop.ema_with_warmup(0.5)
    for n, decay in ((1, 2 / 11), (8, 0.5), (1000, 0.5)):  # min(0.5, (1 + n) / (10 + n))
        averaged, current = [torch.zeros(3)], [torch.ones(3)]
        update(averaged, current, torch.tensor(n))
        assert torch.allclose(averaged[0], torch.full((3,), 1 - decay))


def test_ema_resumes_exactly(tmp_path: Path) -> None:
    whole = toy_trainer(tmp_path / "whole", epochs=3, ema=0.9)
    whole.fit()
    toy_trainer(tmp_path / "part", epochs=1, ema=0.9).fit()
    resumed = toy_trainer(tmp_path / "part", epochs=3, resume=str(tmp_path / "part" / "last.pt"), ema=0.9)
    resumed.fit()
    timing = ("seconds", "images_per_second", "progress")
    assert [{k: v for k, v in row.items() if k not in timing} for row in resumed.history] == [
        {k: v for k, v in row.items() if k not in timing} for row in whole.history
    ]
    a, b = load_checkpoint(tmp_path / "whole" / "last.pt"), load_checkpoint(tmp_path / "part" / "last.pt")
    for key in ("model", "training_model"):
        assert torch.equal(flat(a[key]), flat(b[key])), key
    assert a["ema_updates"] == b["ema_updates"] == 15


def test_ema_can_be_switched_on_and_off_when_resuming(tmp_path: Path) -> None:
    plain = toy_trainer(tmp_path / "plain", epochs=2)
    plain.fit()
    toy_trainer(tmp_path / "run", epochs=1).fit()
    switched = toy_trainer(tmp_path / "run", epochs=2, resume=str(tmp_path / "run" / "last.pt"), ema=0.5)
    recorder = Recorder(switched)
    switched.fit()
    assert "ema" not in switched.history[0] and switched.history[1]["ema"] == 0.5
    state = load_checkpoint(tmp_path / "run" / "last.pt")
    # the trained weights follow the plain run exactly; the average starts from them at the first step after resuming
    assert torch.equal(flat(state["training_model"]), flat(plain.model.state_dict()))
    average = moving_average(recorder.trained(), 0.5)
    assert state["ema_updates"] == 5 and torch.allclose(flat(state["model"]), average, atol=1e-6)
    off = toy_trainer(tmp_path / "run", epochs=3, resume=str(tmp_path / "run" / "last.pt"))
    assert torch.equal(flat(off.model.state_dict()), flat(state["training_model"]))  # resumes the trained weights
    off.fit()
    assert "ema" not in off.history[-1] and "training_model" not in load_checkpoint(tmp_path / "run" / "last.pt")


def test_a_checkpoint_of_another_format_is_refused(tmp_path: Path) -> None:
    """E.g. a MultiMNIST checkpoint written before MultiMNIST trained on this loop (keys config, order_rng)."""
    save_checkpoint(tmp_path / "old.pt", {"config": {}, "model": {}, "history": [], "order_rng": {}})
    with pytest.raises(CheckpointMismatch, match=r"old\.pt is not a checkpoint of this training loop \(no arch, "):
        toy_trainer(None, epochs=1, resume=str(tmp_path / "old.pt"))


class StepClock:
    """A fake loop.clock that moves 1 s whenever a trainer it drives takes a training step, and at no other time."""

    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now

    def drive(self, trainer: Trainer[ToyTask]) -> Trainer[ToyTask]:
        step = trainer.task.step

        def timed_step(*args: Any) -> Step:
            self.now += 1.0
            return step(*args)

        trainer.task.step = timed_step  # type: ignore[method-assign]
        return trainer


@pytest.mark.parametrize("ema", [0.0, 0.9])
def test_a_task_resumes_exactly_from_inside_epochs(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, ema: float) -> None:
    """Calls of 2.5 s (5 steps of 1 s an epoch) stop inside epochs; `batches` advances the task's order RNG,
    so last.pt keeps the task state from before the epoch's draw and the one where it stopped (and, with a
    weight average, the average and its update count)."""
    clock = StepClock()
    monkeypatch.setattr(loop, "clock", clock)
    whole = toy_trainer(tmp_path / "whole", epochs=3, ema=ema)
    whole.fit()
    last, stops = tmp_path / "part" / "last.pt", []
    for _ in range(10):
        resume = str(last) if last.exists() else None
        trainer = clock.drive(toy_trainer(tmp_path / "part", epochs=3, resume=resume, ema=ema))
        trainer.fit(deadline=clock.now + 2.5)
        state = load_checkpoint(last)
        stops.append((state["epoch"], state["mid_epoch"]["step"] if "mid_epoch" in state else None))
        if trainer.finished:
            break
    assert stops[:3] == [(0, 2), (0, 4), (1, 1)]  # the third call ends epoch 1, then stops in epoch 2
    timing = ("seconds", "images_per_second")
    assert [{k: v for k, v in row.items() if k not in timing} for row in trainer.history] == [
        {k: v for k, v in row.items() if k not in timing} for row in whole.history
    ]
    assert all(torch.equal(a, b) for a, b in zip(trainer.model.parameters(), whole.model.parameters(), strict=True))
    assert torch.equal(flat(trainer.evaluated_model.state_dict()), flat(whole.evaluated_model.state_dict()))


def test_an_average_switched_on_when_resuming_starts_from_the_resumed_weights(tmp_path: Path) -> None:
    """Even when the next thing the run does is evaluate (a checkpoint saved after an epoch's last step)."""
    toy_trainer(tmp_path / "run", epochs=1).fit()
    resumed = toy_trainer(tmp_path / "run", epochs=2, resume=str(tmp_path / "run" / "last.pt"), ema=0.9)
    assert torch.equal(flat(resumed.evaluated_model.state_dict()), flat(resumed.model.state_dict()))
    assert int(resumed.ema.n_averaged) == 0  # type: ignore[union-attr]


def test_a_mid_epoch_checkpoint_needs_as_many_processes(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    clock = StepClock()
    monkeypatch.setattr(loop, "clock", clock)
    clock.drive(toy_trainer(tmp_path / "run", epochs=1)).fit(deadline=1.5)
    state = load_checkpoint(tmp_path / "run" / "last.pt")
    assert state["mid_epoch"]["step"] == 1 and state["task_state"] != state["mid_epoch"]["ranks"][0]["task_state"]
    state["mid_epoch"]["ranks"] *= 2
    save_checkpoint(tmp_path / "two.pt", state)
    with pytest.raises(CheckpointMismatch, match=r"two\.pt was stopped inside epoch 1 by 2 process\(es\); continue"):
        toy_trainer(None, epochs=1, resume=str(tmp_path / "two.pt"))


def test_multimnist_resumes_exactly_from_inside_an_epoch(
    synthetic_mnist: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """MultiMNIST draws its composites and their order in `batches`: a call stopped after 2 of 4 steps continues."""
    clock = StepClock()
    monkeypatch.setattr(loop, "clock", clock)
    step = multimnist.MultiMNISTTask.step

    def timed_step(self: multimnist.MultiMNISTTask, *args: Any) -> Step:
        clock.now += 1.0
        return step(self, *args)

    monkeypatch.setattr(multimnist.MultiMNISTTask, "step", timed_step)
    train, test = load_split(str(synthetic_mnist), "train"), load_split(str(synthetic_mnist), "test")
    cfg = multimnist.MultiMNISTConfig(preset="tiny", epochs=1, batch_size=8, train_subset=32, test_subset=16)
    whole, rows, _ = multimnist.train_multimnist(cfg, train, test, torch.device("cpu"), tmp_path / "whole")
    _, stopped, _ = multimnist.train_multimnist(
        cfg, train, test, torch.device("cpu"), tmp_path / "part", clock.now + 2.5
    )
    assert stopped == [] and load_checkpoint(tmp_path / "part" / "last.pt")["mid_epoch"]["step"] == 2
    resumed, again, _ = multimnist.train_multimnist(cfg, train, test, torch.device("cpu"), tmp_path / "part")
    timing = ("seconds", "images_per_second")
    assert [{k: v for k, v in row.items() if k not in timing} for row in again] == [
        {k: v for k, v in row.items() if k not in timing} for row in rows
    ]
    assert all(torch.equal(a, b) for a, b in zip(resumed.parameters(), whole.parameters(), strict=True))


# --- evaluating every N epochs (`eval_every`) -----------------------------------------------------------------


class ScriptedTask(ToyTask):
    """The toy task whose test error after epoch k is `errors[k - 1]`, whatever the weights, and whose
    evaluations are counted by epoch (1-based; `batches` says which epoch is trained)."""

    def __init__(self, errors: list[float]) -> None:
        super().__init__()
        self.errors, self.current = errors, 0
        self.evaluated_epochs: list[int] = []

    def batches(self, epoch: int) -> list[np.ndarray]:
        self.current = epoch + 1
        return super().batches(epoch)

    def evaluate(self, model: nn.Module, max_batches: int | None) -> dict[str, Any]:
        self.evaluated_epochs.append(self.current)
        return {"test_error": self.errors[self.current - 1], "test_n": len(self.x)}


def scripted_trainer(
    out: Path, epochs: int, eval_every: int, errors: list[float], resume: bool = False
) -> Trainer[ScriptedTask]:
    torch.manual_seed(0)
    cfg = replace(CFG, epochs=epochs, eval_every=eval_every)
    last = str(out / "last.pt") if resume else None
    return Trainer(cfg, ScriptedTask(errors), nn.Linear(3, 1), {"in": 3, "out": 1}, out, last, strict_resume=True)


def test_every_second_epoch_and_the_last_are_evaluated_and_only_they_can_be_best(tmp_path: Path) -> None:
    """Epochs 1 and 3 would be the best (0.1, 0.05) had they been evaluated; of 2, 4 and 5, epoch 4 is."""
    trainer = scripted_trainer(tmp_path / "run", 5, 2, [0.1, 0.5, 0.05, 0.3, 0.4])
    history = trainer.fit()
    assert trainer.task.evaluated_epochs == [2, 4, 5]
    assert [row["epoch"] for row in history] == [1, 2, 3, 4, 5]
    assert [row.get("test_error") for row in history] == [None, 0.5, None, 0.3, 0.4]
    assert not any(key.startswith("test_") for row in (history[0], history[2]) for key in row)
    assert all("train_loss" in row and "lr" in row for row in history)
    best = load_checkpoint(tmp_path / "run" / "best.pt")
    assert best["epoch"] == 4 and best["best_test_error"] == 0.3 and trainer.best_test_error == 0.3
    metrics = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert metrics == history


def test_the_log_says_an_epoch_was_not_evaluated() -> None:
    row = {"epoch": 3, "train_loss": 0.5, "seconds": 2.0, "images_per_second": 20.0}
    assert loop.epoch_summary(row, 5, 0.25, 2).startswith("epoch 3/5: not evaluated (every 2 epochs; best 25.00%)")
    assert "(every 2 epochs; none evaluated yet)" in loop.epoch_summary(row, 5, math.inf, 2)
    assert loop.epoch_summary(row | {"test_error": 0.2}, 5, 0.25, 2).startswith("epoch 3/5: test error 20.00% (best")


def test_a_run_resumes_with_another_eval_every_and_trains_as_if_every_epoch_were_evaluated(tmp_path: Path) -> None:
    errors = [0.9, 0.8, 0.7, 0.6, 0.5, 0.4, 0.3]
    every = scripted_trainer(tmp_path / "every", 7, 1, errors)
    every.fit()
    first = scripted_trainer(tmp_path / "part", 4, 2, errors)
    first.fit()
    resumed = scripted_trainer(tmp_path / "part", 7, 3, errors, resume=True)  # strict: eval_every may change
    resumed.fit()
    assert first.task.evaluated_epochs == [2, 4] and resumed.task.evaluated_epochs == [6, 7]
    assert [row["epoch"] for row in resumed.history if "test_error" in row] == [2, 4, 6, 7]
    assert load_checkpoint(tmp_path / "part" / "last.pt")["train_config"]["eval_every"] == 3
    training = ("train_loss", "lr")  # (progress: the first call was asked for 4 epochs, not 7)
    assert [{k: r[k] for k in training} for r in resumed.history] == [
        {k: r[k] for k in training} for r in every.history
    ]
    assert all(torch.equal(a, b) for a, b in zip(resumed.model.parameters(), every.model.parameters(), strict=True))
    assert load_checkpoint(tmp_path / "part" / "best.pt")["epoch"] == 7


def test_a_time_budget_stop_after_an_epoch_not_due_evaluates_it_first(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Epochs of 5 steps of 1 s, evaluations of 2 s, every 3rd epoch due, 18 s: epoch 1 is evaluated to time an
    evaluation; after epoch 2 (at 12 s) epoch 3 and its evaluation (7 s) would not fit, so epoch 2 is evaluated
    and the call stops there, between epochs."""
    clock = StepClock()
    monkeypatch.setattr(loop, "clock", clock)
    errors = [0.9, 0.5, 0.7, 0.6, 0.8, 0.4]
    trainer = scripted_trainer(tmp_path / "run", 6, 3, errors)
    clock.drive(trainer)  # type: ignore[arg-type]  # (a ScriptedTask is a ToyTask)
    evaluate = trainer.task.evaluate

    def timed_evaluate(*args: Any) -> dict[str, Any]:
        clock.now += 2.0
        return evaluate(*args)

    monkeypatch.setattr(trainer.task, "evaluate", timed_evaluate)
    trainer.fit(deadline=clock.now + 18)
    assert trainer.epoch == 2 and trainer.task.evaluated_epochs == [1, 2] and clock.now == 14
    state = load_checkpoint(tmp_path / "run" / "last.pt")
    assert "mid_epoch" not in state and load_checkpoint(tmp_path / "run" / "best.pt")["epoch"] == 2
    rest = scripted_trainer(tmp_path / "run", 6, 3, errors, resume=True)
    rest.fit()
    assert rest.task.evaluated_epochs == [3, 6]
    assert [row["epoch"] for row in rest.history if "test_error" in row] == [1, 2, 3, 6]
    assert load_checkpoint(tmp_path / "run" / "best.pt")["epoch"] == 6

"""The train loop: dry run, metrics and checkpoints, exact resume, two-process DDP, evaluation CLI."""

from __future__ import annotations

import json
import math
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
import torch

from tests.conftest import REPO_ROOT
from training.fitting import device, evaluate, loop, train
from training.fitting.checkpoint import save_checkpoint
from training.fitting.train import TrainConfig, mnist_trainer

TINY = dict(preset="tiny", batch_size=16, eval_batch_size=32, device="cpu", seed=1)


def test_fit_writes_metrics_curve_and_checkpoints(synthetic_mnist: Path, tmp_path: Path) -> None:
    out = tmp_path / "run"
    history = mnist_trainer(TrainConfig(epochs=2, **TINY), str(synthetic_mnist), out).fit()  # type: ignore[arg-type]
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert [r["epoch"] for r in rows] == [1, 2] and rows == history
    for key in (
        "train_loss",
        "margin_loss",
        "reconstruction_loss",
        "train_accuracy",
        "test_error",
        "lr",
        "seconds",
        "images_per_second",
    ):
        assert key in rows[0], key
    assert rows[1]["lr"] == pytest.approx(rows[0]["lr"] * 0.96)
    assert (out / "training_curve.png").stat().st_size > 1000
    state = torch.load(out / "last.pt", weights_only=False)
    assert state["epoch"] == 2 and state["arch"] == "dynamic" and "optimizer" in state and "torch_rng" in state
    assert (out / "best.pt").exists()


def test_resume_reproduces_the_uninterrupted_run(synthetic_mnist: Path, tmp_path: Path) -> None:
    full = mnist_trainer(TrainConfig(epochs=2, **TINY), str(synthetic_mnist), tmp_path / "full").fit()  # type: ignore[arg-type]
    mnist_trainer(TrainConfig(epochs=1, **TINY), str(synthetic_mnist), tmp_path / "part").fit()  # type: ignore[arg-type]
    resumed = mnist_trainer(
        TrainConfig(epochs=2, **TINY),  # type: ignore[arg-type]
        str(synthetic_mnist),
        tmp_path / "part",
        resume=str(tmp_path / "part" / "last.pt"),
    ).fit()
    assert len(resumed) == 2
    for key in ("train_loss", "train_accuracy", "test_loss", "test_error"):
        assert resumed[1][key] == pytest.approx(full[1][key], abs=1e-6), key


class StepClock:
    """A fake loop.clock that moves only when the trainer works: 1 s per training step, 0.5 s per evaluation."""

    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now

    def drive(self, trainer: loop.Trainer[train.ClassificationTask]) -> loop.Trainer[train.ClassificationTask]:
        step, evaluate = trainer.task.step, trainer.task.evaluate

        def timed_step(*args: Any) -> loop.Step:
            self.now += 1.0
            return step(*args)

        def timed_evaluate(*args: Any) -> dict[str, Any]:
            self.now += 0.5
            return evaluate(*args)

        trainer.task.step, trainer.task.evaluate = timed_step, timed_evaluate  # type: ignore[method-assign]
        return trainer


def without_timing(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [{k: v for k, v in row.items() if k not in ("seconds", "images_per_second")} for row in rows]


def assert_same_run(a: loop.Trainer[Any], b: loop.Trainer[Any]) -> None:
    """The same weights, optimizer moments and learning rate, bit for bit, and the same metrics rows."""
    assert without_timing(a.history) == without_timing(b.history)
    for (name, x), (_, y) in zip(a.model.state_dict().items(), b.model.state_dict().items(), strict=True):
        assert torch.equal(x, y), name
    moments = [
        (a.optimizer.state[p], b.optimizer.state[q])
        for p, q in zip(a.model.parameters(), b.model.parameters(), strict=True)
    ]
    assert all(torch.equal(x["exp_avg_sq"], y["exp_avg_sq"]) for x, y in moments)
    assert a.optimizer.param_groups[0]["lr"] == b.optimizer.param_groups[0]["lr"]


@pytest.mark.parametrize(
    ("budgets", "stops"),
    [
        # Seconds each call may take (4 steps of 1 s and an evaluation of 0.5 s per epoch), and where each stopped
        # (epochs done, step in the next epoch; None: between epochs).
        ([2.5, 6.7], [(0, 2), (1, 4)]),  # in epoch 1 after 2 steps; then in epoch 2 before its evaluation
        ([1.5, 6.2], [(0, 1), (1, None)]),  # after 1 step; then the rest of epoch 1, no time for epoch 2
        ([0.1] * 5, [(0, 1), (0, 2), (0, 3), (1, None), (1, 1)]),  # one step a call: the first always runs
    ],
)
def test_time_budget_stops_inside_epochs_and_chunks_add_up_to_the_uninterrupted_run(
    synthetic_mnist: Path,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    budgets: list[float],
    stops: list[tuple[int, int | None]],
) -> None:
    clock = StepClock()
    monkeypatch.setattr(loop, "clock", clock)
    cfg = TrainConfig(epochs=2, **TINY)  # type: ignore[arg-type]
    full = mnist_trainer(cfg, str(synthetic_mnist), tmp_path / "full")
    full.fit()
    out, last, seen = tmp_path / "chunks", tmp_path / "chunks" / "last.pt", []
    for budget in [*budgets, None]:
        trainer = clock.drive(
            mnist_trainer(cfg, str(synthetic_mnist), out, resume=str(last) if last.exists() else None)
        )
        trainer.fit(None if budget is None else clock.now + budget)
        state = torch.load(last, weights_only=False)
        seen.append((state["epoch"], state["mid_epoch"]["step"] if "mid_epoch" in state else None))
    assert seen == [*stops, (2, None)] and trainer.finished
    assert_same_run(trainer, full)
    assert without_timing([json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]) == (
        without_timing(full.history)
    )
    assert trainer.history[0]["seconds"] > 0 and trainer.history[0]["images_per_second"] > 0


def test_periodic_checkpoints_inside_an_epoch_resume_exactly(
    synthetic_mnist: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """last.pt every 2 s of a 4-step epoch: after step 2, and after step 4 before the evaluation; a run killed
    after the first continues from it as if never stopped."""
    clock = StepClock()
    monkeypatch.setattr(loop, "clock", clock)
    written: list[tuple[str, int | None]] = []

    def save(path: Path, state: dict[str, Any]) -> None:
        save_checkpoint(path, state)
        written.append((path.name, state["mid_epoch"]["step"] if "mid_epoch" in state else None))
        if written[-1] == ("last.pt", 2):
            shutil.copy(path, tmp_path / "killed.pt")

    monkeypatch.setattr(loop, "save_checkpoint", save)
    cfg = TrainConfig(epochs=1, **TINY)  # type: ignore[arg-type]
    full = clock.drive(mnist_trainer(cfg, str(synthetic_mnist), tmp_path / "full"))
    full.fit(checkpoint_minutes=2 / 60)
    assert written == [("last.pt", 2), ("last.pt", 4), ("last.pt", None), ("best.pt", None)]
    resumed = mnist_trainer(cfg, str(synthetic_mnist), tmp_path / "again", resume=str(tmp_path / "killed.pt"))
    resumed.fit()
    assert_same_run(resumed, full)


def test_a_checkpoint_from_before_mid_epoch_resume_continues_as_before(synthetic_mnist: Path, tmp_path: Path) -> None:
    """An epoch-end last.pt of the earlier format: no task_state (the shift generator's), no evaluation_seconds."""
    full = mnist_trainer(TrainConfig(epochs=2, **TINY), str(synthetic_mnist), tmp_path / "full")  # type: ignore[arg-type]
    full.fit()
    mnist_trainer(TrainConfig(epochs=1, **TINY), str(synthetic_mnist), tmp_path / "part").fit()  # type: ignore[arg-type]
    state = torch.load(tmp_path / "part" / "last.pt", weights_only=False)
    assert {"task_state", "evaluation_seconds"} <= state.keys() and "mid_epoch" not in state
    old = {k: v for k, v in state.items() if k not in ("task_state", "evaluation_seconds")}
    torch.save(old, tmp_path / "old.pt")
    resumed = mnist_trainer(
        TrainConfig(epochs=2, **TINY),  # type: ignore[arg-type]
        str(synthetic_mnist),
        tmp_path / "part",
        resume=str(tmp_path / "old.pt"),
    )
    resumed.fit(deadline=time.monotonic() + 3600, checkpoint_minutes=10)
    assert resumed.finished
    assert_same_run(resumed, full)


def test_within_budget_judges_by_the_last_epoch() -> None:
    now = time.monotonic()
    assert loop.within_budget(None, 5.0) and loop.within_budget(now - 1, None)  # no budget, or no epoch yet
    assert loop.within_budget(now + 100, 10.0)
    assert not loop.within_budget(now + 5, 10.0)


def test_cli_time_budget_exits_3_and_says_how_to_continue(
    synthetic_mnist: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    tuned: list[bool] = []
    monkeypatch.setattr(train, "keep_freed_memory", lambda: tuned.append(True) or True)
    out = tmp_path / "budget"
    base = ["--data-dir", str(synthetic_mnist), "--out", str(out), "--preset", "tiny", "--batch-size", "16",
            "--epochs", "2", "--device", "cpu"]  # fmt: skip
    assert train.main([*base, "--max-minutes", "0.0001"]) == train.EXIT_UNFINISHED  # spent before the 1st step ends
    err = capsys.readouterr().err
    assert f"capsnet-train: time budget spent at epoch 0 of 2; continue with --resume {out / 'last.pt'}\n" in err
    assert torch.load(out / "last.pt", weights_only=False)["mid_epoch"]["step"] == 1  # the first step always runs
    assert train.main([*base, "--resume", str(out / "last.pt"), "--max-minutes", "60"]) == 0
    assert [json.loads(line)["epoch"] for line in (out / "metrics.jsonl").read_text().splitlines()] == [1, 2]
    # glibc's malloc tuned for training by each run (training.fitting.device.keep_freed_memory)
    assert tuned == [True, True]


def test_cli_rejects_a_negative_checkpoint_interval(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as e:
        train.main(["--data-dir", str(tmp_path), "--checkpoint-minutes", "-1"])
    assert e.value.code == 2 and "--checkpoint-minutes must be 0 or more, got -1.0" in capsys.readouterr().err


def test_resume_refuses_a_different_model(synthetic_mnist: Path, tmp_path: Path) -> None:
    mnist_trainer(TrainConfig(epochs=1, **TINY), str(synthetic_mnist), tmp_path / "a").fit()  # type: ignore[arg-type]
    cfg = TrainConfig(epochs=2, routing="normalized", **TINY)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="different architecture or model config"):
        mnist_trainer(cfg, str(synthetic_mnist), tmp_path / "a", resume=str(tmp_path / "a" / "last.pt"))


def test_cli_dry_run_on_synthetic_data_writes_nothing(
    synthetic_mnist: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str], caplog: pytest.LogCaptureFixture
) -> None:
    out = tmp_path / "dry"
    with caplog.at_level("INFO"):
        code = train.main(["--data-dir", str(synthetic_mnist), "--out", str(out), "--preset", "tiny", "--dry-run"])
    assert code == 0
    captured = capsys.readouterr()
    (line,) = captured.out.splitlines()  # the epoch's JSON, once: not also logged
    assert json.loads(line)["epoch"] == 1 and json.loads(line)["test_n"] == 32
    assert not any('"epoch": 1' in r.getMessage() for r in caplog.records)
    messages = [r.getMessage() for r in caplog.records]
    assert "dry run: 1 batch: training, steps 1 to 1" in messages and not any("epoch 1/30" in m for m in messages)
    assert not out.exists()


def test_cli_ema_reaches_the_loop_and_a_resumed_run_keeps_it(
    synthetic_mnist: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    argv = ["--data-dir", str(synthetic_mnist), "--preset", "tiny", "--batch-size", "16", "--out", str(tmp_path)]
    assert train.main([*argv, "--epochs", "1", "--ema", "0.99"]) == 0
    assert json.loads(capsys.readouterr().out)["ema"] == 0.99  # the row says its errors are the average's
    resume = ["--resume", str(tmp_path / "last.pt")]
    assert train.main([*argv, "--epochs", "2", *resume]) == 0  # no --ema: the checkpoint's setting
    assert json.loads(capsys.readouterr().out)["ema"] == 0.99
    assert train.main([*argv, "--epochs", "3", *resume, "--ema", "0"]) == 0  # switched off
    assert "ema" not in json.loads(capsys.readouterr().out)
    assert "training_model" not in torch.load(tmp_path / "last.pt", weights_only=False)


def test_cli_eval_every_evaluates_every_nth_epoch_and_the_last(
    synthetic_mnist: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    argv = ["--data-dir", str(synthetic_mnist), "--preset", "tiny", "--batch-size", "16", "--out", str(tmp_path)]
    assert train.main([*argv, "--epochs", "3", "--eval-every", "2"]) == 0
    rows = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert [sorted(k for k in r if k.startswith("test_")) for r in rows] == [
        [],
        *[["test_error", "test_loss", "test_n"]] * 2,
    ]
    best = torch.load(tmp_path / "best.pt", weights_only=False)["epoch"]
    assert f"best.pt is epoch {best} " in capsys.readouterr().err and best in (2, 3)
    assert torch.load(tmp_path / "last.pt", weights_only=False)["train_config"]["eval_every"] == 2


@pytest.mark.parametrize(
    ("argv", "lr"),
    [
        (["--arch", "em"], 0.01),  # EM routing's own default (docs/em-routing.md, "Training")
        (["--arch", "dynamic"], 0.001),
        (["--arch", "baseline"], 0.001),
        (["--arch", "em", "--lr", "0.003"], 0.003),
    ],
)
def test_cli_learning_rate_defaults_to_the_architectures(
    argv: list[str], lr: float, synthetic_mnist: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code = train.main(["--data-dir", str(synthetic_mnist), "--preset", "tiny", "--dry-run", *argv])
    assert code == 0
    assert json.loads(capsys.readouterr().out)["lr"] == lr


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--lr", "0"], "--lr must be positive, got 0.0"),
        (["--lr", "-0.01"], "--lr must be positive, got -0.01"),
        (["--epochs", "0"], "--epochs must be at least 1, got 0"),
        (["--epochs", "-3"], "--epochs must be at least 1, got -3"),
        (["--batch-size", "0"], "--batch-size must be at least 1, got 0"),
        (["--max-minutes", "0"], "--max-minutes must be positive, got 0.0"),
        (["--epoch-images", "0"], "--epoch-images must be at least 1, got 0"),
        (["--eval-every", "0"], "--eval-every must be at least 1, got 0"),
        (["--ema", "1"], "--ema must be at least 0 and below 1, got 1.0"),
        (["--ema", "-0.5"], "--ema must be at least 0 and below 1, got -0.5"),
    ],
)
def test_cli_usage_errors_exit_2_with_one_line(
    argv: list[str], message: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as e:
        train.main(["--data-dir", str(tmp_path), *argv])
    err = capsys.readouterr().err
    assert e.value.code == 2 and err.splitlines()[-1] == f"capsnet-train: error: {message}"
    assert not (tmp_path / "runs").exists()


def test_cli_cuda_without_cuda_is_a_one_line_error(
    synthetic_mnist: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert train.main(["--data-dir", str(synthetic_mnist), "--device", "cuda", "--dry-run"]) == 2
    assert capsys.readouterr().err == "capsnet-train: error: --device cuda was asked for but CUDA is not available\n"


def test_cli_reports_a_missing_data_dir(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert train.main(["--data-dir", str(tmp_path / "none"), "--dry-run"]) == 2
    assert "does not exist" in capsys.readouterr().err


@pytest.mark.mnist
@pytest.mark.slow
def test_cli_dry_run_on_real_mnist(real_mnist: Path) -> None:
    """The paper configuration on the official files: one training and one evaluation batch."""
    proc = subprocess.run(
        [sys.executable, "-m", "training.fitting.train", "--data-dir", str(real_mnist), "--dry-run",
         "--batch-size", "16"],
        cwd=REPO_ROOT, capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert json.loads(proc.stdout.strip().splitlines()[-1])["test_n"] == 500


def torchrun_train(*args: str) -> subprocess.CompletedProcess[str]:
    """`training.fitting.train` in two gloo processes (torchrun), in a session of its own so a hung rendezvous cannot
    leave worker processes behind."""
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(REPO_ROOT)}
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2",
           "-m", "training.fitting.train", *args]  # fmt: skip
    with subprocess.Popen(
        cmd, cwd=REPO_ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True
    ) as proc:
        try:
            stdout, stderr = proc.communicate(timeout=240)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.communicate()
            pytest.fail("two-process DDP run did not finish in 240 s")
    return subprocess.CompletedProcess(cmd, proc.returncode, stdout, stderr)


@pytest.mark.slow
def test_two_process_ddp_with_gloo(synthetic_mnist: Path, tmp_path: Path) -> None:
    """One epoch whole, and the same epoch stopped by the budget after its first step and resumed: both ranks
    stop at the same step, last.pt keeps each rank's place, and the resumed epoch's row is the whole one's."""
    args = ["--data-dir", str(synthetic_mnist), "--preset", "tiny", "--epochs", "1", "--batch-size", "8",
            "--device", "cpu"]  # fmt: skip
    out = tmp_path / "ddp"
    proc = torchrun_train(*args, "--out", str(out))
    assert proc.returncode == 0, proc.stderr[-3000:]
    rows = (out / "metrics.jsonl").read_text().splitlines()
    assert len(rows) == 1  # only rank 0 writes
    row = json.loads(rows[0])
    assert row["epoch"] == 1
    assert len(proc.stdout.strip().splitlines()) == 1  # only rank 0 prints the result
    state = torch.load(out / "last.pt", weights_only=False)
    assert not any(k.startswith("module.") for k in state["model"])  # saved unwrapped, reloadable alone

    chunks = tmp_path / "chunks"
    stopped = torchrun_train(*args, "--out", str(chunks), "--max-minutes", "0.0001")
    assert stopped.returncode != 0 and "time budget spent at epoch 0 of 1" in stopped.stderr, stopped.stderr[-3000:]
    position = torch.load(chunks / "last.pt", weights_only=False)["mid_epoch"]
    assert position["step"] == 1 and [rank["step"] for rank in position["ranks"]] == [1, 1]
    shifts = [rank["task_state"]["shifts"] for rank in position["ranks"]]
    assert not torch.equal(*shifts)  # each rank's own shift generator
    resumed = torchrun_train(*args, "--out", str(chunks), "--resume", str(chunks / "last.pt"))
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    again = json.loads((chunks / "metrics.jsonl").read_text())
    assert without_timing([again]) == without_timing([row])


def test_evaluate_cli_on_a_checkpoint(
    synthetic_mnist: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    mnist_trainer(TrainConfig(epochs=1, **TINY), str(synthetic_mnist), tmp_path / "r").fit()  # type: ignore[arg-type]
    code = evaluate.main(["--checkpoint", str(tmp_path / "r" / "last.pt"), "--data-dir", str(synthetic_mnist)])
    assert code == 0
    result = json.loads(capsys.readouterr().out)
    assert result["n"] == 32 and 0.0 <= result["test_error"] <= 1.0
    assert sum(map(sum, result["confusion_matrix"])) == 32
    assert set(result["per_class_error"]) == {str(k) for k in range(10)}


def test_evaluate_cli_errors_cleanly(synthetic_mnist: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert evaluate.main(["--checkpoint", str(tmp_path / "missing.pt"), "--data-dir", str(synthetic_mnist)]) == 2
    assert "not found" in capsys.readouterr().err
    bogus = tmp_path / "bogus.pt"
    torch.save({"hello": 1}, bogus)
    assert evaluate.main(["--checkpoint", str(bogus), "--data-dir", str(synthetic_mnist)]) == 2
    assert "not a capsnet-serve checkpoint" in capsys.readouterr().err


def test_recorded_command_names_the_console_script() -> None:
    from training.fitting.checkpoint import training_command

    assert training_command(["/repo/training/fitting/train.py", "--epochs", "3"]) == ["capsnet-train", "--epochs", "3"]
    assert training_command(["/venv/bin/capsnet-train", "--seed", "1"]) == ["capsnet-train", "--seed", "1"]


def test_evaluate_module_runs_as_a_script(synthetic_mnist: Path) -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "training.fitting.evaluate", "--checkpoint", "missing.pt",
         "--data-dir", str(synthetic_mnist)],
        cwd=REPO_ROOT, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert proc.returncode == 2 and "not found" in proc.stderr


def test_amp_on_cpu_trains_with_bfloat16_convolutions(
    synthetic_mnist: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`--amp` on a CPU with native bfloat16 (forced here, emulated elsewhere) trains and says so in metrics.jsonl."""
    monkeypatch.setattr(device, "bf16_supported", lambda device: True)
    trainer = mnist_trainer(TrainConfig(epochs=1, amp=True, **TINY), str(synthetic_mnist), tmp_path / "amp")  # type: ignore[arg-type]
    assert trainer.amp
    row = trainer.fit()[0]
    assert row["precision"] == "bfloat16-mixed"
    assert math.isfinite(row["train_loss"]) and math.isfinite(row["test_loss"])
    plain = mnist_trainer(TrainConfig(epochs=1, **TINY), str(synthetic_mnist), tmp_path / "fp32")  # type: ignore[arg-type]
    assert plain.fit()[0]["precision"] == "float32"
    weights = [(a, b) for a, b in zip(trainer.model.parameters(), plain.model.parameters(), strict=True)]
    assert any(not torch.equal(a, b) for a, b in weights)  # the same seed and data: autocast made the difference
    assert all(a.dtype == torch.float32 for a, _ in weights)  # weights stay float32


def test_amp_is_ignored_with_a_warning_without_native_bfloat16(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setattr(device, "bf16_supported", lambda device: False)
    with caplog.at_level("WARNING"):
        assert device.use_amp(True, torch.device("cpu")) is False
    assert "--amp ignored" in caplog.text
    assert device.use_amp(False, torch.device("cpu")) is False


def test_val_split_holds_out_a_seeded_disjoint_set_and_saves_best_val(synthetic_mnist: Path, tmp_path: Path) -> None:
    trainer = mnist_trainer(TrainConfig(epochs=1, val_split=20, **TINY), str(synthetic_mnist), tmp_path / "run")  # type: ignore[arg-type]
    assert trainer.task.val_data is not None and len(trainer.task.val_data) == 20
    full = len(train.load_split(str(synthetic_mnist), "train"))
    assert len(trainer.task.train_split) == full - 20
    _, held = train.hold_out(train.load_split(str(synthetic_mnist), "train"), 20, seed=1)
    assert held is not None and (held.images == trainer.task.val_data.images).all()
    rows = trainer.fit()
    assert rows[0]["val_n"] == 20 and 0.0 <= rows[0]["val_error"] <= 1.0 and "val_loss" in rows[0]
    assert (tmp_path / "run" / "best_val.pt").exists()
    assert torch.load(tmp_path / "run" / "last.pt", weights_only=False)["best_val_error"] == rows[0]["val_error"]


def test_val_split_refuses_to_leave_no_training_images(synthetic_mnist: Path) -> None:
    split = train.load_split(str(synthetic_mnist), "train")
    with pytest.raises(ValueError, match="leaves no training images"):
        train.hold_out(split, len(split), seed=0)


def test_short_epochs_walk_through_one_stream_of_shuffles() -> None:
    """With --epoch-images, consecutive epochs are consecutive pieces of shuffle 0, then shuffle 1, ..."""
    info = loop.DistInfo()
    full = TrainConfig(seed=3)
    stream = torch.cat([train.shuffled(10, 3, k, info) for k in range(3)])
    assert torch.equal(train.epoch_indices(10, full, 1, info), stream[10:20])  # a whole pass per epoch, as before
    short = TrainConfig(seed=3, epoch_images=4, batch_size=3)
    epochs = [train.epoch_indices(10, short, e, info) for e in range(5)]
    assert torch.equal(torch.cat(epochs), stream[:20])
    assert sorted(torch.cat(epochs[:2]).tolist() + epochs[2][:2].tolist()) == list(range(10))  # every image once
    assert [len(b) for b in train.epoch_batches(10, short, 2, info)] == [3, 1]


def test_ddp_ranks_share_a_short_epoch() -> None:
    cfg = TrainConfig(seed=0, epoch_images=5)
    ranks = [train.epoch_indices(12, cfg, 1, loop.DistInfo(rank=r, world_size=2)) for r in range(2)]
    assert [len(r) for r in ranks] == [3, 3]  # ceil(5 / 2) each
    assert not set(ranks[0].tolist()) & set(ranks[1].tolist())

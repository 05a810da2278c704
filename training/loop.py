"""The training loop, once: it trains a model it is given on a Task (data, loss, evaluation) it is given.

Seeded, resumable to the bit, time-boxed (`--max-minutes`), optionally distributed (torchrun / DDP).
"""

from __future__ import annotations

import json
import logging
import math
import os
import sys
import time
from collections.abc import Callable, Sequence
from contextlib import AbstractContextManager
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Generic, Protocol, TypeVar

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel
from tqdm import tqdm

from training.checkpoint import (
    CheckpointMismatch,
    check_resumable,
    load_checkpoint,
    restore_rng_states,
    rng_states,
    save_checkpoint,
    training_command,
)
from training.config import TrainConfig
from training.device import use_amp

log = logging.getLogger(__name__)

Autocast = Callable[[], AbstractContextManager[Any]]


@dataclass
class Step:
    """One training batch's outcome: the loss to backpropagate, its parts (for the log), and its size."""

    loss: torch.Tensor
    parts: dict[str, torch.Tensor | float]  # detached
    n: int
    correct: int | None = None  # correctly classified images; None where the task has no single label


class Task(Protocol):
    """What is trained on and how it is judged; the Trainer owns the optimizer, schedule, checkpoints and budget."""

    data_hashes: dict[str, str]  # sha256 of the data files read, for checkpoints and the model card

    def batches(self, epoch: int) -> Sequence[Any]:
        """This process's batches for `epoch` (seeded by the epoch, so a resumed run sees the same ones)."""
        ...

    def step(self, model: nn.Module, batch: Any, progress: float, autocast: Autocast) -> Step:
        """Forward one batch (the convolutions under `autocast()`) and return its loss; progress in [0, 1]."""
        ...

    def evaluate(self, model: nn.Module, max_batches: int | None) -> dict[str, Any]:
        """The epoch's evaluation columns; `test_error` is required, `val_error` selects best_val.pt."""
        ...

    def state_dict(self) -> dict[str, Any]:
        """State beyond torch's RNG that a resumed run needs (empty: none)."""
        ...

    def load_state_dict(self, state: dict[str, Any]) -> None: ...


@dataclass
class DistInfo:
    rank: int = 0
    world_size: int = 1
    local_rank: int = 0

    @property
    def is_main(self) -> bool:
        return self.rank == 0


def init_distributed(device_name: str) -> DistInfo:
    """Join the process group when launched by torchrun (WORLD_SIZE > 1)."""
    world = int(os.environ.get("WORLD_SIZE", "1"))
    if world <= 1:
        return DistInfo()
    info = DistInfo(int(os.environ["RANK"]), world, int(os.environ.get("LOCAL_RANK", "0")))
    use_cuda = device_name != "cpu" and torch.cuda.is_available()
    if use_cuda:
        torch.cuda.set_device(info.local_rank)
    if not dist.is_initialized():
        dist.init_process_group(backend="nccl" if use_cuda else "gloo")
    return info


def draw_curve(history: list[dict[str, Any]], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    epochs = [h["epoch"] for h in history]
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(10, 4))
    ax1.plot(epochs, [h["train_loss"] for h in history], marker="o", label="train")
    if all("test_loss" in h for h in history):
        ax1.plot(epochs, [h["test_loss"] for h in history], marker="o", label="test")
    ax1.set(xlabel="epoch", ylabel="loss", title="loss")
    ax1.legend()
    ax2.plot(epochs, [100 * h["test_error"] for h in history], marker="o", label="test error")
    if all("train_accuracy" in h for h in history):
        ax2.plot(epochs, [100 * (1 - h["train_accuracy"]) for h in history], marker="o", label="train error")
    ax2.set(xlabel="epoch", ylabel="error (%)", title="error", yscale="log")
    ax2.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


# Settings that may change between the calls of one resumable run (they do not change the experiment).
RESUMABLE_CHANGES = frozenset({"epochs", "device", "amp", "dry_run"})
EXIT_UNFINISHED = 3  # --max-minutes stopped the run before --epochs; resume it


def within_budget(deadline: float | None, last_epoch_seconds: float | None) -> bool:
    """Whether another epoch fits before `deadline` (time.monotonic()), judged by the last one's duration."""
    if deadline is None or last_epoch_seconds is None:
        return True
    return time.monotonic() + last_epoch_seconds <= deadline


TaskT = TypeVar("TaskT", bound=Task)


class Trainer(Generic[TaskT]):
    """The one training loop: Adam with exponential decay, exact resume, a time budget, checkpoints and DDP.

    The model, its config and the task (data, loss, evaluation) come from outside, so every kind of training
    (dynamic, EM, baseline, MultiMNIST) runs here; `fit` trains to `cfg.epochs`.
    """

    def __init__(
        self,
        cfg: TrainConfig,
        task: TaskT,
        model: nn.Module,
        model_config: dict[str, Any],
        out_dir: str | os.PathLike[str] | None,
        resume: str | None = None,
        strict_resume: bool = False,
        info: DistInfo | None = None,
    ) -> None:
        """`strict_resume`: continue `resume` only if it was trained with these settings (bar RESUMABLE_CHANGES).

        Args:
            model: built (seeded) and on its device; the loop trains on that device.
            model_config: what rebuilds `model` (checkpoints record it; a resumed run must match it).
            info: this process's place in a torchrun launch (default: a single process).
        """
        self.cfg = cfg
        self.task = task
        self.out = Path(out_dir) if out_dir is not None else None
        self.info = info or DistInfo()
        self.model = model
        self.model_config = model_config
        self.device = next(model.parameters()).device
        self.amp = use_amp(cfg.amp, self.device)
        self.optimizer = torch.optim.Adam(self.model.parameters(), lr=cfg.lr)
        self.scheduler = torch.optim.lr_scheduler.ExponentialLR(self.optimizer, gamma=cfg.lr_decay)
        self.epoch = 0
        self.best_test_error = math.inf
        self.best_val_error = math.inf
        self.history: list[dict[str, Any]] = []
        self.command = training_command(sys.argv)
        if resume:
            self._restore(resume, strict_resume)
        self.ddp: nn.Module = (
            DistributedDataParallel(self.model, device_ids=[self.device.index] if self.device.type == "cuda" else None)
            if self.info.world_size > 1
            else self.model
        )

    def _restore(self, path: str, strict: bool) -> None:
        state = load_checkpoint(path)
        if missing := sorted({"arch", "model_config", "train_config", "epoch", "history"} - state.keys()):
            raise CheckpointMismatch(f"{path} is not a checkpoint of this training loop (no {', '.join(missing)})")
        if state["arch"] != self.cfg.arch or state["model_config"] != self.model_config:
            raise ValueError(f"checkpoint {path} was trained with a different architecture or model config")
        if strict:
            wanted = asdict(self.cfg)
            check_resumable(
                path, state["train_config"], wanted, int(state["epoch"]), self.cfg.epochs, RESUMABLE_CHANGES
            )
        self.model.load_state_dict(state["model"])
        self.optimizer.load_state_dict(state["optimizer"])
        self.scheduler.load_state_dict(state["scheduler"])
        self.epoch = int(state["epoch"])
        self.best_test_error = float(state["best_test_error"])
        self.best_val_error = float(state.get("best_val_error", math.inf))
        self.history = list(state["history"])
        self.task.load_state_dict(state.get("task_state", {}))
        restore_rng_states(state)
        log.info("resumed from %s at epoch %d", path, self.epoch)

    def _state(self) -> dict[str, Any]:
        return {
            "arch": self.cfg.arch,
            "model_config": self.model_config,
            "train_config": asdict(self.cfg),
            "model": self.model.state_dict(),
            "optimizer": self.optimizer.state_dict(),
            "scheduler": self.scheduler.state_dict(),
            "epoch": self.epoch,
            "best_test_error": self.best_test_error,
            "best_val_error": self.best_val_error,
            "history": self.history,
            **rng_states(),
            "command": self.command,
            "data_hashes": self.task.data_hashes,
            **({"task_state": task_state} if (task_state := self.task.state_dict()) else {}),
        }

    def _autocast(self) -> Any:
        return torch.autocast(device_type=self.device.type, dtype=torch.bfloat16, enabled=self.amp)

    def train_epoch(self) -> dict[str, float]:
        cfg, epoch = self.cfg, self.epoch
        batches = self.task.batches(epoch)
        if cfg.dry_run:
            batches = batches[:1]
        self.ddp.train()
        sums: dict[str, float] = {}
        correct = seen = 0
        scored = False  # whether the task counts correct predictions (single-label classification does)
        total_steps = max(cfg.epochs * len(batches), 1)
        bar = tqdm(
            batches,
            desc="dry run: 1 batch" if cfg.dry_run else f"epoch {epoch + 1}/{cfg.epochs}",
            disable=not self.info.is_main,
            mininterval=2.0,
            file=sys.stderr,
        )
        for step, batch in enumerate(bar):
            progress = (epoch * len(batches) + step) / total_steps
            result = self.task.step(self.ddp, batch, progress, self._autocast)
            self.optimizer.zero_grad(set_to_none=True)
            result.loss.backward()
            self.optimizer.step()
            seen += result.n
            if result.correct is not None:
                scored, correct = True, correct + result.correct
            for key, value in {"train_loss": result.loss.detach(), **result.parts}.items():
                sums[key] = sums.get(key, 0.0) + float(value) * result.n
            bar.set_postfix(loss=f"{sums['train_loss'] / seen:.4f}", acc=f"{correct / seen:.4f}" if scored else "-")
        self.scheduler.step()
        sums, correct, seen = self._all_ranks(sums, correct, seen)
        accuracy = {"train_accuracy": correct / max(seen, 1)} if scored else {}
        return {**{k: v / max(seen, 1) for k, v in sums.items()}, **accuracy, "train_images": seen}

    def _all_ranks(self, sums: dict[str, float], correct: int, seen: int) -> tuple[dict[str, float], int, int]:
        """Sum the epoch's statistics over all processes (identity without DDP)."""
        if self.info.world_size == 1:
            return sums, correct, seen
        keys = sorted(sums)
        t = torch.tensor([sums[k] for k in keys] + [correct, seen], dtype=torch.float64, device=self.device)
        dist.all_reduce(t)
        values = t.tolist()
        return dict(zip(keys, values[: len(keys)], strict=True)), int(values[-2]), int(values[-1])

    @property
    def finished(self) -> bool:
        return self.epoch >= self.cfg.epochs

    def _all_agree(self, flag: bool) -> bool:
        """True only if every process says so (DDP ranks must stop at the same epoch or they hang)."""
        if self.info.world_size == 1:
            return flag
        t = torch.tensor([1 if flag else 0], device=self.device)
        dist.all_reduce(t, op=dist.ReduceOp.MIN)
        return bool(t.item())

    def fit(self, deadline: float | None = None) -> list[dict[str, Any]]:
        """Train to `cfg.epochs`, or until `deadline` (a time.monotonic() value) would be overrun.

        No epoch is started that would end past the deadline, judged by the last epoch's duration; the
        first epoch of a call always runs. Every epoch ends with last.pt written, so a stopped run
        continues with `resume=<out>/last.pt` (`finished` says whether it reached `cfg.epochs`).
        """
        last_seconds: float | None = None
        while self.epoch < self.cfg.epochs:
            if not self._all_agree(within_budget(deadline, last_seconds)):
                log.info("time budget: stopping after epoch %d of %d", self.epoch, self.cfg.epochs)
                break
            lr = self.optimizer.param_groups[0]["lr"]
            start = time.perf_counter()
            stats = self.train_epoch()
            seconds = time.perf_counter() - start
            evaluation = self.task.evaluate(self.model, 1 if self.cfg.dry_run else None)
            self.epoch += 1
            row = {
                "epoch": self.epoch,
                **{k: round(v, 6) for k, v in stats.items() if k != "train_images"},
                **evaluation,
                "lr": lr,
                "seconds": round(seconds, 2),
                "images_per_second": round(stats["train_images"] / seconds, 1),
                "precision": "bfloat16-mixed" if self.amp else "float32",
            }
            last_seconds = time.perf_counter() - start
            if self.cfg.dry_run:  # its one row is the result the caller prints, not a log line
                self.history.append(row)
                break
            log.info("epoch %d: %s", self.epoch, json.dumps(row))
            self._end_epoch(row)
        return self.history

    def save_last(self) -> None:
        """Write <out>/last.pt (main process only; nothing without an output directory)."""
        if self.info.is_main and self.out is not None:
            save_checkpoint(self.out / "last.pt", self._state())

    def _end_epoch(self, row: dict[str, Any]) -> None:
        self.history.append(row)
        if not self.info.is_main or self.out is None:
            return
        self.out.mkdir(parents=True, exist_ok=True)
        with open(self.out / "metrics.jsonl", "a") as f:
            f.write(json.dumps(row) + "\n")
        draw_curve(self.history, self.out / "training_curve.png")
        is_best = row["test_error"] < self.best_test_error
        if is_best:
            self.best_test_error = row["test_error"]
        is_best_val = "val_error" in row and row["val_error"] < self.best_val_error
        if is_best_val:
            self.best_val_error = row["val_error"]
        state = self._state()
        save_checkpoint(self.out / "last.pt", state)
        if is_best:
            save_checkpoint(self.out / "best.pt", state)
        if is_best_val:
            save_checkpoint(self.out / "best_val.pt", state)

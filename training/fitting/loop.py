"""The training loop, once: it trains a model it is given on a Task (data, loss, evaluation) it is given.

Seeded, resumable to the bit (also from inside an epoch), time-boxed (`--max-minutes`), optionally
distributed (torchrun / DDP).
"""

from __future__ import annotations

import copy
import json
import logging
import math
import os
import sys
import time
from collections import deque
from collections.abc import Callable, Sequence
from contextlib import AbstractContextManager
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Generic, Protocol, TypeVar

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel
from torch.optim.swa_utils import AveragedModel
from tqdm import tqdm

from training.fitting.checkpoint import (
    CheckpointMismatch,
    check_resumable,
    load_checkpoint,
    restore_rng_states,
    rng_states,
    save_checkpoint,
    training_command,
)
from training.fitting.config import TrainConfig
from training.fitting.device import use_amp
from training.fitting.history import draw_curve

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
        """The evaluation columns of an epoch's row; `test_error` is required and selects best.pt, `val_error`
        best_val.pt. An epoch `eval_every` skips has none of them."""
        ...

    def state_dict(self) -> dict[str, Any]:
        """State beyond torch's RNG that a resumed run needs (empty: none).

        Taken before `batches(epoch)` (restored, it makes `batches` draw the same epoch again) and between
        steps (restored after `batches`, it continues the epoch: e.g. an augmentation generator's position).
        """
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


# Settings that may change between the calls of one resumable run: all but `ema` leave the experiment as it was
# (`eval_every` only changes which epochs are evaluated: evaluation draws no random numbers and trains nothing).
# The weight average (`ema`) changes which weights are evaluated and saved, so each epoch's row says whether it
# was the average; switched on part-way, it starts from the resumed weights.
RESUMABLE_CHANGES = frozenset({"epochs", "device", "amp", "dry_run", "ema", "eval_every"})
EXIT_UNFINISHED = 3  # --max-minutes stopped the run before --epochs; resume it


clock: Callable[[], float] = time.monotonic  # what budgets are judged by (deadlines are its values; tests fake it)
RECENT_STEPS = 10  # the next step's duration is judged by the longest of this many recent ones


def on_terminal() -> bool:
    """stderr is a terminal: progress bars are drawn there; logs and pipes get plain lines instead."""
    return sys.stderr.isatty()


def epoch_summary(row: dict[str, Any], epochs: int, best_test_error: float, eval_every: int = 1) -> str:
    """One readable line per epoch for the log (metrics.jsonl holds the row's JSON)."""
    best = min(best_test_error, row.get("test_error", math.inf))
    best_so_far = f"best {best:.2%}" if best < math.inf else "none evaluated yet"
    if "test_error" in row:
        parts = [f"test error {row['test_error']:.2%} ({best_so_far})"]
    else:
        parts = [f"not evaluated (every {eval_every} epochs; {best_so_far})"]
    if "val_error" in row:
        parts.append(f"validation error {row['val_error']:.2%}")
    parts.append(f"train loss {row['train_loss']:.4f}")
    parts.append(f"{row['seconds']:.0f} s, {row['images_per_second']:.0f} images/s")
    return f"epoch {row['epoch']}/{epochs}: " + ", ".join(parts)


def within_budget(deadline: float | None, last_epoch_seconds: float | None) -> bool:
    """Whether another epoch fits before `deadline` (a `clock()` value), judged by the last one's duration."""
    return fits(deadline, last_epoch_seconds)


def fits(deadline: float | None, seconds: float | None) -> bool:
    """Whether work of `seconds` (None: not known yet, so it runs) ends by `deadline` (None: no budget)."""
    if deadline is None or seconds is None:
        return True
    return clock() + seconds <= deadline


class BudgetSpent(Exception):
    """The time budget stopped an epoch between two steps; last.pt holds the position to resume from."""


@dataclass
class Budget:
    """The limits inside an epoch: stop before a step (or the evaluation) that would end past `deadline`,
    and write last.pt every `checkpoint_seconds`; both are `clock()` seconds."""

    deadline: float | None = None
    checkpoint_seconds: float | None = None
    saved_at: float = field(default_factory=lambda: clock())
    recent: deque[float] = field(default_factory=lambda: deque(maxlen=RECENT_STEPS))  # step durations

    def step_fits(self) -> bool:
        return fits(self.deadline, max(self.recent, default=None))

    def checkpoint_due(self) -> bool:
        return self.checkpoint_seconds is not None and clock() - self.saved_at >= self.checkpoint_seconds


@dataclass
class EpochProgress:
    """How far this process is into an epoch: the next step and the statistics of the steps before it."""

    step: int = 0
    sums: dict[str, float] = field(default_factory=dict)  # loss parts, each summed over images
    correct: int = 0
    seen: int = 0
    scored: bool = False  # whether the task counts correct predictions (single-label classification does)
    seconds: float = 0.0  # training time spent in the epoch, over every call that trained part of it


TaskT = TypeVar("TaskT", bound=Task)


Tensors = tuple[torch.Tensor, ...] | list[torch.Tensor]


def ema_with_warmup(decay: float) -> Callable[[Tensors, Tensors, torch.Tensor | int], None]:
    """AveragedModel's update for an exponential moving average whose decay warms up: the n-th update after the
    first (which copies) uses min(decay, (1 + n) / (10 + n)), as TensorFlow's ExponentialMovingAverage does with
    `num_updates`. With a fixed 0.999 the first epochs' average would still be mostly the random initialisation
    (0.999^430 = 0.65 of it after an MNIST epoch at batch 128)."""

    @torch.no_grad()
    def update(averaged: Tensors, current: Tensors, updates: torch.Tensor | int) -> None:
        # The count stays a tensor on the weights' device, so a GPU run never waits for it.
        n = torch.as_tensor(updates, device=averaged[0].device).to(averaged[0].dtype)
        weight = 1.0 - ((1.0 + n) / (10.0 + n)).clamp(max=decay)
        torch._foreach_lerp_(averaged, current, [weight] * len(averaged))

    return update


def make_optimizer(model: nn.Module, lr: float, weight_decay: float = 0.0) -> torch.optim.Optimizer:
    """The optimizer every training and every timed training step uses: Adam at `lr` (AdamW's decoupled
    `weight_decay` when one is given, as the "not a digit" network uses)."""
    if weight_decay:
        return torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=weight_decay)
    return torch.optim.Adam(model.parameters(), lr=lr)


def optimizer_step(optimizer: torch.optim.Optimizer, loss: torch.Tensor) -> None:
    """One update from `loss`: gradients cleared, backpropagated, applied (they stay on the parameters after)."""
    optimizer.zero_grad(set_to_none=True)
    loss.backward()
    optimizer.step()


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
        init_from: dict[str, Any] | None = None,
    ) -> None:
        """`strict_resume`: continue `resume` only if it was trained with these settings (bar RESUMABLE_CHANGES).

        Args:
            model: built (seeded) and on its device; the loop trains on that device.
            model_config: what rebuilds `model` (checkpoints record it; a resumed run must match it).
            info: this process's place in a torchrun launch (default: a single process).
            init_from: where `model`'s weights came from when not from its seeded initialisation (a warm
                start; not with `resume`): checkpoints and the first epoch's row record it.
        """
        self.cfg = cfg
        self.task = task
        self.out = Path(out_dir) if out_dir is not None else None
        self.info = info or DistInfo()
        self.model = model
        self.model_config = model_config
        self.device = next(model.parameters()).device
        self.amp = use_amp(cfg.amp, self.device)
        self.optimizer = make_optimizer(self.model, cfg.lr)
        self.scheduler = torch.optim.lr_scheduler.ExponentialLR(self.optimizer, gamma=cfg.lr_decay)
        # The weights evaluated and saved as "model": an exponential moving average of the trained ones, updated
        # after every optimizer step, when cfg.ema is set (the trained weights are then kept as "training_model").
        self.ema: AveragedModel | None = (
            AveragedModel(model, multi_avg_fn=ema_with_warmup(cfg.ema)) if cfg.ema else None
        )
        self.epoch = 0
        self.best_test_error = math.inf
        self.best_val_error = math.inf
        self.history: list[dict[str, Any]] = []
        self.evaluation_seconds: float | None = None  # the last evaluation's duration, to judge the next one by
        self.resume_position: dict[str, Any] | None = None  # this process's place inside the epoch to resume
        self.epoch_start: dict[str, Any] = {}  # the RNG and task states before this epoch's batches were drawn
        self.command = training_command(sys.argv)
        self.init_from = init_from
        if resume and init_from is not None:
            raise ValueError("a warm start (init_from) is a new run: it cannot also resume a checkpoint")
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
            saved = {**asdict(TrainConfig()), **state["train_config"]}  # a setting added since: it was the default
            check_resumable(path, saved, wanted, int(state["epoch"]), self.cfg.epochs, RESUMABLE_CHANGES)
        self.model.load_state_dict(state.get("training_model", state["model"]))
        if self.ema is not None:  # without a saved average it starts from these weights (its next update copies)
            self.ema.module.load_state_dict(state["model"])
            self.ema.n_averaged.fill_(int(state.get("ema_updates", 0)) if "training_model" in state else 0)
        self.optimizer.load_state_dict(state["optimizer"])
        self.scheduler.load_state_dict(state["scheduler"])
        self.epoch = int(state["epoch"])
        self.best_test_error = float(state["best_test_error"])
        self.best_val_error = float(state.get("best_val_error", math.inf))
        self.history = list(state["history"])
        self.evaluation_seconds = state.get("evaluation_seconds")
        self.init_from = state.get("init_from")
        self.task.load_state_dict(state.get("task_state", {}))
        restore_rng_states(state)
        if "mid_epoch" in state:
            self._restore_position(path, state["mid_epoch"])
        else:
            log.info("resumed from %s at epoch %d", path, self.epoch)

    def _restore_position(self, path: str, mid_epoch: dict[str, Any]) -> None:
        """Keep this process's place inside the epoch; it is taken up once `train_epoch` has drawn the batches."""
        ranks = mid_epoch["ranks"]
        if len(ranks) != self.info.world_size:
            raise CheckpointMismatch(
                f"{path} was stopped inside epoch {self.epoch + 1} by {len(ranks)} process(es); continue it with "
                f"as many, not {self.info.world_size}"
            )
        self.resume_position = ranks[self.info.rank]
        log.info("resumed from %s in epoch %d after step %d", path, self.epoch + 1, mid_epoch["step"])

    def _resume_point(self) -> dict[str, Any]:
        """This process's RNG and task states, as a checkpoint stores them (copies: training goes on)."""
        task_state = copy.deepcopy(self.task.state_dict())
        return {**rng_states(), **({"task_state": task_state} if task_state else {})}

    def _state(self, resume_point: dict[str, Any] | None = None) -> dict[str, Any]:
        return {
            "arch": self.cfg.arch,
            "model_config": self.model_config,
            "train_config": asdict(self.cfg),
            "model": self.evaluated_model.state_dict(),
            **(
                {}
                if self.ema is None
                else {"training_model": self.model.state_dict(), "ema_updates": int(self.ema.n_averaged)}
            ),
            "optimizer": self.optimizer.state_dict(),
            "scheduler": self.scheduler.state_dict(),
            "epoch": self.epoch,
            "best_test_error": self.best_test_error,
            "best_val_error": self.best_val_error,
            "history": self.history,
            **(resume_point if resume_point is not None else self._resume_point()),
            "command": self.command,
            "data_hashes": self.task.data_hashes,
            **({} if self.init_from is None else {"init_from": self.init_from}),
            **({} if self.evaluation_seconds is None else {"evaluation_seconds": self.evaluation_seconds}),
        }

    @property
    def evaluated_model(self) -> nn.Module:
        """The weights each epoch is evaluated with and checkpoints save as "model": the average, if kept."""
        return self.model if self.ema is None else self.ema.module

    def _autocast(self) -> Any:
        return torch.autocast(device_type=self.device.type, dtype=torch.bfloat16, enabled=self.amp)

    def _epoch_batches(self) -> tuple[Sequence[Any], EpochProgress]:
        """This epoch's batches, and where in them to start: where a resumed checkpoint stopped, or at the first."""
        start = self._resume_point()
        batches = self.task.batches(self.epoch)
        if self.cfg.dry_run:
            batches = batches[:1]
        self.epoch_start, progress = start, EpochProgress()
        if (position := self.resume_position) is not None:  # the RNG and task states where it stopped
            self.resume_position = None
            progress = EpochProgress(**{k: position[k] for k in asdict(progress)})
            self.task.load_state_dict(position["task_state"])
            restore_rng_states(position["rng"])
        return batches, progress

    def train_epoch(self, budget: Budget | None = None) -> dict[str, float]:
        """Train epoch `epoch + 1` (from where a resumed checkpoint stopped inside it), then step the schedule.

        Returns its train columns, averaged over the whole epoch and every process. With `budget`: raises
        BudgetSpent, last.pt written, when the next step or the evaluation after the last would end past the
        deadline, and writes last.pt whenever a checkpoint is due. The first step of a call always runs.
        """
        cfg, epoch = self.cfg, self.epoch
        batches, progress = self._epoch_batches()
        first, seconds_before, started = progress.step, progress.seconds, time.perf_counter()
        self.ddp.train()
        total_steps = max(cfg.epochs * len(batches), 1)
        desc = "dry run: 1 batch" if cfg.dry_run else f"epoch {epoch + 1}/{cfg.epochs}"
        if self.info.is_main and not on_terminal():  # a log has no bar: one line says what is coming
            log.info("%s: training, steps %d to %d", desc, first + 1, len(batches))
        bar = tqdm(
            batches[first:],
            desc=desc,
            initial=first,
            total=len(batches),
            disable=not (self.info.is_main and on_terminal()),  # carriage returns only on a terminal
            mininterval=2.0,
            file=sys.stderr,
        )
        for step, batch in enumerate(bar, start=first):
            if budget is not None and step > first:
                progress.seconds = seconds_before + time.perf_counter() - started
                self._between_steps(budget, progress, len(batches), budget.step_fits())
            tick = clock()
            result = self.task.step(self.ddp, batch, (epoch * len(batches) + step) / total_steps, self._autocast)
            optimizer_step(self.optimizer, result.loss)
            if self.ema is not None:
                self.ema.update_parameters(self.model)
            self._count(progress, result)
            progress.step = step + 1
            if budget is not None:
                budget.recent.append(clock() - tick)
            bar.set_postfix(
                loss=f"{progress.sums['train_loss'] / progress.seen:.4f}",
                acc=f"{progress.correct / progress.seen:.4f}" if progress.scored else "-",
            )
        progress.seconds = seconds_before + time.perf_counter() - started
        if budget is not None and progress.step > first:
            self._between_steps(budget, progress, len(batches), fits(budget.deadline, self.evaluation_seconds))
        self.scheduler.step()
        sums, correct, seen = self._all_ranks(progress.sums, progress.correct, progress.seen)
        accuracy = {"train_accuracy": correct / max(seen, 1)} if progress.scored else {}
        columns = {k: v / max(seen, 1) for k, v in sums.items()}
        return {**columns, **accuracy, "train_images": seen, "train_seconds": progress.seconds}

    @staticmethod
    def _count(progress: EpochProgress, result: Step) -> None:
        """Add a step's loss parts (summed over its images) and correct predictions to the epoch's statistics."""
        progress.seen += result.n
        if result.correct is not None:
            progress.scored, progress.correct = True, progress.correct + result.correct
        for key, value in {"train_loss": result.loss.detach(), **result.parts}.items():
            progress.sums[key] = progress.sums.get(key, 0.0) + float(value) * result.n

    def _between_steps(self, budget: Budget, progress: EpochProgress, steps: int, next_fits: bool) -> None:
        """Write last.pt here if a checkpoint is due or the next piece of work does not fit (then stop).

        Every process decides the same (any one's reason counts), so DDP ranks stop at the same step.
        """
        stop, save = self._any_rank(not next_fits, budget.checkpoint_due())
        if stop or save:
            self._save_position(progress)
            budget.saved_at = clock()
        if stop:
            where = f"epoch {self.epoch + 1} after step {progress.step} of {steps}"
            log.info("time budget: stopping in %s (epochs done: %d of %d)", where, self.epoch, self.cfg.epochs)
            raise BudgetSpent(where)

    def _save_position(self, progress: EpochProgress) -> None:
        """Write last.pt inside the epoch: every process's place in it, over the state before its batches."""
        if self.out is None:
            return
        mine = {**asdict(progress), "rng": rng_states(), "task_state": copy.deepcopy(self.task.state_dict())}
        ranks: list[Any] = [mine]
        if self.info.world_size > 1:
            ranks = [None] * self.info.world_size
            dist.all_gather_object(ranks, mine)
        if self.info.is_main:
            state = self._state(self.epoch_start)
            save_checkpoint(self.out / "last.pt", {**state, "mid_epoch": {"step": progress.step, "ranks": ranks}})
            log.info("wrote %s in epoch %d after step %d", self.out / "last.pt", self.epoch + 1, progress.step)

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

    def _any_rank(self, *flags: bool) -> tuple[bool, ...]:
        """Each flag, true if any process says so (DDP ranks must stop at the same place or they hang)."""
        if self.info.world_size == 1:
            return flags
        t = torch.tensor([1 if flag else 0 for flag in flags], device=self.device)
        dist.all_reduce(t, op=dist.ReduceOp.MAX)
        return tuple(bool(v) for v in t.tolist())

    def fit(self, deadline: float | None = None, checkpoint_minutes: float | None = None) -> list[dict[str, Any]]:
        """Train to `cfg.epochs`, or until `deadline` (a `clock()` value, i.e. time.monotonic()) would be overrun.

        No epoch is started that would end past the deadline, judged by the last epoch's duration in this
        call, and inside an epoch no step that would, judged by the recent steps (nor the evaluation, by
        the last one); the first step of a call always runs. Every epoch ends with last.pt written, and so
        does a stop inside one and, with `checkpoint_minutes`, every that many minutes of an epoch; a stopped
        run continues exactly with `resume=<out>/last.pt` (`finished` says whether it reached `cfg.epochs`).
        Which epochs are evaluated (and so may become best.pt) is `_evaluates`'s rule.
        """
        budget = Budget(deadline, None if checkpoint_minutes is None else 60.0 * checkpoint_minutes)
        last_seconds: float | None = None
        while self.epoch < self.cfg.epochs:
            if self._any_rank(not within_budget(deadline, last_seconds))[0]:
                log.info("time budget: stopping after epoch %d of %d", self.epoch, self.cfg.epochs)
                break
            lr = self.optimizer.param_groups[0]["lr"]
            start = clock()
            try:
                stats = self.train_epoch(budget)
            except BudgetSpent:
                break
            evaluates = self._evaluates(deadline, max(clock() - start, stats["train_seconds"]))
            evaluation = self._evaluate() if evaluates else {}
            self.epoch += 1
            row = {
                "epoch": self.epoch,
                **{k: round(v, 6) for k, v in stats.items() if k not in ("train_images", "train_seconds")},
                **evaluation,
                "lr": lr,
                "seconds": round(stats["train_seconds"], 2),
                "images_per_second": round(stats["train_images"] / stats["train_seconds"], 1),
                "precision": "bfloat16-mixed" if self.amp else "float32",
                **({} if self.ema is None else {"ema": self.cfg.ema}),
                **({"init_from": self.init_from} if self.init_from is not None and self.epoch == 1 else {}),
            }
            last_seconds = clock() - start if evaluates else None  # None: `_evaluates` found the next one fits
            if self.cfg.dry_run:  # its one row is the result the caller prints, not a log line
                self.history.append(row)
                break
            self._end_epoch(row)
            log.info("%s", epoch_summary(row, self.cfg.epochs, self.best_test_error, self.cfg.eval_every))
            budget.saved_at = clock()
        return self.history

    def _evaluates(self, deadline: float | None, trained: float) -> bool:
        """Whether the epoch just trained (in `trained` seconds) is evaluated: every `eval_every`-th, the run's
        last and a dry run's are; another one only when the next epoch and its evaluation would not fit before
        `deadline` (the call stops after it, so a call stopped between epochs stops after an evaluated one), or,
        with a deadline, while no evaluation has been timed to judge that by."""
        epoch, cfg = self.epoch + 1, self.cfg
        if cfg.dry_run or epoch % cfg.eval_every == 0 or epoch >= cfg.epochs:
            return True
        if deadline is not None and self.evaluation_seconds is None:
            return True
        return self._any_rank(not within_budget(deadline, trained + (self.evaluation_seconds or 0.0)))[0]

    def _evaluate(self) -> dict[str, Any]:
        start = clock()
        evaluation = self.task.evaluate(self.evaluated_model, 1 if self.cfg.dry_run else None)
        self.evaluation_seconds = clock() - start
        return evaluation

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
        is_best = "test_error" in row and row["test_error"] < self.best_test_error  # only evaluated epochs
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

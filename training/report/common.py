"""What every report section shares: sizes, the run context, saved results, markdown and figures."""

from __future__ import annotations

import json
import logging
import os
import subprocess
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field, replace
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import numpy as np
import torch

from service.contract import cpu_model, load_average
from training.benchmarks.machine import machine_description
from training.data.mnist import MNISTSplit, load_split
from training.fitting.checkpoint import CheckpointMismatch
from training.fitting.config import TrainConfig
from training.fitting.loop import Trainer, within_budget
from training.fitting.train import ClassificationTask, TaskFactory, mnist_trainer
from training.report.compute import lr_decay_per_epoch

log = logging.getLogger(__name__)

REPO_ROOT = Path(__file__).resolve().parents[2]


class NotMeasured(Exception):
    """A section that cannot run here; the message says what it needs."""


class Unfinished(Exception):
    """A training section stopped at the time budget (`--max-minutes`); its progress is kept under --runs.

    `partial` is the section's result so far (result, arrays), rendered as partial; None when nothing is trained.
    """

    def __init__(self, message: str, partial: tuple[dict[str, Any], dict[str, np.ndarray]] | None = None) -> None:
        super().__init__(message)
        self.partial = partial


@dataclass(frozen=True)
class Sizes:
    """How big each experiment is: the paper's protocol, or tiny for a smoke test."""

    preset: str = "paper"
    epochs: int = 30
    batch_size: int = 128
    eval_batch_size: int = 500
    eval_every: int = 1  # evaluate trained models after every N-th epoch (and the last; TrainConfig.eval_every)
    train_subset: int | None = None
    test_subset: int | None = None  # evaluate on the first N test digits (None: all 10,000)
    epoch_images: int | None = None  # an epoch is N training images (None: the whole set, as in the paper)
    affine_cnn_channels: tuple[int, ...] | None = None  # the affine section's CNN (None: the paper baseline's)
    affine_cnn_epochs: int | None = None  # the affine section's CNN trains this many epochs (None: `epochs`)
    multimnist_test_pairs: int = 1  # composites per test digit
    batches: tuple[int, ...] = (1, 8, 32, 128, 256)
    speed_seconds: float = 2.0  # per (runtime, batch) measurement
    speed_min_reps: int = 10
    matmul_size: int = 2048
    examples: int = 8  # images per example figure

    @classmethod
    def tiny(cls) -> Sizes:
        return cls(
            preset="tiny", epochs=1, batch_size=32, eval_batch_size=64, batches=(1, 8),
            speed_seconds=0.02, speed_min_reps=3, matmul_size=128, examples=4,
        )  # fmt: skip


@dataclass
class Context:
    out: Path  # the docs folder: REPORT.md here, results and figures under report/
    data_dir: str | None
    zoo: Path
    model: Path | None  # a model directory or checkpoint for Figure 4 and speed (default: the zoo's first)
    sizes: Sizes
    tiny: bool
    device: torch.device
    seed: int
    command: str
    scratch: Path  # temporary files of this run (fresh exports)
    runs: Path | None = None  # where trained models keep checkpoints and metrics (None: nowhere)
    amp: bool = False  # bfloat16 autocast of the convolutions (training.fitting.train)
    deadline: float | None = None  # time.monotonic() by which training sections stop (--max-minutes)
    capsnet_curve: Path | None = None  # a capsnet-train metrics.jsonl drawn beside the baseline's curve
    fresh: dict[str, Path] = field(default_factory=dict)
    unfinished: list[str] = field(default_factory=list)
    longest_epoch: float | None = None  # seconds, of any epoch trained in this call (to judge starting another model)

    def trained(self, seconds: float) -> None:
        """Note an epoch of `seconds` trained in this call."""
        self.longest_epoch = max(seconds, self.longest_epoch or 0.0)

    def run_dir(self, name: str) -> Path | None:
        """Where the trained model `name` keeps last.pt between calls (None without --runs)."""
        return self.runs / name if self.runs else None

    def check_budget(
        self,
        name: str,
        done: int | None,
        total: int,
        last_epoch_seconds: float | None,
        partial: tuple[dict[str, Any], dict[str, np.ndarray]] | None = None,
    ) -> None:
        """Raise Unfinished (carrying `partial`) when the next epoch of `name` would overrun the budget, or it is spent.

        `done` is the epochs trained so far (None: not known yet, before the run is opened). Before a model's
        first epoch in this call (`last_epoch_seconds` None) the longest epoch trained so far in this call, of
        any model, is the estimate; with none, the epoch runs, so every call makes progress.
        """
        if self.deadline is None:
            return
        spent = time.monotonic() >= self.deadline
        estimate = last_epoch_seconds if last_epoch_seconds is not None else self.longest_epoch
        if spent or not within_budget(self.deadline, estimate):
            where = self.run_dir(name)
            progress = "not continued" if done is None else f"{done} of {total} epochs trained"
            raise Unfinished(
                f"{name}: {progress} when the time budget ran out; the progress is kept in {where}. "
                "Run the same command again to continue.",
                partial,
            )

    @property
    def results(self) -> Path:
        return self.out / "report"

    @property
    def figures(self) -> Path:
        return self.out / "report" / "figures"

    def split(self, name: str) -> MNISTSplit:
        if self.data_dir is None:
            raise NotMeasured("no MNIST data directory (pass --data-dir or set $CAPSNET_DATA_DIR)")
        split = load_split(self.data_dir, name)
        return split.subset(self.sizes.test_subset if name == "test" else self.sizes.train_subset)


@dataclass
class Saved:
    section: str
    produced_at: str
    command: str
    tiny: bool
    machine: dict[str, Any]
    result: dict[str, Any]
    arrays: dict[str, np.ndarray]


def now_utc() -> str:
    return datetime.now(timezone.utc).isoformat(timespec="seconds")


def save_result(
    ctx: Context, section: str, result: dict[str, Any], arrays: dict[str, np.ndarray], busy: float | None = None
) -> Saved:
    """Save a section's numbers; `busy` is cpu_busy_percent() sampled before the section ran."""
    machine = {**machine_info(ctx.device), "cpu_busy_percent_before": busy}
    saved = Saved(section, now_utc(), ctx.command, ctx.tiny, machine, result, arrays)
    ctx.results.mkdir(parents=True, exist_ok=True)
    payload = {k: v for k, v in asdict(saved).items() if k != "arrays"}
    (ctx.results / f"{section}.json").write_text(json.dumps(payload, indent=1) + "\n")
    npz = ctx.results / f"{section}.npz"
    if arrays:
        np.savez_compressed(npz, **arrays)  # type: ignore[arg-type]
    elif npz.exists():
        npz.unlink()
    return saved


def load_result(ctx: Context, section: str) -> Saved | None:
    path = ctx.results / f"{section}.json"
    if not path.is_file():
        return None
    d = json.loads(path.read_text())
    if bool(d.get("tiny")) != ctx.tiny:
        log.info("ignoring %s: produced with tiny=%s", path, d.get("tiny"))
        return None
    npz = ctx.results / f"{section}.npz"
    arrays: dict[str, np.ndarray] = {}
    if npz.is_file():
        with np.load(npz) as f:
            arrays = {k: f[k] for k in f.files}
    return Saved(d["section"], d["produced_at"], d["command"], d["tiny"], d["machine"], d["result"], arrays)


def is_partial(saved: Saved) -> bool:
    """Whether a saved result is of a training that has not reached its planned epochs yet: its `progress`, or
    that of any of its `models` (the affine section's), says it has not finished."""
    r = saved.result
    models = r.get("models")
    by_model = models.values() if isinstance(models, dict) else []
    progresses = [r.get("progress"), *(m.get("progress") for m in by_model if isinstance(m, dict))]
    return any(isinstance(p, dict) and not p.get("finished", True) for p in progresses)


def machine_info(device: torch.device) -> dict[str, Any]:
    info: dict[str, Any] = dict(machine_description(device))
    info["cpu_model"] = cpu_model()
    info["load_average"] = load_average()
    info["nice"] = os.nice(0) if hasattr(os, "nice") else None
    return info


def busy_note(machine: dict[str, Any]) -> str:
    """How busy the machine was just before a measurement (older results have only the lagging load average)."""
    busy = machine.get("cpu_busy_percent_before")
    if busy is not None:
        return f"all CPUs {busy:g}% busy in the second before measuring (load average {machine.get('load_average')})"
    return f"load average at the time {machine.get('load_average')}"


def git_commit() -> str | None:
    try:
        out = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=REPO_ROOT, capture_output=True, text=True)
    except OSError:
        return None
    return out.stdout.strip() or None


# --- markdown and figures ---------------------------------------------------------------------------------


def md_table(headers: list[str], rows: list[list[Any]]) -> str:
    lines = ["| " + " | ".join(headers) + " |", "|" + "---|" * len(headers)]
    lines += ["| " + " | ".join(str(c) for c in row) + " |" for row in rows]
    return "\n".join(lines)


def pct(x: float | None, digits: int = 2) -> str:
    return "not yet measured" if x is None else f"{100 * x:.{digits}f}%"


def provenance(saved: Saved) -> str:
    machine = saved.machine
    cpu = machine.get("cpu_model") or machine.get("processor")
    where = machine.get("gpu") or f"{cpu} ({machine.get('cpu_count')} CPUs)"
    return f"_Produced {saved.produced_at} on {where} by `{saved.command}`._"


def not_measured(intro: list[str], reason: str | None, *notes: str) -> str:
    """A section without a result: its introduction, why it is not measured, then `notes` (e.g. the paper's figures)."""
    paragraphs = [f"**Not yet measured.** {reason or ''}".rstrip(), *notes]
    return "\n".join([*intro, *(line for p in paragraphs for line in (p, ""))])


@contextmanager
def figure(path: Path, *args: Any, **kwargs: Any) -> Iterator[Any]:
    """A matplotlib (Agg) figure saved to `path` when the block ends."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    path.parent.mkdir(parents=True, exist_ok=True)
    fig = plt.figure(*args, **kwargs)
    try:
        yield fig
        fig.savefig(path, dpi=100, bbox_inches="tight")
    finally:
        plt.close(fig)


def montage(images: np.ndarray, gap: int = 2) -> np.ndarray:
    """images (R, C, H, W[, 3]) -> one (R·(H+gap), C·(W+gap)[, 3]) array, tiles separated by mid-gray lines."""
    rows, cols, h, w = images.shape[:4]
    padding = [(0, 0), (0, 0), (0, gap), (0, gap)] + [(0, 0)] * (images.ndim - 4)
    tiles = np.pad(images, padding, constant_values=128)  # (R, C, H+gap, W+gap[, 3])
    axes = (0, 2, 1, 3, *range(4, images.ndim))
    return tiles.transpose(axes).reshape(rows * (h + gap), cols * (w + gap), *images.shape[4:])


def image_grid(
    path: Path, images: np.ndarray, title: str, row_labels: list[str] | None = None, col_labels: list[str] | None = None
) -> None:
    """images (R, C, H, W) gray or (R, C, H, W, 3) RGB in [0, 255] -> one PNG, rows and columns labelled."""
    rows, cols, h, w = images.shape[:4]
    with figure(path, figsize=(0.45 * cols + 1.2, 0.45 * rows + 0.8)) as fig:
        ax = fig.subplots()
        ax.imshow(montage(images.astype(np.uint8)), cmap="gray", vmin=0, vmax=255, interpolation="nearest")
        ax.set_xticks([c * (w + 2) + w / 2 for c in range(cols)], col_labels or [""] * cols, fontsize=6)
        ax.set_yticks([r * (h + 2) + h / 2 for r in range(rows)], row_labels or [""] * rows, fontsize=6)
        ax.xaxis.tick_top()
        ax.tick_params(length=0)
        ax.set_title(title, fontsize=8, pad=14)


def confusion_figure(path: Path, confusion: np.ndarray, title: str) -> None:
    with figure(path, figsize=(4.6, 4.0)) as fig:
        ax = fig.subplots()
        off = confusion.astype(np.float64).copy()
        np.fill_diagonal(off, np.nan)  # errors only: the diagonal would swamp the colour scale
        im = ax.imshow(off, cmap="Reds")
        for (r, c), v in np.ndenumerate(confusion):
            if v and r != c:
                ax.text(c, r, str(v), ha="center", va="center", fontsize=6)
        ax.set(xlabel="predicted", ylabel="true", title=title, xticks=range(10), yticks=range(10))
        fig.colorbar(im, ax=ax, fraction=0.046)


def shown(path: Path) -> str:
    """A path as the report prints it: relative to the repository (`../shared/…` outside it), never absolute."""
    return Path(os.path.relpath(path.resolve(), REPO_ROOT)).as_posix()


def rel(ctx: Context, path: Path) -> str:
    return path.relative_to(ctx.out).as_posix()


def train_images(ctx: Context) -> int:
    """How many training digits the sections train on (60,000, or the subset of --tiny)."""
    return len(ctx.split("train"))


def train_config(ctx: Context, arch: str, **overrides: Any) -> TrainConfig:
    """The section's training settings: the sizes', with the learning rate decaying 0.96 per pass over the data
    (per epoch when an epoch is the whole set, as in the paper; proportionally less per shorter epoch)."""
    s = ctx.sizes
    base = TrainConfig(
        arch=arch, preset=s.preset, epochs=s.epochs, batch_size=s.batch_size, seed=ctx.seed, device=str(ctx.device),
        train_subset=s.train_subset, test_subset=s.test_subset, eval_batch_size=s.eval_batch_size,
        eval_every=s.eval_every, amp=ctx.amp,
        epoch_images=s.epoch_images, lr_decay=lr_decay_per_epoch(s.epoch_images, train_images(ctx)),
    )  # fmt: skip
    return replace(base, **overrides)


def resumable_trainer(
    ctx: Context, name: str, cfg: TrainConfig, make_task: TaskFactory = ClassificationTask
) -> Trainer[ClassificationTask]:
    """A Trainer for `name`, continued from <runs>/<name>/last.pt when an earlier call left one."""
    out = ctx.run_dir(name)
    last = out / "last.pt" if out is not None else None
    resume = str(last) if last is not None and last.is_file() else None
    if resume:
        log.info("continuing %s from %s", name, resume)
    try:
        return mnist_trainer(cfg, ctx.data_dir, out, resume=resume, strict_resume=True, make_task=make_task)
    except CheckpointMismatch as e:
        raise NotMeasured(str(e)) from e


Run = Callable[[Context], tuple[dict[str, Any], dict[str, np.ndarray]]]
Render = Callable[[Context, Saved | None, str | None], str]


@dataclass(frozen=True)
class Section:
    """One section of the report: `run` measures (and may raise NotMeasured or Unfinished), `render` writes markdown
    from a saved result, or says why there is none."""

    key: str
    run: Run
    render: Render
    reads_mnist: bool = True  # running it needs the MNIST files

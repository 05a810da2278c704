"""Regenerate docs/REPORT.md: MNIST error against the papers, baseline CNN, affine robustness, MultiMNIST, speed.

    python -m training.report [--data-dir DIR] [--out docs] [--tiny] [--reuse] [--sections S ...]

Every number comes from a section run by this command. A run saves its numbers as JSON (and arrays for
figures as .npz) under <out>/report/ with the time and the command; `--reuse` renders those instead of
running again, and a section not selected with `--sections` is rendered from its saved result when there
is one. A section that has never run is shown as "not yet measured", with the reason.
"""

from __future__ import annotations

import argparse
import copy
import json
import logging
import math
import os
import shlex
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field, replace
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import numpy as np
import torch

from model.capsnet import count_parameters
from service.benchmark import cpu_busy_percent
from training.architectures import get_architecture
from training.machine import machine_description
from training.checkpoint import CheckpointMismatch
from training.data import IDXError, MNISTSplit, load_split, resolve_data_dir, to_float
from training.device import resolve_device
from training.evaluate import evaluate_torch
from training.results import EvalResult
from training.generators import AFFINE_CANVAS, AffineRanges, affine_digits, center_on_canvas, shifted_on_canvas
from training.multimnist import MultiMNISTConfig, reconstruction_examples, train_multimnist
from training.train import EXIT_UNFINISHED, TrainConfig, Trainer, draw_curve, within_budget

log = logging.getLogger(__name__)

REPO_ROOT = Path(__file__).resolve().parents[1]
SECTIONS = ("mnist_models", "baseline", "affine", "multimnist", "perturbation", "speed")
SERVICE_LOAD_FILE = "service_load.json"  # written by the service issue's load benchmark, rendered when present
AFFINE_SHIFT = (AFFINE_CANVAS - 28) // 2  # 6: random placement of a 28x28 digit anywhere on 40x40
AFFINE_TEST_SEED = 20_170_000  # the affine test set: one transformation per MNIST test digit
PERTURBATIONS = np.round(np.arange(-0.25, 0.2501, 0.05), 2)  # §5.1: steps of 0.05 in [-0.25, 0.25]

# Sabour, Frosst & Hinton 2017, Table 1 (mean ± std over 3 trials) and §5.2, §6.
PAPER_MNIST = [
    ("Baseline CNN", "—", "—", 0.39, ""),
    ("CapsNet", "1 iteration", "no", 0.34, "±0.032"),
    ("CapsNet", "1 iteration", "yes", 0.29, "±0.011"),
    ("CapsNet", "3 iterations", "no", 0.35, "±0.036"),
    ("CapsNet", "3 iterations", "yes", 0.25, "±0.005"),
]
PAPER_MULTIMNIST = {"CapsNet, 3 iterations, reconstruction": 5.2, "Baseline CNN": 8.1}
PAPER_AFFINE = {"CapsNet": 79.0, "Baseline CNN": 66.0}  # accuracy on affNIST; both at ~99.2% on MNIST


class NotMeasured(Exception):
    """A section that cannot run here; the message says what it needs."""


class Unfinished(Exception):
    """A training section stopped at the time budget (`--max-minutes`); its progress is kept under --runs."""


@dataclass(frozen=True)
class Sizes:
    """How big each experiment is: the paper's protocol, or tiny for a smoke test."""

    preset: str = "paper"
    epochs: int = 30
    batch_size: int = 128
    eval_batch_size: int = 500
    train_subset: int | None = None
    test_subset: int | None = None
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
    amp: bool = False  # bfloat16 autocast of the convolutions (training.train)
    deadline: float | None = None  # time.monotonic() by which training sections stop (--max-minutes)
    fresh: dict[str, Path] = field(default_factory=dict)
    unfinished: list[str] = field(default_factory=list)
    longest_epoch: float | None = None  # seconds, of any epoch trained in this call (to judge starting another model)

    def trained(self, seconds: float) -> None:
        """Note an epoch of `seconds` trained in this call."""
        self.longest_epoch = max(seconds, self.longest_epoch or 0.0)

    def run_dir(self, name: str) -> Path | None:
        """Where the trained model `name` keeps last.pt between calls (None without --runs)."""
        return self.runs / name if self.runs else None

    def check_budget(self, name: str, done: int | None, total: int, last_epoch_seconds: float | None) -> None:
        """Raise Unfinished when the next epoch of `name` would overrun the budget, or it is already spent.

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
                "Run the same command again to continue."
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


def cpu_model() -> str | None:
    try:
        lines = Path("/proc/cpuinfo").read_text().splitlines()
    except OSError:
        return None
    return next((line.split(":", 1)[1].strip() for line in lines if line.startswith("model name")), None)


def machine_info(device: torch.device) -> dict[str, Any]:
    info: dict[str, Any] = dict(machine_description(device))
    info["cpu_model"] = cpu_model()
    info["load_average"] = [round(x, 2) for x in os.getloadavg()] if hasattr(os, "getloadavg") else None
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


def not_measured(reason: str | None) -> str:
    return f"**Not yet measured.** {reason or ''}".rstrip()


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
    """A path as the report prints it: relative to the repository when inside it."""
    resolved = path.resolve()
    return resolved.relative_to(REPO_ROOT).as_posix() if resolved.is_relative_to(REPO_ROOT) else str(path)


def rel(ctx: Context, path: Path) -> str:
    return path.relative_to(ctx.out).as_posix()


# --- models for Figure 4 and speed ----------------------------------------------------------------------


@dataclass
class CapsuleModel:
    """A capsule network behind numpy calls, from a model directory (ONNX Runtime) or a checkpoint (PyTorch)."""

    source: str
    backend: str
    trained: bool
    input_shape: tuple[int, int, int]
    classify: Callable[[np.ndarray], tuple[np.ndarray, np.ndarray]]  # images -> scores (N, K), poses (N, K, D)
    decode: Callable[[np.ndarray, np.ndarray], np.ndarray] | None  # poses (N, K, D), mask (N, K) -> images


def ort_session(model: str | bytes, provider: str = "CPUExecutionProvider", threads: int | None = None) -> Any:
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.intra_op_num_threads = threads or torch.get_num_threads()
    options.log_severity_level = 3
    return ort.InferenceSession(model, sess_options=options, providers=[provider])


def read_card(model_dir: Path) -> dict[str, Any]:
    card: dict[str, Any] = json.loads((model_dir / "model.json").read_text())
    return card


def model_from_dir(model_dir: Path) -> CapsuleModel:
    card = read_card(model_dir)
    names = {o["role"]: o["name"] for o in card["outputs"]}
    if "poses" not in names:
        raise NotMeasured(f"{model_dir}: the card has no poses output")
    session = ort_session(str(model_dir / "capsnet.onnx"))
    input_name = card["input"]["name"]

    def classify(images: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        scores, poses = session.run([card["scores"]["output"], names["poses"]], {input_name: images})
        return scores, poses

    decode = None
    if card.get("decoder"):
        spec = card["decoder"]
        dec = ort_session(str(model_dir / spec["file"]))
        pose_in, mask_in = (i["name"] for i in spec["inputs"])

        def decode(poses: np.ndarray, mask: np.ndarray) -> np.ndarray:
            (out,) = dec.run([spec["output"]["name"]], {pose_in: poses, mask_in: mask})
            return np.asarray(out)

    trained = (card.get("metrics") or {}).get("mnist_test_error") is not None
    shape = tuple(card["input"]["shape"][1:])
    return CapsuleModel(shown(model_dir), "onnxruntime", trained, shape, classify, decode)


def model_from_checkpoint(path: Path) -> CapsuleModel:
    from model.capsnet import CapsNet, capsule_length
    from training.checkpoint import load_model

    model, _, state = load_model(path)
    if not isinstance(model, CapsNet):
        raise NotMeasured(f"{path}: Figure 4 needs a CapsNet with a decoder, the checkpoint holds {state['arch']!r}")
    cfg = model.cfg

    def classify(images: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        with torch.no_grad():
            poses, _ = model.encode(torch.from_numpy(images))
            return capsule_length(poses).numpy(), poses.numpy()

    def decode(poses: np.ndarray, mask: np.ndarray) -> np.ndarray:
        with torch.no_grad():
            return model.decode(torch.from_numpy(poses), torch.from_numpy(mask)).numpy()

    shape = (cfg.in_channels, cfg.image_size, cfg.image_size)
    return CapsuleModel(shown(path), "pytorch", True, shape, classify, decode if model.decoder else None)


def zoo_models(ctx: Context) -> list[Path]:
    return sorted(p.parent for p in ctx.zoo.glob("*/model.json"))


def fresh_model_dir(ctx: Context) -> Path:
    """An untrained CapsNet of the run's preset, exported with capsnet-export's library call (cached per run)."""
    key = ctx.sizes.preset
    if key in ctx.fresh:
        return ctx.fresh[key]
    try:
        from training.export import export_module
    except ImportError as e:
        raise NotMeasured(f"training.export is not available to export a model ({e})") from e
    arch = get_architecture("dynamic")
    config = arch.make_config(ctx.sizes.preset, {})
    torch.manual_seed(ctx.seed)
    out = ctx.scratch / f"fresh-{key}"
    export_module(arch.build(config), "dynamic", config, out, name=f"fresh-{key}", torchscript=False, seed=ctx.seed)
    ctx.fresh[key] = out
    return out


def capsule_model(ctx: Context, need_decoder: bool) -> CapsuleModel:
    """--model, else the first bundled dynamic-routing model (with a decoder when needed), else (tiny) a fresh one."""
    if ctx.model is not None:
        if ctx.model.is_dir():
            return model_from_dir(ctx.model)
        return model_from_checkpoint(ctx.model)
    for d in zoo_models(ctx):
        card = read_card(d)
        if card.get("architecture") == "dynamic" and (card.get("decoder") or not need_decoder):
            return model_from_dir(d)
    if ctx.tiny:
        return model_from_dir(fresh_model_dir(ctx))
    raise NotMeasured(f"no trained dynamic-routing model in {ctx.zoo}; bundle one with capsnet-export or pass --model")


# --- 1. bundled models ------------------------------------------------------------------------------------


def run_mnist_models(ctx: Context) -> tuple[dict[str, Any], dict[str, np.ndarray]]:
    models = []
    test = None
    for d in zoo_models(ctx):
        card = read_card(d)
        metrics = card.get("metrics") or {}
        entry: dict[str, Any] = {
            "name": card.get("name", d.name),
            "directory": shown(d),
            "architecture": card.get("architecture"),
            "routing": card.get("routing"),
            "parameters": card.get("parameters"),
            "decoder": bool(card.get("decoder")),
            "card_test_error": metrics.get("mnist_test_error"),
            "card_n": metrics.get("n"),
            "evaluation": None,
            "evaluation_error": None,
        }
        try:
            from training.onnx_eval import evaluate_model_dir

            test = test if test is not None else ctx.split("test")
            entry["evaluation"] = evaluate_model_dir(d, test)
        except NotMeasured as e:
            entry["evaluation_error"] = str(e)
        except ImportError as e:
            entry["evaluation_error"] = f"training.onnx_eval is not available: {e}"
        except (ValueError, FileNotFoundError, OSError) as e:
            entry["evaluation_error"] = f"{type(e).__name__}: {e}"
        models.append(entry)
    return {"zoo": shown(ctx.zoo), "models": models}, {}


def render_mnist_models(ctx: Context, saved: Saved | None, reason: str | None) -> str:
    out = ["## 1. MNIST test error of the bundled models", ""]
    paper_rows = [
        [
            f"{name} (paper)",
            routing,
            recon,
            f"{err:.2f}%{(' ' + std) if std else ''}",
            "—",
            "10,000",
            "Sabour et al. 2017",
        ]
        for name, routing, recon, err, std in PAPER_MNIST
    ]
    headers = ["model", "routing", "reconstruction", "test error", "card says", "n", "source"]
    if saved is None:
        return "\n".join([*out, not_measured(reason), "", "Papers' figures:", "", md_table(headers, paper_rows), ""])
    rows, figs = [], []
    for m in saved.result["models"]:
        routing = m.get("routing") or {}
        variant = f" ({routing['variant']})" if routing.get("variant") else ""
        ev = m.get("evaluation")
        error = ev["test_error"] if ev else m.get("card_test_error")
        n = ev["n"] if ev else m.get("card_n")
        source = "ONNX Runtime, this run" if ev else ("model card" if error is not None else "—")
        rows.append(
            [
                m["name"],
                f"{routing.get('algorithm')}{variant}, {routing.get('iterations')} iterations",
                "yes" if m.get("decoder") else "no",
                pct(error),
                pct(m.get("card_test_error")) if ev else "",
                f"{n:,}" if n else "—",
                source,
            ]
        )
        if ev and ev.get("confusion_matrix"):
            path = ctx.figures / f"confusion_{m['name']}.png"
            confusion_figure(path, np.asarray(ev["confusion_matrix"]), f"{m['name']}: errors by class")
            figs.append(f"![confusion matrix of {m['name']}]({rel(ctx, path)})")
        elif m.get("evaluation_error"):
            figs.append(f"- {m['name']}: confusion matrix not measured: {m['evaluation_error']}")
    if not rows:
        out += [f"No bundled models in `{saved.result['zoo']}` yet (write one with `capsnet-export`).", ""]
    out += [md_table(headers, rows + paper_rows), "", provenance(saved), "", *figs, ""]
    return "\n".join(out)


# --- 2. baseline CNN on MNIST -----------------------------------------------------------------------------


def train_config(ctx: Context, arch: str, **overrides: Any) -> TrainConfig:
    s = ctx.sizes
    base = TrainConfig(
        arch=arch, preset=s.preset, epochs=s.epochs, batch_size=s.batch_size, seed=ctx.seed, device=str(ctx.device),
        train_subset=s.train_subset, test_subset=s.test_subset, eval_batch_size=s.eval_batch_size, amp=ctx.amp,
    )  # fmt: skip
    return replace(base, **overrides)


def resumable_trainer(ctx: Context, name: str, cfg: TrainConfig) -> Trainer:
    """A Trainer for `name`, continued from <runs>/<name>/last.pt when an earlier call left one."""
    out = ctx.run_dir(name)
    last = out / "last.pt" if out is not None else None
    resume = str(last) if last is not None and last.is_file() else None
    if resume:
        log.info("continuing %s from %s", name, resume)
    try:
        return Trainer(cfg, ctx.data_dir, out, resume=resume, strict_resume=True)
    except CheckpointMismatch as e:
        raise NotMeasured(str(e)) from e


def run_baseline(ctx: Context) -> tuple[dict[str, Any], dict[str, np.ndarray]]:
    ctx.split("test")  # fail early without data
    cfg = train_config(ctx, "baseline")  # same data and augmentation as CapsNet: shifts of up to 2 px
    ctx.check_budget("baseline-mnist", None, cfg.epochs, None)
    trainer = resumable_trainer(ctx, "baseline-mnist", cfg)
    already = trainer.epoch
    history = trainer.fit(ctx.deadline)
    for row in history[already:]:
        ctx.trained(row["seconds"])
    if not trainer.finished:
        ctx.check_budget("baseline-mnist", trainer.epoch, cfg.epochs, math.inf)
    final = evaluate_torch(trainer.model, trainer.arch, trainer.test_split, trainer.device, cfg.eval_batch_size)
    result = {
        "train_config": asdict(cfg),
        "model_config": trainer.model_config,
        "parameters": count_parameters(trainer.model),
        "history": history,
        "final": final.to_dict(),
    }
    return result, {}


def render_baseline(ctx: Context, saved: Saved | None, reason: str | None) -> str:
    out = ["## 2. The paper's baseline CNN on MNIST", ""]
    out += [
        "Three 5×5 convolutions (256, 256, 128 channels, stride 1, 'same' padding, ReLU, no pooling), fully "
        "connected layers of 328 and 192 units, dropout 0.5, a 10-way softmax with cross entropy "
        "(`model/baseline.py`, arch `baseline`); 35.4M parameters as in the paper. Trained by `training.train` "
        "with CapsNet's data and augmentation (random shifts of up to 2 pixels), Adam, lr 0.001 decaying by "
        "0.96 per epoch.",
        "",
    ]
    if saved is None:
        return "\n".join([*out, not_measured(reason), "", "The paper: 0.39% test error.", ""])
    r = saved.result
    final = r["final"]
    rows = [
        ["baseline CNN (this run)", f"{r['parameters']:,}", r["train_config"]["epochs"], pct(final["test_error"])],
        ["baseline CNN (Sabour et al. 2017)", "35.4M", "—", "0.39%"],
    ]
    curve = ctx.figures / "baseline_curve.png"
    draw_curve(r["history"], curve)
    cm = ctx.figures / "confusion_baseline.png"
    confusion_figure(cm, np.asarray(final["confusion_matrix"]), "baseline CNN: errors by class")
    out += [md_table(["model", "parameters", "epochs", "MNIST test error"], rows), "", provenance(saved), ""]
    out += [f"![baseline training curve]({rel(ctx, curve)}) ![baseline confusion]({rel(ctx, cm)})", ""]
    return "\n".join(out)


# --- 3. affine robustness ---------------------------------------------------------------------------------


def epoch_row(epoch: int, stats: dict[str, float], mnist: EvalResult, affine: EvalResult) -> dict[str, Any]:
    return {
        "epoch": epoch,
        "train_loss": round(stats["train_loss"], 6),
        "train_accuracy": round(stats["train_accuracy"], 6),
        "mnist_accuracy": 1.0 - mnist.test_error,
        "affine_accuracy": 1.0 - affine.test_error,
        "n": mnist.n,
    }


def match_accuracy(histories: dict[str, list[dict[str, Any]]]) -> dict[str, Any]:
    """The highest MNIST accuracy every model reaches, and each model's first epoch at or above it (§5.2)."""
    target = min(max(row["mnist_accuracy"] for row in rows) for rows in histories.values())
    picks = {arch: next(row for row in rows if row["mnist_accuracy"] >= target) for arch, rows in histories.items()}
    return {"target_mnist_accuracy": target, "picks": picks}


def run_affine(ctx: Context) -> tuple[dict[str, Any], dict[str, np.ndarray]]:
    test = ctx.split("test")
    ranges = AffineRanges()
    affine = affine_digits(test.images, test.labels, AFFINE_TEST_SEED + ctx.seed, ranges)
    histories: dict[str, list[dict[str, Any]]] = {}
    models: dict[str, dict[str, Any]] = {}
    for arch in ("dynamic", "baseline"):
        cfg = train_config(ctx, arch, canvas=AFFINE_CANVAS, max_shift=AFFINE_SHIFT)
        name = f"affine-{arch}"
        ctx.check_budget(name, None, cfg.epochs, None)
        trainer = resumable_trainer(ctx, name, cfg)  # its history holds the rows below
        last_seconds: float | None = None
        while not trainer.finished:
            ctx.check_budget(name, trainer.epoch, cfg.epochs, last_seconds)
            start = time.perf_counter()
            stats = trainer.train_epoch()
            trainer.epoch += 1
            mnist = evaluate_torch(trainer.model, trainer.arch, trainer.test_split, trainer.device, cfg.eval_batch_size)
            aff = evaluate_torch(trainer.model, trainer.arch, affine.split, trainer.device, cfg.eval_batch_size)
            last_seconds = time.perf_counter() - start
            ctx.trained(last_seconds)
            trainer.history.append({**epoch_row(trainer.epoch, stats, mnist, aff), "seconds": round(last_seconds, 2)})
            trainer.save_last()
            log.info("affine %s epoch %d: %s", arch, trainer.epoch, trainer.history[-1])
        histories[arch] = trainer.history
        models[arch] = {
            "train_config": asdict(cfg),
            "model_config": trainer.model_config,
            "parameters": count_parameters(trainer.model),
        }
    k = ctx.sizes.examples
    shifted, _ = shifted_on_canvas(test.images[:k], ctx.seed)
    arrays = {
        "centred": center_on_canvas(test.images[:k])[:, 0],
        "shifted": shifted[:, 0],
        "affine": affine.images[:k, 0],
    }
    result = {
        "ranges": asdict(ranges),
        "test_seed": AFFINE_TEST_SEED + ctx.seed,
        "models": models,
        "histories": histories,
        "matched": match_accuracy(histories),
    }
    return result, arrays


def render_affine(ctx: Context, saved: Saved | None, reason: str | None) -> str:
    r = AffineRanges()
    out = [
        "## 3. Robustness to affine transformations (affNIST rebuilt)",
        "",
        "affNIST itself is not available here, so `training.generators.affine_digits` rebuilds it from the "
        f"MNIST test set, one seeded transformation per digit on a {r.canvas}×{r.canvas} canvas: rotation "
        f"θ ∈ [−{r.max_rotation_deg:g}°, {r.max_rotation_deg:g}°], horizontal shear k ∈ [−{r.max_shear:g}, "
        f"{r.max_shear:g}], scale sx, sy ∈ [{r.min_scale:g}, {r.max_scale:g}] independently (all uniform; "
        "A = R(θ)·Sh(k)·diag(sx, sy) about the centre of the ink), then a translation uniform over every "
        "position that keeps the transformed digit inside the canvas; bilinear resampling.",
        "",
        "Training protocol (both models): MNIST training digits centred on 40×40 and shifted by up to "
        f"±{AFFINE_SHIFT} pixels per axis (`capsnet-train --canvas 40 --max-shift {AFFINE_SHIFT}`), i.e. placed "
        "uniformly anywhere on the canvas; nothing else. MNIST accuracy is measured on the test digits centred "
        "on 40×40 (affNIST's untransformed set). Both models are evaluated after every epoch, and each is "
        "compared at its first epoch reaching the highest MNIST accuracy both reach (the paper compares "
        "CapsNet at 99.23% with the baseline at 99.22%).",
        "",
    ]
    if saved is None:
        paper = ", ".join(f"{k} {v:.0f}%" for k, v in PAPER_AFFINE.items())
        return "\n".join([*out, not_measured(reason), "", f"The paper's affNIST accuracy: {paper}.", ""])
    res = saved.result
    matched = res["matched"]
    names = {"dynamic": "CapsNet", "baseline": "Baseline CNN"}
    rows = []
    for arch, pick in matched["picks"].items():
        rows.append(
            [
                names.get(arch, arch),
                f"{res['models'][arch]['parameters']:,}",
                pick["epoch"],
                pct(pick["mnist_accuracy"]),
                pct(pick["affine_accuracy"]),
                f"{PAPER_AFFINE[names[arch]]:.0f}%" if arch in names else "—",
            ]
        )
    headers = ["model", "parameters", "epoch", "MNIST (40×40) accuracy", "affine accuracy", "paper (affNIST)"]
    out += [md_table(headers, rows), "", f"Matched MNIST accuracy: {pct(matched['target_mnist_accuracy'])}.", ""]
    out += [provenance(saved), ""]
    curve = ctx.figures / "affine_vs_mnist.png"
    with figure(curve, figsize=(5, 4)) as fig:
        ax = fig.subplots()
        for arch, hist in res["histories"].items():
            ax.plot([100 * h["mnist_accuracy"] for h in hist], [100 * h["affine_accuracy"] for h in hist], "o-",
                    label=names.get(arch, arch))  # fmt: skip
        ax.set(xlabel="MNIST (40×40) test accuracy (%)", ylabel="affine test accuracy (%)", title="one point per epoch")
        ax.legend()
    out.append(f"![affine accuracy against MNIST accuracy]({rel(ctx, curve)})")
    if saved.arrays:
        grid = np.stack([saved.arrays["centred"], saved.arrays["shifted"], saved.arrays["affine"]])
        path = ctx.figures / "affine_examples.png"
        image_grid(
            path, grid, "test digits: centred, shifted (training protocol), affine", ["centred", "shifted", "affine"]
        )
        out.append(f"![affine examples]({rel(ctx, path)})")
    return "\n".join([*out, ""])


# --- 4. MultiMNIST ----------------------------------------------------------------------------------------


def run_multimnist(ctx: Context) -> tuple[dict[str, Any], dict[str, np.ndarray]]:
    train, test = ctx.split("train"), ctx.split("test")
    s = ctx.sizes
    cfg = MultiMNISTConfig(
        preset=s.preset, epochs=s.epochs, batch_size=s.batch_size, seed=ctx.seed,
        test_pairs_per_digit=s.multimnist_test_pairs, eval_batch_size=s.eval_batch_size,
    )  # fmt: skip
    ctx.check_budget("multimnist", None, cfg.epochs, None)
    out = ctx.run_dir("multimnist")
    try:
        model, history, test_data = train_multimnist(
            cfg, train, test, ctx.device, out / "last.pt" if out is not None else None, ctx.deadline
        )
    except CheckpointMismatch as e:
        raise NotMeasured(str(e)) from e
    if len(history) < cfg.epochs:  # (the last training section: no later model needs ctx.trained())
        ctx.check_budget("multimnist", len(history), cfg.epochs, math.inf)
    examples = reconstruction_examples(model, test_data, ctx.device, 2 * s.examples)
    result = {
        "config": asdict(cfg),
        "model_config": model.cfg.to_dict(),
        "parameters": count_parameters(model),
        "history": history,
        "test_error": history[-1]["test_error"] if history else None,
        "test_n": history[-1]["test_n"] if history else 0,
    }
    return result, examples


def overlay(red: np.ndarray, green: np.ndarray) -> np.ndarray:
    """Two gray images (..., H, W) -> RGB (..., H, W, 3): the first in red, the second in green (Figure 5)."""
    return np.stack([red, green, np.zeros_like(red)], axis=-1)


def render_multimnist(ctx: Context, saved: Saved | None, reason: str | None) -> str:
    out = [
        "## 4. MultiMNIST",
        "",
        "`training.generators.multimnist` (the paper's §6): every MNIST digit is overlaid with a digit of a "
        "different class from the same split, each placed on 36×36 with a shift of up to ±4 pixels per axis, "
        "combined by pixel-wise max. A CapsNet (the MNIST architecture on 36×36 input) is trained on fresh "
        "composites each epoch with the margin loss for both classes (`margin_loss_multi`) and the "
        "reconstruction loss of each digit decoded from its own capsule. An image counts as correct only when "
        "its two longest capsules are exactly its two classes.",
        "",
    ]
    if saved is None:
        paper = ", ".join(f"{k} {v:.1f}%" for k, v in PAPER_MULTIMNIST.items())
        return "\n".join([*out, not_measured(reason), "", f"The paper's error: {paper}.", ""])
    r = saved.result
    rows = [
        ["CapsNet (this run)", f"{r['parameters']:,}", r["config"]["epochs"], pct(r["test_error"]), f"{r['test_n']:,}"],
        *[[f"{k} (paper)", "—", "—", f"{v:.1f}%", "—"] for k, v in PAPER_MULTIMNIST.items()],
    ]
    out += [md_table(["model", "parameters", "epochs", "two-digit error", "test composites"], rows), ""]
    out += [provenance(saved), ""]
    a = saved.arrays
    if a:
        n = len(a["inputs"])
        cols = [
            np.repeat(a["inputs"][..., None], 3, axis=-1),
            overlay(a["targets"][:, 0], a["targets"][:, 1]),
            overlay(a["recon_true"][:, 0], a["recon_true"][:, 1]),
            overlay(a["recon_pred"][:, 0], a["recon_pred"][:, 1]),
        ]
        grid = np.stack(cols, axis=1)  # (n, 4, S, S, 3)
        labels = [
            f"L {a['labels'][i][0]},{a['labels'][i][1]}  R {a['predictions'][i][0]},{a['predictions'][i][1]}"
            for i in range(n)
        ]
        path = ctx.figures / "multimnist_reconstructions.png"
        image_grid(
            path,
            grid,
            "Figure 5 style: the input, its two digits (red, green),\n"
            "and each digit reconstructed from the true labels L and from the predicted labels R",
            labels,
            ["input", "digits", "recon (L)", "recon (R)"],
        )
        out += [f"![MultiMNIST reconstructions]({rel(ctx, path)})", ""]
    return "\n".join(out)


# --- 5. Figure 4: dimension perturbations -----------------------------------------------------------------


def perturbation_grid(
    poses: np.ndarray, cls: int, decode: Callable[[np.ndarray, np.ndarray], np.ndarray], values: np.ndarray
) -> np.ndarray:
    """Decode one image's poses (K, D) with dimension d of class `cls` moved by each value -> (D, V, H, W) in [0, 1]."""
    k, d = poses.shape
    batch = np.repeat(poses[None], d * len(values), axis=0).astype(np.float32)  # (D·V, K, D)
    rows = np.repeat(np.arange(d), len(values))
    batch[np.arange(d * len(values)), cls, rows] += np.tile(values, d).astype(np.float32)
    mask = np.zeros((d * len(values), k), dtype=np.float32)
    mask[:, cls] = 1.0
    images = np.asarray(decode(batch, mask))
    side = round(float(np.sqrt(images[0].size)))
    return images.reshape(d, len(values), side, side)


def pick_examples(scores: np.ndarray, labels: np.ndarray, num_classes: int) -> tuple[list[int], list[bool]]:
    """For each class, the first test image of it the model gets right (else the first of it; -1 if none)."""
    predicted = scores.argmax(axis=1)
    picks, correct = [], []
    for k in range(num_classes):
        right = np.flatnonzero((labels == k) & (predicted == k))
        any_k = np.flatnonzero(labels == k)
        idx = int(right[0]) if right.size else (int(any_k[0]) if any_k.size else -1)
        picks.append(idx)
        correct.append(bool(right.size))
    return picks, correct


def run_perturbation(ctx: Context) -> tuple[dict[str, Any], dict[str, np.ndarray]]:
    test = ctx.split("test").subset(2000)
    model = capsule_model(ctx, need_decoder=True)
    if model.decode is None:
        raise NotMeasured(f"{model.source} has no decoder")
    images = to_float(test.images)
    size = model.input_shape[-1]
    if size != images.shape[-1]:
        images = center_on_canvas(test.images, size).astype(np.float32) / 255.0
    scores, poses = model.classify(images)
    picks, correct = pick_examples(scores, test.labels, scores.shape[1])
    grids = np.zeros((scores.shape[1], poses.shape[2], len(PERTURBATIONS), size, size), dtype=np.uint8)
    for k, idx in enumerate(picks):
        if idx >= 0:
            grid = perturbation_grid(poses[idx], k, model.decode, PERTURBATIONS)
            grids[k] = np.clip(np.rint(grid * 255), 0, 255).astype(np.uint8)
    result = {
        "model": model.source,
        "backend": model.backend,
        "trained": model.trained,
        "values": PERTURBATIONS.tolist(),
        "test_indices": picks,
        "correctly_classified": correct,
    }
    return result, {"grids": grids, "originals": (images[[max(i, 0) for i in picks], 0] * 255).astype(np.uint8)}


def render_perturbation(ctx: Context, saved: Saved | None, reason: str | None) -> str:
    out = [
        "## 5. What the capsule dimensions encode (the paper's Figure 4)",
        "",
        "For each class, the first test digit of that class the model classifies correctly is encoded; each of "
        "the 16 dimensions of its class capsule is moved by −0.25 … 0.25 in steps of 0.05 and decoded with "
        "the other classes masked (from `decoder.onnx` with ONNX Runtime, or from a checkpoint).",
        "",
    ]
    if saved is None:
        return "\n".join([*out, not_measured(reason), ""])
    r = saved.result
    out += [f"Model: `{r['model']}` ({r['backend']}).", ""]
    if not r["trained"]:
        out += ["**This model is untrained** (a smoke-test export): the grids show the plumbing, not what "
                "trained capsules encode.", ""]  # fmt: skip
    out += [provenance(saved), ""]
    grids = saved.arrays.get("grids")
    if grids is None:
        return "\n".join(out)
    values = [f"{v + 0.0:+.2f}" for v in r["values"]]  # + 0.0: no "-0.00"
    for k in range(grids.shape[0]):
        idx = r["test_indices"][k]
        if idx < 0:
            out.append(f"- class {k}: no test digit of this class")
            continue
        path = ctx.figures / f"perturbation_class{k}.png"
        note = "" if r["correctly_classified"][k] else " (misclassified: no correct example)"
        image_grid(path, grids[k], f"class {k}, test image {idx}{note}", [f"dim {d}" for d in range(grids.shape[1])],
                   values)  # fmt: skip
        out.append(f"![Figure 4, class {k}]({rel(ctx, path)})")
    return "\n".join([*out, ""])


# --- speed ------------------------------------------------------------------------------------------------


@dataclass
class Timing:
    images_per_s: float
    p50_ms: float
    p99_ms: float
    reps: int


def time_calls(call: Callable[[], Any], batch: int, seconds: float, min_reps: int, warmup: int = 2) -> Timing:
    """Latency of each call (which must block until its result is ready), repeated for `seconds` or min_reps."""
    for _ in range(warmup):
        call()
    latencies: list[float] = []
    start = time.perf_counter()
    while len(latencies) < min_reps or time.perf_counter() - start < seconds:
        t0 = time.perf_counter()
        call()
        latencies.append(time.perf_counter() - t0)
    lat = np.asarray(latencies)
    return Timing(
        images_per_s=batch * len(lat) / float(lat.sum()),
        p50_ms=float(np.percentile(lat, 50) * 1e3),
        p99_ms=float(np.percentile(lat, 99) * 1e3),
        reps=len(lat),
    )


def model_flops(model: torch.nn.Module, forward: Callable[[torch.Tensor], Any], shape: tuple[int, ...]) -> int:
    """Floating-point operations of one image's forward pass (convolutions and matrix products), by torch."""
    from torch.utils.flop_counter import FlopCounterMode

    counter = FlopCounterMode(display=False)
    with counter, torch.no_grad():
        forward(torch.rand(1, *shape))
    return int(counter.get_total_flops())


def matmul_onnx(n: int) -> bytes:
    from onnx import TensorProto, helper

    a, b, c = (helper.make_tensor_value_info(x, TensorProto.FLOAT, [n, n]) for x in "abc")
    graph = helper.make_graph([helper.make_node("MatMul", ["a", "b"], ["c"])], "matmul", [a, b], [c])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)])
    model.ir_version = 9
    return bytes(model.SerializeToString())


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def runtimes() -> list[str]:
    import onnxruntime as ort

    names = ["pytorch-eager-cpu", "onnxruntime-cpu"]
    if torch.cuda.is_available():
        names.append("pytorch-eager-cuda")
        if "CUDAExecutionProvider" in ort.get_available_providers():
            names.append("onnxruntime-cuda")
    return names


def runtime_calls(
    runtime: str, model_dir: Path, card: dict[str, Any], model: torch.nn.Module
) -> tuple[Callable[[np.ndarray], Callable[[], Any]], Callable[[int], Callable[[], Any]]] | None:
    """(images -> model call, n -> n x n matmul call) for one runtime; None where it does not run here."""
    arch = get_architecture(card["architecture"])
    if runtime.startswith("pytorch"):
        device = torch.device("cuda" if runtime.endswith("cuda") else "cpu")
        net = copy.deepcopy(model).to(device).eval()

        def model_call(images: np.ndarray) -> Callable[[], Any]:
            x = torch.from_numpy(images).to(device)

            def call() -> Any:
                with torch.inference_mode():
                    out = arch.forward(net, x, None)
                sync(device)
                return out

            return call

        def matmul_call(n: int) -> Callable[[], Any]:
            a, b = torch.rand(n, n, device=device), torch.rand(n, n, device=device)

            def call() -> Any:
                c = a @ b
                sync(device)
                return c

            return call

        return model_call, matmul_call
    provider = "CUDAExecutionProvider" if runtime.endswith("cuda") else "CPUExecutionProvider"
    session = ort_session(str(model_dir / "capsnet.onnx"), provider)
    if session.get_providers()[0] != provider:
        return None

    def ort_model_call(images: np.ndarray) -> Callable[[], Any]:
        feed = {card["input"]["name"]: images}
        return lambda: session.run(None, feed)

    def ort_matmul_call(n: int) -> Callable[[], Any]:
        s = ort_session(matmul_onnx(n), provider)
        feed = {"a": np.random.rand(n, n).astype(np.float32), "b": np.random.rand(n, n).astype(np.float32)}
        return lambda: s.run(None, feed)

    return ort_model_call, ort_matmul_call


def run_speed(ctx: Context) -> tuple[dict[str, Any], dict[str, np.ndarray]]:
    s = ctx.sizes
    if ctx.model is not None and ctx.model.is_dir():
        model_dir = ctx.model
    else:
        bundled = [d for d in zoo_models(ctx) if read_card(d).get("architecture") == "dynamic"]
        model_dir = bundled[0] if bundled else fresh_model_dir(ctx)
    card = read_card(model_dir)
    arch = get_architecture(card["architecture"])
    torch.manual_seed(ctx.seed)
    net = arch.build(card["model_config"]).eval()  # random weights: the speed does not depend on them
    shape = tuple(card["input"]["shape"][1:])
    flops = model_flops(net, lambda x: arch.forward(net, x, None), shape)
    rng = np.random.default_rng(ctx.seed)
    rows, matmul, skipped = [], {}, {}
    for runtime in runtimes():
        calls = runtime_calls(runtime, model_dir, card, net)
        if calls is None:
            skipped[runtime] = "the provider did not load"
            continue
        model_call, matmul_call = calls
        mm = time_calls(matmul_call(s.matmul_size), 1, s.speed_seconds, s.speed_min_reps)
        matmul[runtime] = 2 * s.matmul_size**3 * mm.images_per_s / 1e9  # GFLOP/s of one n x n product
        for batch in s.batches:
            images = rng.random((batch, *shape), dtype=np.float32)
            t = time_calls(model_call(images), batch, s.speed_seconds, s.speed_min_reps)
            achieved = flops * t.images_per_s / 1e9
            rows.append({
                "runtime": runtime, "batch": batch, **asdict(t),
                "gflops": achieved, "fraction_of_matmul": achieved / matmul[runtime],
            })  # fmt: skip
            log.info("speed %s batch %d: %.1f images/s", runtime, batch, t.images_per_s)
    result = {
        "model": shown(model_dir),
        "model_name": card.get("name"),
        "input_shape": list(shape),
        "flops_per_image": flops,
        "matmul_size": s.matmul_size,
        "matmul_gflops": matmul,
        "threads": torch.get_num_threads(),
        "rows": rows,
        "skipped": skipped,
    }
    return result, {}


def render_speed(ctx: Context, saved: Saved | None, reason: str | None) -> str:
    out = [
        "## 6. Speed",
        "",
        "One process measures every runtime: PyTorch eager and ONNX Runtime on the CPU, and on CUDA where a GPU "
        "is present, at batch 1, 8, 32, 128 and 256 (images/s over all calls; p50 and p99 latency of one call). "
        "Achieved GFLOP/s is the model's floating-point work per image (convolutions and matrix products, "
        "counted by `torch.utils.flop_counter`) times images/s; it is divided by the GFLOP/s of a large square "
        "float32 matrix product measured in the same process and runtime, the machine's practical limit. ONNX "
        "Runtime is fed numpy arrays, so its CUDA figures include the host-device copies; PyTorch and ONNX Runtime "
        "use the same number of CPU threads.",
        "",
    ]
    if saved is None:
        return "\n".join([*out, not_measured(reason), ""])
    r = saved.result
    m = saved.machine
    gpu = f"; GPU: {m['gpu']}" if m.get("gpu") else "; no GPU"
    cpu = m.get("cpu_model") or m.get("processor")
    out += [
        f"Model: `{r['model_name']}` ({r['model']}), input {r['input_shape']}, "
        f"{r['flops_per_image'] / 1e6:,.1f} MFLOP per image. Machine: {cpu}, {m.get('cpu_count')} CPUs, "
        f"{r['threads']} threads{gpu}; {busy_note(m)}.",
        "",
    ]
    headers = ["runtime", "batch", "images/s", "p50 (ms)", "p99 (ms)", "calls", "GFLOP/s", "of matmul GFLOP/s"]
    rows = [
        [x["runtime"], x["batch"], f"{x['images_per_s']:,.1f}", f"{x['p50_ms']:.2f}", f"{x['p99_ms']:.2f}",
         x["reps"], f"{x['gflops']:.2f}", f"{100 * x['fraction_of_matmul']:.1f}%"]
        for x in r["rows"]
    ]  # fmt: skip
    out += [md_table(headers, rows), ""]
    mm = [[k, f"{v:,.1f}"] for k, v in r["matmul_gflops"].items()]
    out += [md_table([f"runtime ({r['matmul_size']}×{r['matmul_size']} matmul)", "GFLOP/s"], mm), ""]
    for runtime, why in r.get("skipped", {}).items():
        out.append(f"- {runtime}: not measured ({why}).")
    if not any(k.endswith("cuda") for k in r["matmul_gflops"]):
        out.append("- CUDA: not measured (no GPU on the machine that produced this section).")
    path = ctx.figures / "speed.png"
    with figure(path, figsize=(5.5, 4)) as fig:
        ax = fig.subplots()
        for runtime in dict.fromkeys(x["runtime"] for x in r["rows"]):
            pts = [x for x in r["rows"] if x["runtime"] == runtime]
            ax.plot([x["batch"] for x in pts], [x["images_per_s"] for x in pts], "o-", label=runtime)
        ax.set(xscale="log", yscale="log", xlabel="batch size", ylabel="images/s", title="inference throughput")
        ax.legend()
    out += ["", provenance(saved), "", f"![throughput by batch size]({rel(ctx, path)})", ""]
    return "\n".join(out)


def cell(value: Any) -> str:
    return f"{value:,.2f}" if isinstance(value, float) else str(value)


def dict_rows(rows: list[dict[str, Any]]) -> str:
    headers = list(dict.fromkeys(k for x in rows for k in x))
    return md_table(headers, [[cell(x.get(h, "")) for h in headers] for x in rows])


def render_service(ctx: Context) -> str:
    """The service issue's load benchmark (`python -m service.benchmark --json FILE`), when its JSON is here."""
    out = ["## 7. The service under load", ""]
    path = ctx.results / SERVICE_LOAD_FILE
    if not path.is_file():
        reason = (
            "The service's throughput and latency at concurrency 1–64 and its peak resident memory come from the "
            f"service's load benchmark: run `python -m service.benchmark --json {shown(path)}` and rerun this command."
        )
        return "\n".join([*out, not_measured(reason), ""])
    data = json.loads(path.read_text())
    if not isinstance(data, dict):
        return "\n".join([*out, not_measured(f"{shown(path)} is not the load benchmark's JSON object"), ""])
    produced = data.get("produced_at") or datetime.fromtimestamp(path.stat().st_mtime, timezone.utc).isoformat(
        timespec="seconds"
    )
    command = data.get("command") or "python -m service.benchmark"
    out += [f"_Produced {produced} by `{command}`, saved as `{rel(ctx, path)}`._", ""]
    tables = {"http": "HTTP service, one image per request, by concurrency", "raw": "ONNX Runtime alone, by batch"}
    for key, title in tables.items():
        rows = data.get(key)
        if isinstance(rows, list) and rows and all(isinstance(x, dict) for x in rows):
            out += [f"**{title}**", "", dict_rows(rows), ""]
    memory = {k: v for k, v in data.items() if "rss" in k.lower()}
    if isinstance(memory.get("server_peak_rss_mib"), int | float):
        out += [
            f"Peak resident memory of the service process under this load: {memory['server_peak_rss_mib']:.0f} MiB.",
            "",
        ]
    else:
        out += ["Peak resident memory of the service under load: **not yet measured** (not in the JSON).", ""]
    http = data.get("http")
    if (
        isinstance(http, list)
        and len(http) > 1
        and all(isinstance(r, dict) and "p50_ms" in r and "throughput" in r for r in http)
    ):
        chart = ctx.figures / "service_load.png"
        with figure(chart, figsize=(8, 3.2)) as fig:
            left, right = fig.subplots(1, 2)
            levels = [r["concurrency"] for r in http]
            left.plot(levels, [r["throughput"] for r in http], "o-", label="service")
            if all(isinstance(r.get("raw_throughput"), int | float) for r in http):
                left.plot(levels, [r["raw_throughput"] for r in http], "s--", label="ONNX Runtime alone, best batch")
            left.set(xscale="log", xlabel="concurrent clients", ylabel="images/s", ylim=(0, None))
            left.legend(fontsize=8)
            for key in ("p50_ms", "p99_ms"):
                if all(isinstance(r.get(key), int | float) for r in http):
                    right.plot(levels, [r[key] for r in http], "o-", label=key.replace("_ms", ""))
            right.set(xscale="log", yscale="log", xlabel="concurrent clients", ylabel="latency (ms)")
            right.legend(fontsize=8)
        out += [f"![service throughput and latency by concurrency]({rel(ctx, chart)})", ""]
    skip = {*tables, *memory, "command", "produced_at"}
    rest = {k: v for k, v in data.items() if k not in skip}
    out += ["```json", json.dumps(rest, indent=1), "```", ""]
    return "\n".join(out)


# --- the report -------------------------------------------------------------------------------------------

RUNNERS: dict[str, Callable[[Context], tuple[dict[str, Any], dict[str, np.ndarray]]]] = {
    "mnist_models": run_mnist_models,
    "baseline": run_baseline,
    "affine": run_affine,
    "multimnist": run_multimnist,
    "perturbation": run_perturbation,
    "speed": run_speed,
}
RENDERERS: dict[str, Callable[[Context, Saved | None, str | None], str]] = {
    "mnist_models": render_mnist_models,
    "baseline": render_baseline,
    "affine": render_affine,
    "multimnist": render_multimnist,
    "perturbation": render_perturbation,
    "speed": render_speed,
}


def plan(ctx: Context, selected: set[str], reuse: bool) -> dict[str, str]:
    """What happens to each section: "run", "reuse" (its saved result), or "missing"."""
    actions = {}
    for key in SECTIONS:
        has_saved = load_result(ctx, key) is not None
        if key in selected and not (reuse and has_saved):
            actions[key] = "run"
        else:
            actions[key] = "reuse" if has_saved else "missing"
    return actions


def build_report(ctx: Context, selected: set[str], reuse: bool) -> Path:
    """Run (or reuse) every section, draw the figures and write <out>/REPORT.md."""
    ctx.figures.mkdir(parents=True, exist_ok=True)
    parts = [
        "# Evaluation and benchmark report",
        "",
        f"Generated {now_utc()} by `{ctx.command}` at commit {git_commit() or 'unknown'}. Each section names the "
        "command and time that produced its numbers; “not yet measured” marks results that have not been "
        "produced yet. Nothing here is estimated or copied in, apart from the papers' figures, which are labelled.",
        "",
    ]
    if ctx.tiny:
        parts += [
            "> **TINY MODE**: tiny models on tiny synthetic inputs for one epoch. The numbers below test the "
            "pipeline and mean nothing about the models.",
            "",
        ]
    for key, action in plan(ctx, selected, reuse).items():
        saved, reason = None, None
        if action == "run":
            log.info("running section %s", key)
            busy = cpu_busy_percent()  # before the section's own threads start
            try:
                saved = save_result(ctx, key, *RUNNERS[key](ctx), busy=busy)
            except (NotMeasured, IDXError) as e:
                reason = str(e)
            except Unfinished as e:
                reason = f"In progress. {e}"
                ctx.unfinished.append(key)
                saved = load_result(ctx, key)  # an earlier complete result, if any, stays shown
                if saved is not None:
                    parts.append(RENDERERS[key](ctx, saved, None).rstrip())
                    parts += ["", f"> **{reason}** The figures above are from the earlier complete run.", ""]
                    continue
        elif action == "reuse":
            saved = load_result(ctx, key)
        else:
            reason = f"Run `python -m training.report --sections {key}` to produce it."
        parts.append(RENDERERS[key](ctx, saved, reason))
    parts.append(render_service(ctx))
    ctx.out.mkdir(parents=True, exist_ok=True)
    path = ctx.out / "REPORT.md"
    path.write_text("\n".join(parts).rstrip() + "\n")
    return path


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m training.report", description=__doc__.splitlines()[0])
    p.add_argument("--data-dir", default=None, help="MNIST IDX directory (default: $CAPSNET_DATA_DIR)")
    p.add_argument("--out", default="docs", help="where REPORT.md and report/ go (default: docs)")
    p.add_argument(
        "--zoo", default=str(REPO_ROOT / "model" / "zoo"), help="bundled model directories (default: model/zoo)"
    )
    p.add_argument(
        "--model",
        default=None,
        help="model directory or checkpoint for Figure 4, model directory for speed "
        "(default: the zoo's first dynamic-routing model)",
    )
    p.add_argument("--tiny", action="store_true", help="tiny models, one epoch, tiny speed runs (default: off)")
    p.add_argument("--reuse", action="store_true", help="reuse saved results instead of running again (default: off)")
    p.add_argument(
        "--sections",
        nargs="+",
        default=["all"],
        choices=[*SECTIONS, "all", "none"],
        help="sections to run; the others are rendered from saved results (default: all)",
    )
    p.add_argument("--epochs", type=int, default=None, help="epochs of every trained model (default: 30; tiny: 1)")
    p.add_argument("--device", default="auto", choices=["auto", "cpu", "cuda"], help="training device (default: auto)")
    p.add_argument(
        "--amp",
        action="store_true",
        help="bfloat16 convolutions when training, on CUDA or a CPU with native bfloat16 (default: off)",
    )
    p.add_argument(
        "--runs",
        default=None,
        help="keep checkpoints and metrics of trained models here, and continue from them (default: no)",
    )
    p.add_argument(
        "--max-minutes",
        type=float,
        default=None,
        help="time budget for the training sections (needs --runs): no epoch is started that would overrun "
        "it; the command then exits 3 and the same command continues (default: none)",
    )
    p.add_argument("--seed", type=int, default=0, help="random seed of training and generated data (default: 0)")
    p.add_argument("--dry-run", action="store_true", help="print what would run or be reused, write nothing")
    return p


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.model and not Path(args.model).exists():
        parser.error(f"--model {args.model}: no such model directory or checkpoint")
    if args.max_minutes is not None and (args.runs is None or not args.max_minutes > 0):
        parser.error("--max-minutes needs a positive number of minutes and --runs (where the progress is kept)")
    deadline = None if args.max_minutes is None else time.monotonic() + 60.0 * args.max_minutes
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    selected = set(SECTIONS) if "all" in args.sections else set(args.sections) - {"none"}
    sizes = Sizes.tiny() if args.tiny else Sizes()
    if args.epochs is not None:
        sizes = replace(sizes, epochs=args.epochs)
    try:
        data_dir: str | None = str(resolve_data_dir(args.data_dir))
    except IDXError:
        data_dir = None
    command = shlex.join(["python", "-m", "training.report", *(sys.argv[1:] if argv is None else argv)])
    with tempfile.TemporaryDirectory(prefix="capsnet-report-") as scratch:
        ctx = Context(
            out=Path(args.out), data_dir=data_dir, zoo=Path(args.zoo), model=Path(args.model) if args.model else None,
            sizes=sizes, tiny=args.tiny, device=resolve_device(args.device), seed=args.seed, command=command,
            scratch=Path(scratch), runs=Path(args.runs) if args.runs else None, amp=args.amp, deadline=deadline,
        )  # fmt: skip
        if args.dry_run:
            print(json.dumps({"data_dir": data_dir, "sections": plan(ctx, selected, args.reuse)}, indent=1))
            return 0
        path = build_report(ctx, selected, args.reuse)
    print(path)
    if ctx.unfinished:
        print(
            f"training.report: time budget spent; unfinished: {', '.join(ctx.unfinished)}. Run the same command "
            "again to continue.",
            file=sys.stderr,
        )
        return EXIT_UNFINISHED
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

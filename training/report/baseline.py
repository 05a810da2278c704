"""Section 2: the paper's baseline CNN trained on MNIST by the one training loop."""

from __future__ import annotations

import json
import logging
import math
from dataclasses import asdict
from pathlib import Path
from typing import Any

import numpy as np

from model.config import CapsNetConfig
from training.fitting.evaluate import evaluate_torch
from training.fitting.history import evaluated
from training.report.common import (
    Context,
    Saved,
    Section,
    confusion_figure,
    figure,
    md_table,
    not_measured,
    pct,
    provenance,
    rel,
    resumable_trainer,
    shown,
    train_config,
    train_images,
)
from training.report.compute import (
    CHECKPOINT_MINUTES,
    closing_note,
    compute_sentence,
    model_costs,
    progress,
    progress_line,
    trained_on,
)
from training.report.projection import outlook

log = logging.getLogger(__name__)

PAPER_ERROR = 0.0039  # the paper's baseline CNN on MNIST (Sabour et al. 2017, Table 1)
TARGET_ERROR = 0.006  # the report run's target: 0.60% test error on all 10,000 test digits


def capsnet_reference(path: Path, train_digits: int) -> dict[str, Any]:
    """CapsNet's MNIST curve to draw beside the baseline's: the rows of a capsnet-train metrics.jsonl.

    Each epoch trained on the 60,000 training digits less those held out for validation (`val_n`).
    """
    rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    keep = ("epoch", "test_error", "test_n", "val_n", "seconds", "train_loss")
    return {
        "source": shown(path),
        "history": [{k: row[k] for k in keep if k in row} for row in rows],
        "images_per_epoch": train_digits - int(rows[0].get("val_n", 0)) if rows else train_digits,
        **model_costs("dynamic", CapsNetConfig().to_dict(), (1, 28, 28)),
    }


def run_baseline(ctx: Context) -> tuple[dict[str, Any], dict[str, np.ndarray]]:
    ctx.split("test")  # fail early without data
    cfg = train_config(ctx, "baseline")  # same data and augmentation as CapsNet: shifts of up to 2 px
    ctx.check_budget("baseline-mnist", None, cfg.epochs, None)
    trainer = resumable_trainer(ctx, "baseline-mnist", cfg)
    already = trainer.epoch
    history = trainer.fit(ctx.deadline, CHECKPOINT_MINUTES)
    for row in history[already:]:
        ctx.trained(row["seconds"])
    result: dict[str, Any] = {
        "train_config": asdict(cfg),
        "model_config": trainer.model_config,
        **model_costs("baseline", trainer.model_config, (1, cfg.canvas, cfg.canvas)),
        "history": history,
        "train_digits": train_images(ctx),
        "progress": progress(
            history, cfg.epochs, cfg.epoch_images, train_images(ctx), (ctx.run_dir("baseline-mnist"), cfg.batch_size)
        ),
        "capsnet": capsnet_reference(ctx.capsnet_curve, train_images(ctx))
        if ctx.capsnet_curve and ctx.capsnet_curve.is_file()
        else None,
    }
    if not trainer.finished:
        ctx.check_budget("baseline-mnist", trainer.epoch, cfg.epochs, math.inf, (result, {}))
    task = trainer.task
    final = evaluate_torch(trainer.evaluated_model, task.arch, task.test_split, trainer.device, cfg.eval_batch_size)
    return {**result, "final": final.to_dict()}, {}


def cumulative(history: list[dict[str, Any]], images_per_epoch: int, flops_per_image: int) -> list[dict[str, Any]]:
    """Each evaluated epoch's test error with the training images and FLOPs spent up to its end."""
    return [
        {
            "epoch": row["epoch"],
            "images": row["epoch"] * images_per_epoch,
            "pflop": row["epoch"] * images_per_epoch * flops_per_image / 1e15,
            "test_error": row["test_error"],
            "test_n": row.get("test_n"),
        }
        for row in evaluated(history)
    ]


def at_compute(points: list[dict[str, Any]], pflop: float) -> dict[str, Any] | None:
    """The first point that has spent at least `pflop` of training (None: none has)."""
    return next((p for p in points if p["pflop"] >= pflop), None)


def curve_figure(path: Path, curves: dict[str, list[dict[str, Any]]]) -> None:
    """Test error against training images seen (with the target) and against training FLOPs, one line per model."""
    with figure(path, figsize=(10, 4)) as fig:
        by_images, by_flops = fig.subplots(1, 2)
        for name, points in curves.items():
            errors = [100 * p["test_error"] for p in points]
            by_images.plot([p["images"] for p in points], errors, "o-", label=name)
            by_flops.plot([p["pflop"] for p in points], errors, "o-", label=name)
        by_images.set(xlabel="training images seen", ylabel="test error (%)", xscale="log", yscale="log")
        by_flops.set(xlabel="training compute (PFLOP)", ylabel="test error (%)", xscale="log", yscale="log")
        by_images.axhline(100 * TARGET_ERROR, color="gray", linestyle="--", label="target")
        for ax in (by_images, by_flops):
            ax.grid(True, which="both", alpha=0.3)
            ax.legend()


def render_baseline(ctx: Context, saved: Saved | None, reason: str | None) -> str:
    out = ["## 2. The paper's baseline CNN on MNIST", ""]
    out += [
        "Three 5×5 convolutions (256, 256, 128 channels, stride 1, 'same' padding, ReLU, no pooling), fully "
        "connected layers of 328 and 192 units, dropout 0.5, a 10-way softmax with cross entropy "
        "(`model/baseline.py`, arch `baseline`); 35.4M parameters as in the paper. Trained by `training.fitting.train` "
        "with CapsNet's data and augmentation (random shifts of up to 2 pixels), Adam, lr 0.001 decaying by "
        "0.96 per pass over the training set.",
        "",
    ]
    if saved is None:
        return not_measured(out, reason, f"The paper: {pct(PAPER_ERROR)} test error.")
    r = saved.result
    prog = r.get("progress")
    ours = cumulative(r["history"], prog["images_per_epoch"], r["train_flops_per_image"]) if prog else []
    if prog:
        out += [
            f"**Compute.** Trained on {trained_on(saved.machine)}: "
            f"{compute_sentence(r['train_config'], r['train_digits'], r)}. "
            f"{progress_line('Baseline CNN', prog)} The paper reports its converged model, evaluated on all 10,000 "
            "test digits.",
            "",
        ]
    capsnet = r.get("capsnet")
    theirs = (
        cumulative(capsnet["history"], capsnet["images_per_epoch"], capsnet["train_flops_per_image"]) if capsnet else []
    )
    out += [md_table(*comparison_table(r, ours, capsnet, theirs)), ""]
    if ours:
        last = ours[-1]
        se = 100 * math.sqrt(last["test_error"] * (1 - last["test_error"]) / last["test_n"])
        out += [
            f"The baseline's test error is on the first {last['test_n']:,} test digits (standard error ±{se:.2f} "
            "points at its last error)"
            + (f"; CapsNet's curve is `{capsnet['source']}` ({capsnet['images_per_epoch']:,} training images per "
               "epoch, tested on all 10,000 test digits)." if capsnet else ".")
            + " Compute counts the FLOPs of training steps only (evaluations left out).",
            "",
        ]  # fmt: skip
    out += [provenance(saved), ""]
    curve = ctx.figures / "baseline_curve.png"
    curve_figure(curve, {"baseline CNN": ours, **({"CapsNet": theirs} if theirs else {})})
    out.append(f"![baseline and CapsNet test error by training images and compute]({rel(ctx, curve)})")
    if "final" in r:
        cm = ctx.figures / "confusion_baseline.png"
        confusion_figure(cm, np.asarray(r["final"]["confusion_matrix"]), "baseline CNN: errors by class")
        out.append(f"![baseline confusion]({rel(ctx, cm)})")
    out.append("")
    left = None
    if prog and ours and ours[-1]["test_error"] > PAPER_ERROR:
        passes = ours[-1]["images"] / r["train_digits"]
        left = (
            f"The baseline trained {passes:.2f} passes over the training digits ({ours[-1]['pflop']:.2f} PFLOP) to "
            f"{pct(ours[-1]['test_error'])} test error; the paper's converged model has {pct(PAPER_ERROR)}, so "
            "training it to convergence is left."
        )
    if prog:
        evidence = f"[the curve above]({rel(ctx, curve)})"
        sentence = outlook(r["history"], TARGET_ERROR, prog["images_per_epoch"], prog["images_planned"], curve=evidence)
        out += [f"**Projection.** {sentence}", ""]
    out += closing_note(saved.command, prog, left)
    return "\n".join(out)


def comparison_table(
    r: dict[str, Any], ours: list[dict[str, Any]], capsnet: dict[str, Any] | None, theirs: list[dict[str, Any]]
) -> tuple[list[str], list[list[Any]]]:
    """The baseline's last epoch, CapsNet at the same training compute and at its last epoch, and the paper."""

    def row(label: str, parameters: int, flops: int, point: dict[str, Any] | None) -> list[Any]:
        if point is None:
            return [label, f"{parameters:,}", f"{flops / 1e9:.2f}", "0", "0", "not yet measured", "—"]
        return [
            label, f"{parameters:,}", f"{flops / 1e9:.2f}", f"{point['images']:,}", f"{point['pflop']:.2f}",
            pct(point["test_error"]), f"{point['test_n']:,}",
        ]  # fmt: skip

    last = ours[-1] if ours else None
    rows = [row("baseline CNN (this run)", r["parameters"], r["train_flops_per_image"], last)]
    if capsnet and theirs:
        same = at_compute(theirs, last["pflop"]) if last else None
        for label, point in (("CapsNet at the same compute", same), ("CapsNet, last epoch", theirs[-1])):
            if point is not None:
                label = f"{label} (epoch {point['epoch']})"
                rows.append(row(label, capsnet["parameters"], capsnet["train_flops_per_image"], point))
    rows.append(["baseline CNN (Sabour et al. 2017)", "35.4M", "—", "—", "—", pct(PAPER_ERROR), "10,000"])
    headers = ["model", "parameters", "GFLOP / training image", "training images", "PFLOP", "test error", "test n"]
    return headers, rows


SECTION = Section("baseline", run_baseline, render_baseline)

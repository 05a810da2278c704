"""Section 2: the paper's baseline CNN trained on MNIST by the one training loop."""

from __future__ import annotations

import logging
import math
from dataclasses import asdict
from typing import Any

import numpy as np

from model.capsnet import count_parameters
from training.evaluate import evaluate_torch
from training.loop import draw_curve
from training.report.common import (
    Context,
    Saved,
    Section,
    confusion_figure,
    md_table,
    not_measured,
    pct,
    provenance,
    rel,
    resumable_trainer,
    train_config,
)

log = logging.getLogger(__name__)


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
    task = trainer.task
    final = evaluate_torch(trainer.model, task.arch, task.test_split, trainer.device, cfg.eval_batch_size)
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
        return not_measured(out, reason, "The paper: 0.39% test error.")
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


SECTION = Section("baseline", run_baseline, render_baseline)

"""Section 4: CapsNet on MultiMNIST (Sabour et al. 2017 §6): two-digit error and Figure-5 reconstructions."""

from __future__ import annotations

import logging
import math
from dataclasses import asdict
from typing import Any

import numpy as np

from model.capsnet import count_parameters
from training.checkpoint import CheckpointMismatch
from training.multimnist import MultiMNISTConfig, reconstruction_examples, train_multimnist
from training.report.common import (
    Context,
    NotMeasured,
    Saved,
    Section,
    image_grid,
    md_table,
    not_measured,
    pct,
    provenance,
    rel,
)

log = logging.getLogger(__name__)

PAPER_MULTIMNIST = {"CapsNet, 3 iterations, reconstruction": 5.2, "Baseline CNN": 8.1}


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
        model, history, test_data = train_multimnist(cfg, train, test, ctx.device, out, ctx.deadline)
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
        return not_measured(out, reason, f"The paper's error: {paper}.")
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


SECTION = Section("multimnist", run_multimnist, render_multimnist)

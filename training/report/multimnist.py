"""Section 4: CapsNet on MultiMNIST (Sabour et al. 2017 §6): two-digit error and Figure-5 reconstructions."""

from __future__ import annotations

import logging
import math
from dataclasses import asdict
from typing import Any

import numpy as np
import torch

from model.capsnet import CapsNet, count_parameters
from model.config import CapsNetConfig
from training.fitting.checkpoint import CheckpointMismatch
from training.fitting.history import evaluated
from training.fitting.multimnist import MultiMNISTConfig, multimnist_loss, reconstruction_examples, train_multimnist
from training.report.common import (
    Context,
    NotMeasured,
    Saved,
    Section,
    figure,
    image_grid,
    md_table,
    not_measured,
    pct,
    provenance,
    rel,
)
from training.report.compute import (
    CHECKPOINT_MINUTES,
    closing_note,
    count_flops,
    evaluated_when,
    lr_decay_per_epoch,
    progress,
    progress_line,
    trained_on,
)
from training.report.projection import outlook

log = logging.getLogger(__name__)

PAPER_CAPSNET = "CapsNet, 3 iterations, reconstruction"
PAPER_MULTIMNIST = {PAPER_CAPSNET: 5.2, "Baseline CNN": 8.1}
PAPER_COMPOSITES = 60_000_000  # the paper's training composites (1,000 per training digit)
TARGET_ERROR = 0.10  # the report run's target: 10% two-digit error ...
TARGET_COMPOSITES = 2_000_000  # ... after at least this many training composites


def run_multimnist(ctx: Context) -> tuple[dict[str, Any], dict[str, np.ndarray]]:
    train, test = ctx.split("train"), ctx.split("test")
    s = ctx.sizes
    cfg = MultiMNISTConfig(
        preset=s.preset, epochs=s.epochs, batch_size=s.batch_size, seed=ctx.seed,
        test_pairs_per_digit=s.multimnist_test_pairs, eval_batch_size=s.eval_batch_size,
        composites_per_epoch=s.epoch_images, amp=ctx.amp, lr_decay=lr_decay_per_epoch(s.epoch_images, len(train)),
        eval_every=s.eval_every,
    )  # fmt: skip
    ctx.check_budget("multimnist", None, cfg.epochs, None)
    out = ctx.run_dir("multimnist")
    try:
        model, history, test_data = train_multimnist(
            cfg, train, test, ctx.device, out, ctx.deadline, CHECKPOINT_MINUTES
        )
    except CheckpointMismatch as e:
        raise NotMeasured(str(e)) from e
    examples = reconstruction_examples(model, test_data, ctx.device, 2 * s.examples)
    result = {
        "config": asdict(cfg),
        "model_config": model.cfg.to_dict(),
        "parameters": count_parameters(model),
        **multimnist_costs(model.cfg.to_dict()),
        "train_digits": len(train),
        "test_digits": len(test),
        "history": history,
        "progress": progress(history, cfg.epochs, cfg.composites_per_epoch, len(train), (out, cfg.batch_size)),
        **last_tested(history),
    }
    if len(history) < cfg.epochs:  # (the last training section: no later model needs ctx.trained())
        ctx.check_budget("multimnist", len(history), cfg.epochs, math.inf, (result, examples))
    return result, examples


def last_tested(history: list[dict[str, Any]]) -> dict[str, Any]:
    """The two-digit error and test composites of the last evaluated epoch, and that epoch (None: none yet)."""
    tested = evaluated(history)
    if not tested:
        return {"test_error": None, "test_n": 0, "test_epoch": None}
    return {"test_error": tested[-1]["test_error"], "test_n": tested[-1]["test_n"], "test_epoch": tested[-1]["epoch"]}


def multimnist_costs(model_config: dict[str, Any]) -> dict[str, int]:
    """FLOPs per composite of a training step (two-label margin loss, one reconstruction per digit) and inference."""
    with torch.random.fork_rng(devices=[]):  # the training that goes on after this is not disturbed
        torch.manual_seed(0)
        model = CapsNet(CapsNetConfig.from_dict(model_config))
        size = model.cfg.image_size
        images, digits = torch.rand(2, 1, size, size), torch.rand(2, 2, 1, size, size)
    labels = torch.tensor([[0, 1], [2, 3]])

    def train_step() -> None:
        model.train()
        multimnist_loss(model, images, labels, digits)[0].backward()

    def inference() -> None:
        model.eval()
        with torch.no_grad():
            model.encode(images)

    return {
        "train_flops_per_image": count_flops(train_step) // 2,
        "inference_flops_per_image": count_flops(inference) // 2,
    }


def overlay(red: np.ndarray, green: np.ndarray) -> np.ndarray:
    """Two gray images (..., H, W) -> RGB (..., H, W, 3): the first in red, the second in green (Figure 5)."""
    return np.stack([red, green, np.zeros_like(red)], axis=-1)


def render_multimnist(ctx: Context, saved: Saved | None, reason: str | None) -> str:
    out = [
        "## 4. MultiMNIST",
        "",
        "`training.data.generators.multimnist` (the paper's §6): every MNIST digit is overlaid with a digit of a "
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
    prog = r.get("progress")
    if prog:
        out += [compute_paragraph(r, prog, saved.machine), ""]
    composites = f"{prog['images_done']:,}" if prog else "—"
    epochs: int | str = len(r["history"])
    if r.get("test_epoch") not in (None, epochs):  # a run stopped after an epoch it did not evaluate
        epochs = f"{epochs} (tested after epoch {r['test_epoch']})"
    rows: list[list[Any]] = [
        ["CapsNet (this run)", f"{r['parameters']:,}", epochs, composites, pct(r["test_error"]), f"{r['test_n']:,}"],
        *[
            [f"{k} (paper)", "—", "—", f"{PAPER_COMPOSITES:,}", f"{v:.1f}%", "10,000,000"]
            for k, v in PAPER_MULTIMNIST.items()
        ],
    ]
    headers = ["model", "parameters", "epochs", "training composites", "two-digit error", "test composites"]
    out += [md_table(headers, rows), "", provenance(saved), ""]
    curve = ctx.figures / "multimnist_curve.png"
    if tested := evaluated(r["history"]):
        with figure(curve, figsize=(5, 3.5)) as fig:
            ax = fig.subplots()
            per_epoch = prog["images_per_epoch"] if prog else r["train_digits"]
            ax.plot([h["epoch"] * per_epoch for h in tested], [100 * h["test_error"] for h in tested], "o-")
            ax.axhline(100 * TARGET_ERROR, color="gray", linestyle="--", label="target")
            ax.set(xlabel="training composites seen", ylabel="two-digit test error (%)", title="CapsNet on MultiMNIST")
            ax.set(xscale="log", yscale="log")
            ax.tick_params(axis="x", which="minor", labelbottom=False)
            ax.grid(True, which="both", alpha=0.3)
            ax.legend()
        out += [f"![MultiMNIST test error by training composites]({rel(ctx, curve)})", ""]
    a = saved.arrays
    if a and r["history"]:  # (an untrained model's reconstructions show nothing)
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
    left: str | None = None
    paper_error = PAPER_MULTIMNIST[PAPER_CAPSNET] / 100
    last_error = r["test_error"]
    if prog and last_error is not None and (prog["images_done"] < PAPER_COMPOSITES or last_error > paper_error):
        share = (
            f"1/{PAPER_COMPOSITES / prog['images_done']:,.0f} of them"
            if prog["images_done"] < PAPER_COMPOSITES
            else "all"
        )
        left = (
            f"{prog['images_done']:,} of the paper's {PAPER_COMPOSITES:,} training composites are done ({share}), at "
            f"{pct(last_error)} two-digit error against the paper's {pct(paper_error, 1)}: training on more "
            "composites is left."
        )
    if prog:
        out += [f"**Projection.** {projection_note(r['history'], prog, f'[the curve above]({rel(ctx, curve)})')}", ""]
    out += closing_note(saved.command, prog, left)
    return "\n".join(out)


def projection_note(history: list[dict[str, Any]], prog: dict[str, Any], evidence: str) -> str:
    """The run's outlook for the target error, and whether it plans the composites the target asks for."""
    planned = int(prog["images_planned"])
    sentence = outlook(
        history, TARGET_ERROR, prog["images_per_epoch"], planned, unit="composites", measure="two-digit test error",
        curve=evidence,
    )  # fmt: skip
    if planned < TARGET_COMPOSITES:
        sentence += f" The target asks for {TARGET_COMPOSITES:,} training composites; this run plans {planned:,}."
    return sentence


def compute_paragraph(r: dict[str, Any], prog: dict[str, Any], machine: dict[str, Any]) -> str:
    cfg = r["config"]
    per_epoch = cfg.get("composites_per_epoch") or r["train_digits"]
    precision = "bfloat16 convolutions (autocast)" if cfg.get("amp") else "float32"
    source = (
        f"{per_epoch:,} composites per epoch, each epoch's from {per_epoch:,} training digits sampled afresh "
        "(bases and partners among them)"
        if cfg.get("composites_per_epoch")
        else f"one composite per training digit ({per_epoch:,}) per epoch"
    )
    return (
        f"**Compute.** Trained on {trained_on(machine)}: "
        f"{cfg['epochs']} epochs of {source}, batch {cfg['batch_size']}, {precision}, Adam lr {cfg['lr']:g} "
        "decaying by "
        f"{cfg['lr_decay']:.5g} per epoch (0.96 per 60,000 composites); tested "
        f"{evaluated_when(cfg.get('eval_every', 1))} on "
        f"{cfg['test_pairs_per_digit']} composite(s) of each of the first {r.get('test_digits', r['test_n']):,} test "
        "digits; "
        f"{r['train_flops_per_image'] / 1e9:.2f} GFLOP per training composite. "
        f"{progress_line('CapsNet', prog, 'composites')} "
        "The paper: 60M training composites (1,000 per training digit) and 10M test composites."
    )


SECTION = Section("multimnist", run_multimnist, render_multimnist)

"""Section 1: MNIST test error of the bundled models, evaluated with ONNX Runtime, against the paper."""

from __future__ import annotations

import logging
import os
from pathlib import Path
from typing import Any

import numpy as np

from service.contract import read_card
from training.fitting.history import averaged_note
from training.report.common import (
    REPO_ROOT,
    Context,
    NotMeasured,
    Saved,
    Section,
    confusion_figure,
    md_table,
    not_measured,
    pct,
    provenance,
    rel,
    shown,
)
from training.report.models import zoo_models

log = logging.getLogger(__name__)

# Sabour, Frosst & Hinton 2017, Table 1 (mean ± std over 3 trials) and §5.2, §6.
PAPER_MNIST = [
    ("Baseline CNN", "—", "—", 0.39, ""),
    ("CapsNet", "1 iteration", "no", 0.34, "±0.032"),
    ("CapsNet", "1 iteration", "yes", 0.29, "±0.011"),
    ("CapsNet", "3 iterations", "no", 0.35, "±0.036"),
    ("CapsNet", "3 iterations", "yes", 0.25, "±0.005"),
]


EM_MISSING = "\n".join(
    [
        "**EM routing: not yet measured.** What is missing is a trained EM-routing model directory in `model/zoo` "
        "(a card with architecture `em`): the EM network is not yet trained to a useful accuracy on this machine "
        "(docs/em-routing.md). Once a run has finished, these commands add its row and its confusion matrix "
        "(the first repeated until it exits 0, adding `--resume runs/capsnet-em-small/last.pt` after the first call):",
        "",
        "```bash",
        "capsnet-train --arch em --preset small --data-dir ../shared/data/mnist --out runs/capsnet-em-small \\",
        "    --epochs 30 --batch-size 32 --val-split 5000 --max-minutes 30",
        "capsnet-export runs/capsnet-em-small/best_val.pt --out model/zoo/capsnet-em-mnist",
        "python -m training.report --data-dir ../shared/data/mnist --sections mnist_models",
        "```",
    ]
)


CURVES = REPO_ROOT / "docs" / "training"  # docs/training/<model name>/training_curve.png, written by capsnet-export


MNIST_TEST = 10_000


def training_summary(card: dict[str, Any]) -> dict[str, Any] | None:
    """What the card says about the run behind a model: preset, the epoch exported and why, error per epoch."""
    training = card.get("training")
    if not isinstance(training, dict) or not training.get("history"):
        return None
    parent = card.get("parent")
    if card.get("quantization") and isinstance(parent, dict):  # trained as its parent; say so instead of repeating it
        return {"quantized_from": parent.get("name")}
    cfg = training.get("train_config") or {}
    history = [h for h in training["history"] if isinstance(h, dict) and "epoch" in h]
    curve = CURVES / str(card.get("name")) / "training_curve.png"
    return {
        "preset": cfg.get("preset"),
        "epoch": training.get("epochs"),
        "checkpoint": (training.get("checkpoint") or {}).get("file"),
        "init_from": training.get("init_from"),
        "test_error_by_epoch": [h.get("test_error") for h in history],
        "test_n": min((h["test_n"] for h in history if h.get("test_n")), default=None),
        "val_error_by_epoch": [h.get("val_error") for h in history] if any("val_error" in h for h in history) else None,
        "averaged": averaged_note(history),
        "curve": shown(curve) if curve.is_file() else None,
    }


def tested_on(n: int | None) -> str:
    """How many test digits the run's per-epoch errors counted, when not all of them."""
    return f", on the first {n:,} test digits only" if n is not None and n < MNIST_TEST else ""


def percents(errors: list[float | None]) -> str:
    """Error rates as comma-separated percentages (— for an epoch without one)."""
    return ", ".join("—" if e is None else f"{100 * e:.2f}" for e in errors)


def started_from(init: Any) -> str:
    """The model a warm-started run began from, as its card's `training.init_from` records it."""
    if isinstance(init, dict) and init.get("name"):
        version = f" version {init['version']}" if init.get("version") else ""
        return f"`{init['name']}`{version}"
    if isinstance(init, dict):
        return f"`{init.get('path', 'an unnamed model directory')}`"
    return f"`{init}`"


SELECTION = {"best_val.pt": "the lowest validation error", "best.pt": "the lowest test error", "last.pt": "the last"}


def render_training(ctx: Context, models: list[dict[str, Any]]) -> list[str]:
    """One paragraph and the training curve per bundled model whose card records its run."""
    out: list[str] = []
    for m in models:
        t = m.get("training")
        if not t:
            continue
        if "quantized_from" in t:
            out += [
                f"**{m['name']}**: the static int8 quantization of `{t['quantized_from']}` (no training of its own).",
                "",
            ]
            continue
        chosen = SELECTION.get(t.get("checkpoint") or "", "a chosen")
        preset = f"{t['preset']} preset, " if t.get("preset") else ""
        start = f", started from {started_from(t['init_from'])}" if t.get("init_from") else ""
        out += [
            f"**{m['name']}** ({preset}{m.get('parameters') or 0:,} parameters{start}): epoch {t['epoch']}, "
            f"the epoch with {chosen} (`{t.get('checkpoint')}`). "
            f"Test error by epoch (%{tested_on(t.get('test_n'))}): {percents(t['test_error_by_epoch'])}.",
            "",
        ]
        if t["val_error_by_epoch"]:
            out += [
                f"Validation error by epoch (%, held-out training images): {percents(t['val_error_by_epoch'])}.",
                "",
            ]
        if t.get("averaged"):
            out += [t["averaged"], ""]
        if t.get("curve"):
            path = REPO_ROOT / t["curve"]
            link = Path(os.path.relpath(path, ctx.out.resolve())).as_posix()
            out += [f"![training curve of {m['name']}]({link})", ""]
    return out


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
            "training": training_summary(card),
        }
        try:
            from training.fitting.onnx_eval import evaluate_model_dir

            test = test if test is not None else ctx.split("test")
            entry["evaluation"] = evaluate_model_dir(d, test)
            entry["evaluation"]["source"]["model"] = shown(d)
        except NotMeasured as e:
            entry["evaluation_error"] = str(e)
        except ImportError as e:
            entry["evaluation_error"] = f"training.fitting.onnx_eval is not available: {e}"
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
        return not_measured(out, reason, "Papers' figures:", md_table(headers, paper_rows))
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
    has_em = any(m.get("architecture") == "em" for m in saved.result["models"])
    if not has_em:
        rows.append(["EM routing (Hinton et al. 2018)", "em, 3 iterations", "no", "not yet measured", "", "—", "—"])
    out += [md_table(headers, rows + paper_rows), "", provenance(saved), "", *figs, ""]
    if not has_em:
        out += [EM_MISSING, ""]
    trained = render_training(ctx, saved.result["models"])
    if trained:
        out += ["### How each bundled model was trained", "", *trained]
    return "\n".join(out)


SECTION = Section("mnist_models", run_mnist_models, render_mnist_models)

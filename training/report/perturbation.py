"""Section 5: what the capsule dimensions encode (the paper's Figure 4)."""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

import numpy as np

from training.data.generators import center_on_canvas
from training.data.mnist import to_float
from training.report.common import (
    Context,
    NotMeasured,
    Saved,
    Section,
    image_grid,
    not_measured,
    provenance,
    rel,
)
from training.report.models import (
    capsule_model,
)

log = logging.getLogger(__name__)

PERTURBATIONS = np.round(np.arange(-0.25, 0.2501, 0.05), 2)  # §5.1: steps of 0.05 in [-0.25, 0.25]


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
        return not_measured(out, reason)
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


SECTION = Section("perturbation", run_perturbation, render_perturbation)

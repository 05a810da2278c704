"""Model directories evaluated with ONNX Runtime and numpy only (no torch): the card says which output scores."""

from __future__ import annotations

import os
from typing import Any

import numpy as np
import onnxruntime as ort

from service.contract import create_session, load_model_dir
from training.data.mnist import MNISTSplit, to_float
from training.fitting.results import EvalResult, confusion_matrix, progress_bar


def evaluate_session(
    session: ort.InferenceSession,
    input_name: str,
    scores_output: str,
    num_classes: int,
    split: MNISTSplit,
    batch_size: int = 500,
    progress: bool = False,
) -> EvalResult:
    """Error and confusion matrix of the argmax of `scores_output` over `split` (`progress`: a bar on stderr)."""
    if batch_size < 1:
        raise ValueError(f"batch_size must be >= 1, got {batch_size}")
    preds = [np.zeros(0, dtype=np.int64)]
    with progress_bar(len(split), progress) as bar:
        for start in range(0, len(split), batch_size):
            images = to_float(split.images[start : start + batch_size])  # (B, 1, 28, 28) in [0, 1]
            (scores,) = session.run([scores_output], {input_name: images})  # (B, K)
            preds.append(scores.argmax(axis=1))
            bar.update(len(images))
    p = np.concatenate(preds)
    cm = confusion_matrix(split.labels, p, num_classes)
    return EvalResult(n=len(split), errors=int((p != split.labels).sum()), confusion=cm)


def evaluate_model_dir(
    model_dir: str | os.PathLike[str], split: MNISTSplit, batch_size: int = 500, progress: bool = False
) -> dict[str, Any]:
    """Evaluate a verified model directory with ONNX Runtime: the JSON of checkpoint evaluation plus the model name."""
    loaded = load_model_dir(model_dir)
    card = loaded.card
    session = create_session(loaded.graph)
    scores = card.scores.output
    result = evaluate_session(session, card.input.name, scores, len(card.classes), split, batch_size, progress)
    return {
        **result.to_dict(),
        "model": card.name,
        "evaluated_with": "onnxruntime",
        "source": {"model": str(model_dir)},
    }

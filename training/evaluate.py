"""Evaluation of a checkpoint (PyTorch) on the MNIST test set: error, per-class error, confusion."""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np

from training.data import MNISTSplit, to_float

if TYPE_CHECKING:
    import torch
    from torch import nn

    from training.architectures import Architecture


@dataclass
class EvalResult:
    n: int
    errors: int
    confusion: np.ndarray  # (K, K): rows true class, columns predicted
    loss: float = float("nan")
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def test_error(self) -> float:
        return self.errors / self.n if self.n else float("nan")

    def to_dict(self) -> dict[str, Any]:
        per_class_total = self.confusion.sum(axis=1)
        per_class_err = 1.0 - np.diag(self.confusion) / np.maximum(per_class_total, 1)
        return {
            "test_error": self.test_error,
            "test_accuracy": 1.0 - self.test_error,
            "n": self.n,
            "errors": self.errors,
            "per_class_error": {str(k): round(float(e), 6) for k, e in enumerate(per_class_err)},
            "confusion_matrix": self.confusion.tolist(),
            **self.extra,
        }


def confusion_matrix(labels: np.ndarray, predictions: np.ndarray, num_classes: int) -> np.ndarray:
    cm = np.zeros((num_classes, num_classes), dtype=np.int64)
    np.add.at(cm, (labels, predictions), 1)
    return cm


def evaluate_torch(
    model: nn.Module,
    arch: Architecture,
    split: MNISTSplit,
    device: torch.device,
    batch_size: int = 500,
    max_batches: int | None = None,
) -> EvalResult:
    """Predictions of `model` (masking by its own prediction) over `split`, with the mean loss."""
    import torch

    model.eval()
    preds, losses, num_classes = [], 0.0, 0
    n = len(split) if max_batches is None else min(len(split), max_batches * batch_size)
    with torch.no_grad():
        for start in range(0, n, batch_size):
            images = torch.from_numpy(to_float(split.images[start : start + batch_size])).to(device)
            y = torch.from_numpy(split.labels[start : start + batch_size]).to(device)
            out = arch.forward(model, images, None)
            losses += float(arch.loss(out, images, y, 1.0).total) * len(y)
            scores = arch.scores(out)
            num_classes = int(scores.shape[1])
            preds.append(scores.argmax(dim=1).cpu().numpy())
    p, t = np.concatenate(preds), split.labels[:n]
    cm = confusion_matrix(t, p, num_classes)
    return EvalResult(n=n, errors=int((p != t).sum()), confusion=cm, loss=losses / max(n, 1))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="capsnet-evaluate",
        description="Evaluate a checkpoint or an exported model directory on MNIST test; prints one JSON object.",
    )
    source = parser.add_mutually_exclusive_group(required=True)
    source.add_argument("--checkpoint", help="a training checkpoint (.pt) (needs torch)")
    source.add_argument("--model", help="an exported model directory (ONNX Runtime only, no torch)")
    parser.add_argument("--data-dir", default=None, help="MNIST IDX directory (default: $CAPSNET_DATA_DIR)")
    parser.add_argument("--batch-size", type=int, default=500, help="evaluation batch size (default: 500)")
    parser.add_argument(
        "--device", default="auto", choices=["auto", "cpu", "cuda"], help="device for --checkpoint (default: auto)"
    )
    parser.add_argument("--limit", type=int, default=None, help="evaluate only the first N test images (default: all)")
    args = parser.parse_args(argv)
    from training.data import IDXError, load_split

    try:
        split = load_split(args.data_dir, "test").subset(args.limit)
        if args.checkpoint:
            from training.checkpoint import load_model

            device = resolve_device(args.device)
            model, arch, _ = load_model(args.checkpoint, device)
            result = evaluate_torch(model, arch, split, device, args.batch_size).to_dict()
            result["source"] = {"checkpoint": args.checkpoint}
        else:
            from training.onnx_eval import evaluate_model_dir

            result = evaluate_model_dir(args.model, split, args.batch_size)
    except (IDXError, FileNotFoundError, ValueError) as e:
        print(f"capsnet-evaluate: error: {e}", file=sys.stderr)
        return 2
    print(json.dumps(result))
    return 0


def resolve_device(name: str) -> torch.device:
    import torch

    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if name == "cuda" and not torch.cuda.is_available():
        raise ValueError("--device cuda was asked for but CUDA is not available")
    return torch.device(name)


if __name__ == "__main__":
    sys.exit(main())

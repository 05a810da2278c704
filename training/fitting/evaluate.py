"""capsnet-evaluate: a checkpoint (PyTorch) or a model directory (ONNX Runtime, no torch) on the MNIST test set."""

from __future__ import annotations

import argparse
import json
import sys
from typing import TYPE_CHECKING

import numpy as np

from training.data.mnist import IDXError, MNISTSplit, load_split, to_float
from training.fitting.device import resolve_device
from training.fitting.onnx_eval import evaluate_model_dir
from training.fitting.results import EvalResult, confusion_matrix, progress_bar
from training.options import add_data_dir, add_device

if TYPE_CHECKING:
    import torch
    from torch import nn

    from training.fitting.architectures import Architecture


def evaluate_torch(
    model: nn.Module,
    arch: Architecture,
    split: MNISTSplit,
    device: torch.device,
    batch_size: int = 500,
    max_batches: int | None = None,
    progress: bool = False,
) -> EvalResult:
    """Predictions of `model` (masking by its own prediction) over `split`, with the mean loss (`progress`: a bar)."""
    import torch

    model.eval()
    preds, losses, num_classes = [], 0.0, 0
    n = len(split) if max_batches is None else min(len(split), max_batches * batch_size)
    with torch.no_grad(), progress_bar(n, progress) as bar:
        for start in range(0, n, batch_size):
            images = torch.from_numpy(to_float(split.images[start : start + batch_size])).to(device)
            y = torch.from_numpy(split.labels[start : start + batch_size]).to(device)
            out = arch.forward(model, images, None)
            losses += float(arch.loss(out, images, y, 1.0).total) * len(y)
            scores = arch.scores(out)
            num_classes = int(scores.shape[1])
            preds.append(scores.argmax(dim=1).cpu().numpy())
            bar.update(len(y))
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
    add_data_dir(parser)
    parser.add_argument("--batch-size", type=int, default=500, help="evaluation batch size (default: 500)")
    add_device(parser, "device for --checkpoint")
    parser.add_argument("--limit", type=int, default=None, help="evaluate only the first N test images (default: all)")
    args = parser.parse_args(argv)
    progress = sys.stderr.isatty()  # a bar for a person at a terminal; logs and pipes stay clean
    try:
        split = load_split(args.data_dir, "test").subset(args.limit)
        if args.checkpoint:
            from training.fitting.checkpoint import load_model

            device = resolve_device(args.device)
            model, arch, _ = load_model(args.checkpoint, device)
            result = evaluate_torch(model, arch, split, device, args.batch_size, progress=progress).to_dict()
            result["source"] = {"checkpoint": args.checkpoint}
        else:
            result = evaluate_model_dir(args.model, split, args.batch_size, progress)
    except (IDXError, FileNotFoundError, ValueError) as e:
        print(f"capsnet-evaluate: error: {e}", file=sys.stderr)
        return 2
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())

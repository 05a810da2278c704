"""What one training image of each report experiment costs here: FLOPs counted by torch and images/s measured.

    python -m training.report.costs [--seconds 20] [--threads 1] [--amp] [--affine-cnn-channels 64,64,32]

Prints one JSON object per model (the models the report's training sections train, at their input sizes), to size
a CPU-scale run: an epoch of N images takes about N / images_per_s seconds at the share of the machine measured.
"""

from __future__ import annotations

import argparse
import json
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, cast

import torch

from model.capsnet import CapsNet, count_parameters
from training.benchmarks.timing import timed_runs
from training.data.generators import AFFINE_CANVAS, MULTIMNIST_CANVAS
from training.fitting.architectures import get_architecture
from training.fitting.config import TrainConfig
from training.fitting.loop import make_optimizer, optimizer_step
from training.fitting.multimnist import multimnist_loss
from training.options import add_threads
from training.report.compute import count_flops


@dataclass(frozen=True)
class Experiment:
    name: str  # what the report trains it for
    arch: str  # "dynamic" or "baseline"
    canvas: int
    overrides: dict[str, Any]
    multimnist: bool = False  # two-digit loss with one reconstruction per digit
    preset: str = "paper"


def experiments(cnn_channels: tuple[int, ...]) -> list[Experiment]:
    return [
        Experiment("capsnet-mnist", "dynamic", 28, {}),
        Experiment("baseline-mnist (paper CNN)", "baseline", 28, {}),
        Experiment("affine-dynamic (CapsNet)", "dynamic", AFFINE_CANVAS, {}),
        Experiment("affine-baseline (paper CNN)", "baseline", AFFINE_CANVAS, {}),
        Experiment(
            f"affine-baseline (CNN {','.join(map(str, cnn_channels))})",
            "baseline",
            AFFINE_CANVAS,
            {"conv_channels": cnn_channels},
        ),
        Experiment("multimnist (CapsNet)", "dynamic", MULTIMNIST_CANVAS, {}, multimnist=True),
    ]


def training_step(exp: Experiment, batch: int, amp: bool) -> tuple[torch.nn.Module, Callable[[], None]]:
    """The model and one Adam step of it on random images (MultiMNIST: random pairs of digits)."""
    arch = get_architecture(exp.arch)
    model = arch.build(arch.make_config(exp.preset, {**exp.overrides, "image_size": exp.canvas})).train()
    optimizer = make_optimizer(model, TrainConfig().lr)
    images = torch.rand(batch, 1, exp.canvas, exp.canvas)
    labels = torch.randint(0, 10, (batch,))
    pairs = torch.stack([labels, (labels + 1) % 10], dim=1)
    digits = torch.rand(batch, 2, 1, exp.canvas, exp.canvas)

    def autocast() -> Any:
        return torch.autocast("cpu", dtype=torch.bfloat16, enabled=amp)

    def step() -> None:
        if exp.multimnist:
            loss = multimnist_loss(cast(CapsNet, model), images, pairs, digits, autocast)[0]
        else:
            with autocast():
                out = arch.forward(model, images, labels)
            loss = arch.loss(out, images, labels, 0.0).total
        optimizer_step(optimizer, loss)

    return model, step


def measure(exp: Experiment, batch: int, seconds: float, amp: bool) -> dict[str, Any]:
    model, step = training_step(exp, batch, amp)
    flops = count_flops(step) // batch
    start = time.perf_counter()
    steps = len(timed_runs(step, seconds, min_runs=2))
    rate = steps * batch / (time.perf_counter() - start)
    return {
        "model": exp.name, "canvas": exp.canvas, "parameters": count_parameters(model),
        "train_flops_per_image": flops, "images_per_s": round(rate, 2), "batch": batch, "amp": amp,
    }  # fmt: skip


def main(argv: list[str] | None = None) -> int:
    from training.report.build import channels

    p = argparse.ArgumentParser(prog="python -m training.report.costs", description=__doc__.splitlines()[0])
    p.add_argument("--seconds", type=float, default=20.0, help="time each model this long (default: 20)")
    p.add_argument("--batch-size", type=int, default=16, help="images per training step (default: 16)")
    add_threads(p, "torch CPU threads", 1)
    p.add_argument("--amp", action="store_true", help="bfloat16 convolutions, as the report's runs (default: off)")
    p.add_argument(
        "--affine-cnn-channels", type=channels, default=(64, 64, 32), help="the smaller CNN (default: 64,64,32)"
    )
    args = p.parse_args(argv)
    if not args.seconds > 0 or args.batch_size < 1 or args.threads < 1:
        p.error("--seconds must be positive, --batch-size and --threads at least 1")
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    for exp in experiments(args.affine_cnn_channels):
        print(json.dumps(measure(exp, args.batch_size, args.seconds, args.amp)), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

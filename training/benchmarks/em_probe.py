"""Short EM-routing learning probes: how fast a setting starts to learn MNIST (docs/em-routing.md, "Training").

    python -m training.benchmarks.em_probe --data-dir DIR [--preset tiny] [--routing-iterations 2] [--lr 0.01]
        [--steps 300]

Adam steps of the spread loss at a fixed margin of 0.2 (the margin schedule's start) on the first
`--images` MNIST training images, reshuffled on every pass, without augmentation. Every `--every` steps
it prints one JSON line: the running train accuracy and loss over those steps, the median and largest
gradient norm, and the mean class activation of the last batch. A probe, not training: it says which
settings learn at all in a few hundred steps, not what they reach.
"""

from __future__ import annotations

import argparse
import json
import statistics
from collections.abc import Iterator
from dataclasses import asdict, dataclass
from typing import Any

import torch

from training.data.mnist import load_split, to_float
from training.fitting.architectures import get_architecture
from training.fitting.loop import make_optimizer, optimizer_step
from training.fitting.train import TrainConfig, model_config_for
from training.options import add_data_dir, add_threads

PROBE_MARGIN_PROGRESS = 0.0  # the spread loss's margin at training progress 0: 0.2, the schedule's start


@dataclass(frozen=True)
class ProbeWindow:
    """The running figures over one window of `every` steps."""

    step: int  # the last step of the window, counted from 1
    accuracy: float  # running train accuracy over the window's batches
    loss: float  # mean spread loss over the window
    grad_norm_median: float
    grad_norm_max: float
    activation_mean: float  # mean class activation of the window's last batch


def batches(n: int, batch_size: int, generator: torch.Generator) -> Iterator[torch.Tensor]:
    """Endless index batches over range(n), reshuffled on every pass; a batch never spans two passes."""
    while True:
        order = torch.randperm(n, generator=generator)
        for start in range(0, n - batch_size + 1, batch_size):
            yield order[start : start + batch_size]


def run_probe(
    cfg: TrainConfig, images: torch.Tensor, labels: torch.Tensor, steps: int, every: int
) -> Iterator[ProbeWindow]:
    """Train a fresh EM model (cfg.arch, cfg.preset, cfg.model_overrides) for `steps` Adam steps at cfg.lr.

    images (N, 1, 28, 28) float in [0, 1], labels (N,); yields a ProbeWindow every `every` steps.
    """
    if len(images) < cfg.batch_size:
        raise ValueError(f"{len(images)} images are fewer than one batch of {cfg.batch_size}")
    torch.manual_seed(cfg.seed)
    arch = get_architecture(cfg.arch)
    model = arch.build(model_config_for(cfg)).train()
    optimizer = make_optimizer(model, cfg.lr)
    order = batches(len(images), cfg.batch_size, torch.Generator().manual_seed(cfg.seed))
    correct, losses, norms = [], [], []
    for step in range(1, steps + 1):
        idx = next(order)
        out = arch.forward(model, images[idx], labels[idx])
        loss = arch.loss(out, images[idx], labels[idx], PROBE_MARGIN_PROGRESS).total
        optimizer_step(optimizer, loss)  # the gradients stay on the parameters: their norm is this step's
        norms.append(float(torch.nn.utils.get_total_norm([p.grad for p in model.parameters() if p.grad is not None])))
        scores = arch.scores(out).detach()
        correct.append(float((scores.argmax(1) == labels[idx]).float().mean()))
        losses.append(float(loss.detach()))
        if step % every == 0 or step == steps:
            yield ProbeWindow(
                step=step,
                accuracy=round(statistics.fmean(correct), 3),
                loss=round(statistics.fmean(losses), 3),
                grad_norm_median=round(statistics.median(norms), 3),
                grad_norm_max=round(max(norms), 3),
                activation_mean=round(float(scores.mean()), 3),
            )
            correct, losses, norms = [], [], []


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m training.benchmarks.em_probe", description=__doc__.splitlines()[0])
    add_data_dir(p)
    p.add_argument("--preset", default="tiny", choices=["paper", "small", "tiny"], help="model size (default: tiny)")
    p.add_argument("--routing-iterations", type=int, default=None, help="EM iterations (default: the model's, 2)")
    p.add_argument("--lr", type=float, default=0.01, help="Adam's learning rate (default: 0.01)")
    p.add_argument(
        "--final-inverse-temperature",
        type=float,
        default=None,
        help="λ of the last iteration (default: the model's, 3)",
    )
    p.add_argument("--beta-u-init", type=float, default=None, help="initial β_u (default: the model's, 2)")
    p.add_argument("--variance-floor", type=float, default=None, help="floor of every σ² (default: the model's, 1e-4)")
    p.add_argument("--steps", type=int, default=300, help="Adam steps (default: 300)")
    p.add_argument("--every", type=int, default=50, help="steps per printed window (default: 50)")
    p.add_argument("--images", type=int, default=5000, help="train on the first N training images (default: 5000)")
    p.add_argument("--batch-size", type=int, default=32, help="batch size (default: 32)")
    p.add_argument("--seed", type=int, default=0, help="random seed of the weights and the shuffles (default: 0)")
    add_threads(p, "torch CPU threads", 1)
    p.add_argument("--dry-run", action="store_true", help="one step, one window (default: off)")
    return p


def model_overrides(args: argparse.Namespace) -> dict[str, Any]:
    """The EM config fields the command line sets (unset ones keep the preset's values)."""
    fields = {
        "final_inverse_temperature": args.final_inverse_temperature,
        "beta_u_init": args.beta_u_init,
        "variance_floor": args.variance_floor,
    }
    return {k: v for k, v in fields.items() if v is not None}


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    for name in ("steps", "every", "images", "batch_size", "threads"):
        if getattr(args, name) < 1:
            parser.error(f"--{name.replace('_', '-')} must be at least 1, got {getattr(args, name)}")
    torch.set_num_threads(args.threads)
    cfg = TrainConfig(
        arch="em",
        preset=args.preset,
        routing_iterations=args.routing_iterations,
        batch_size=args.batch_size,
        lr=args.lr,
        seed=args.seed,
        model_overrides=model_overrides(args),
    )
    try:
        model_config_for(cfg)
        split = load_split(args.data_dir, "train")
    except ValueError as e:  # a bad model setting, or IDXError: missing or unreadable MNIST files
        parser.error(str(e))
    images = torch.from_numpy(to_float(split.images[: args.images]))
    labels = torch.from_numpy(split.labels[: args.images]).long()
    if len(images) < args.batch_size:
        parser.error(f"{len(images)} training images are fewer than one batch of {args.batch_size}")
    steps = 1 if args.dry_run else args.steps
    print(json.dumps({"probe": vars(args) | {"margin_progress": PROBE_MARGIN_PROGRESS}}), flush=True)
    for window in run_probe(cfg, images, labels, steps, args.every):
        print(json.dumps(asdict(window)), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

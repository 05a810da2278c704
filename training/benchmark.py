"""Training and inference speed of the paper CapsNet on this machine (a script, not a test).

    python -m training.benchmark [--device auto] [--train-steps 5] [--routing sabour]

Prints the machine, then training images/s at batch 128 and inference images/s at batch 1 and 128.
"""

from __future__ import annotations

import argparse
import json
import time

import torch

from training.architectures import get_architecture
from training.device import resolve_device, synchronize, use_amp
from training.machine import machine_description
from training.train import TrainConfig, model_config_for


def time_training(cfg: TrainConfig, device: torch.device, steps: int, warmup: int = 2) -> float:
    """Images/s of full training steps (forward, margin + reconstruction loss, backward, Adam)."""
    arch = get_architecture(cfg.arch)
    model = arch.build(model_config_for(cfg)).to(device).train()
    opt = torch.optim.Adam(model.parameters(), lr=cfg.lr)
    images = torch.rand(cfg.batch_size, 1, 28, 28, device=device)
    labels = torch.randint(0, 10, (cfg.batch_size,), device=device)
    amp = use_amp(cfg.amp, device)
    for k in range(warmup + steps):
        if k == warmup:
            synchronize(device)
            start = time.perf_counter()
        with torch.autocast(device_type=device.type, dtype=torch.bfloat16, enabled=amp):
            out = arch.forward(model, images, labels)
        loss = arch.loss(out, images, labels, 0.0).total
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
    synchronize(device)
    return steps * cfg.batch_size / (time.perf_counter() - start)


def time_inference(cfg: TrainConfig, device: torch.device, batch: int, seconds: float = 3.0) -> float:
    arch = get_architecture(cfg.arch)
    model = arch.build(model_config_for(cfg)).to(device).eval()
    images = torch.rand(batch, 1, 28, 28, device=device)
    done, start = 0, 0.0
    with torch.inference_mode():
        for _ in range(2):
            arch.forward(model, images, None)
        synchronize(device)
        start = time.perf_counter()
        while time.perf_counter() - start < seconds:
            arch.forward(model, images, None)
            done += batch
        synchronize(device)
    return done / (time.perf_counter() - start)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m training.benchmark", description=__doc__.splitlines()[0])
    p.add_argument("--arch", default="dynamic", choices=["dynamic", "em"], help="architecture (default: dynamic)")
    p.add_argument("--preset", default="paper", choices=["paper", "tiny"], help="model size (default: paper)")
    p.add_argument("--device", default="auto", choices=["auto", "cpu", "cuda"], help="device (default: auto)")
    p.add_argument(
        "--routing", default=None, choices=["sabour", "normalized"], help="routing variant (default: sabour)"
    )
    p.add_argument("--batch-size", type=int, default=128, help="training batch size (default: 128)")
    p.add_argument("--train-steps", type=int, default=5, help="timed training steps (default: 5)")
    p.add_argument(
        "--amp", action="store_true", help="bfloat16 autocast on CUDA or a CPU with native bfloat16 (default: off)"
    )
    p.add_argument("--seconds", type=float, default=3.0, help="time per inference measurement (default: 3)")
    args = p.parse_args(argv)
    device = resolve_device(args.device)
    cfg = TrainConfig(
        arch=args.arch, preset=args.preset, routing=args.routing, batch_size=args.batch_size, amp=args.amp
    )
    torch.manual_seed(0)
    result = {
        "machine": machine_description(device),
        "arch": args.arch,
        "preset": args.preset,
        "routing": args.routing or "default",
        f"train_images_per_s_batch{args.batch_size}": round(time_training(cfg, device, args.train_steps), 1),
        "infer_images_per_s_batch1": round(time_inference(cfg, device, 1, args.seconds), 1),
        "infer_images_per_s_batch128": round(time_inference(cfg, device, 128, args.seconds), 1),
    }
    print(json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

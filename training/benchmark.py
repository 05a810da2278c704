"""Training and inference speed of the paper CapsNet on this machine (a script, not a test).

    python -m training.benchmark [--device auto] [--train-steps 5] [--routing sabour] [--amp]

Prints the machine, then training images/s at batch 128, inference images/s at batch 1 and 128, and
ONNX Runtime's float32 inference images/s at batch 32 for the same model with the ratio training / ORT
(a training step costs about three forward passes, so training can come close to ORT's rate).
With --arch em it also prints `em_vs_dynamic`: EM and dynamic-routing training at batch 32 and their
ONNX Runtime inference at batches 1..64, measured in the same run, with the ratios of the EM speed targets.
"""

from __future__ import annotations

import argparse
import json
import time
from typing import Any

import numpy as np
import torch

from service.runtime.model_dir import create_session
from training.architectures import get_architecture
from training.device import resolve_device, synchronize, use_amp
from training.export import DEFAULT_OPSET
from training.export_card import INPUT_NAME
from training.export_graphs import ImageGraph, to_onnx
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


ORT_BATCH = 32  # the inference batch the training rate is compared with
ORT_BATCHES = (1, 2, 4, 8, 16, 32, 64)
EM_TARGETS = {"train_ratio": 0.15, "onnx_ratio": 0.14}  # EM / dynamic on the same machine


def time_onnx(cfg: TrainConfig, batches: tuple[int, ...], seconds: float) -> dict[int, float]:
    """ONNX Runtime (CPU, float32) images/s of the model's ONNX graph, built in memory by the export code."""
    arch = get_architecture(cfg.arch)
    if arch.export is None:
        raise ValueError(f"architecture {cfg.arch!r} has no ONNX export")
    config = model_config_for(cfg)
    model = arch.build(config).eval()
    spec = arch.export(model, config)
    outputs = [o.name for o in spec.outputs]
    example = torch.rand(2, *spec.input_shape)
    proto = to_onnx(ImageGraph(model, spec).eval(), (example,), [INPUT_NAME], outputs, DEFAULT_OPSET)
    session = create_session(proto.SerializeToString(), "cpu")
    rates = {}
    for batch in batches:
        images = {INPUT_NAME: np.random.default_rng(0).random((batch, *spec.input_shape), dtype=np.float32)}
        for _ in range(2):
            session.run(outputs, images)
        done, start = 0, time.perf_counter()
        while time.perf_counter() - start < seconds:
            session.run(outputs, images)
            done += batch
        rates[batch] = round(done / (time.perf_counter() - start), 1)
    return rates


def train_vs_ort(train_rate: float, cfg: TrainConfig, seconds: float) -> dict[str, float]:
    """ORT float32 batch-32 inference rate of the same model, and training rate / that rate."""
    ort_rate = time_onnx(cfg, (ORT_BATCH,), seconds)[ORT_BATCH]
    return {
        f"ort_float32_infer_images_per_s_batch{ORT_BATCH}": ort_rate,
        "train_to_ort_ratio": round(train_rate / ort_rate, 3),
    }


def em_vs_dynamic(
    preset: str, device: torch.device, steps: int, seconds: float, iterations: int | None = None
) -> dict[str, Any]:
    """EM against the paper's dynamic CapsNet in one run: training at batch 32, ONNX Runtime at batches 1..64.

    The dynamic model is the paper's (its tiny preset when `preset` is tiny, for smoke tests); `iterations`
    sets EM's routing iterations (None: the trained default, 2; the paper routes 3 times).
    """
    em = TrainConfig(arch="em", preset=preset, batch_size=32, routing_iterations=iterations)
    dynamic = TrainConfig(arch="dynamic", preset="tiny" if preset == "tiny" else "paper", batch_size=32)
    train = {"em": time_training(em, device, steps), "dynamic": time_training(dynamic, device, steps)}
    em_ort, dyn_ort = time_onnx(em, ORT_BATCHES, seconds), time_onnx(dynamic, (32,), seconds)
    best = max(em_ort, key=lambda b: em_ort[b])
    return {
        "train_images_per_s_batch32": {k: round(v, 1) for k, v in train.items()},
        "train_ratio": round(train["em"] / train["dynamic"], 3),
        "onnx_images_per_s_em": em_ort,
        "onnx_images_per_s_dynamic_batch32": dyn_ort[32],
        "onnx_best_batch_em": best,
        "onnx_ratio": round(em_ort[best] / dyn_ort[32], 3),
        "onnx_largest_batch_vs_best": round(em_ort[ORT_BATCHES[-1]] / em_ort[best], 3),
        "targets": EM_TARGETS,
    }


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m training.benchmark", description=__doc__.splitlines()[0])
    p.add_argument("--arch", default="dynamic", choices=["dynamic", "em"], help="architecture (default: dynamic)")
    p.add_argument("--preset", default="paper", choices=["paper", "small", "tiny"], help="model size (default: paper)")
    p.add_argument("--device", default="auto", choices=["auto", "cpu", "cuda"], help="device (default: auto)")
    p.add_argument(
        "--routing", default=None, choices=["sabour", "normalized"], help="routing variant (default: sabour)"
    )
    p.add_argument(
        "--routing-iterations",
        type=int,
        default=None,
        help="routing iterations (default: the architecture's, 3 for dynamic, 2 for em)",
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
        arch=args.arch,
        preset=args.preset,
        routing=args.routing,
        routing_iterations=args.routing_iterations,
        batch_size=args.batch_size,
        amp=args.amp,
    )
    torch.manual_seed(0)
    train_rate = time_training(cfg, device, args.train_steps)
    result = {
        "machine": machine_description(device),
        "arch": args.arch,
        "preset": args.preset,
        "routing": args.routing or "default",
        "routing_iterations": model_config_for(cfg).get("routing_iterations"),
        f"train_images_per_s_batch{args.batch_size}": round(train_rate, 1),
        "infer_images_per_s_batch1": round(time_inference(cfg, device, 1, args.seconds), 1),
        "infer_images_per_s_batch128": round(time_inference(cfg, device, 128, args.seconds), 1),
    }
    if get_architecture(args.arch).export is not None:
        result |= train_vs_ort(train_rate, cfg, args.seconds)
    if args.arch == "em":
        result["em_vs_dynamic"] = em_vs_dynamic(
            args.preset, device, args.train_steps, args.seconds, args.routing_iterations
        )
    print(json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

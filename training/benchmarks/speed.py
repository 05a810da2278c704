"""Training and inference speed of the paper CapsNet on this machine (a script, not a test).

    python -m training.benchmarks.speed [--device auto] [--train-steps 5] [--routing sabour] [--amp] [--cpu-time]
    python -m training.benchmarks.speed --arch em --ort-profile 1 32      # ONNX Runtime's time per node only

Prints the machine, then training images/s at batch 128, inference images/s at batch 1 and 128, and
ONNX Runtime's float32 inference images/s at batch 32 for the same model with the ratio training / ORT
(a training step costs about three forward passes, so training can come close to ORT's rate).
With --arch em it also prints `em_vs_dynamic`: EM and dynamic-routing training at batch 32 and their
ONNX Runtime inference at batches 1..64, measured in the same run, with the ratios of the EM speed targets;
on several cores ONNX Runtime is also timed with a caller per core sharing a single-thread session (as the
service runs under load), and `onnx_ratio` compares each model in its faster mode (`onnx_ratio_serial`: serially).
Those measurements alternate between the two models --rounds times (default 3) and keep each rate's best round;
`onnx_ratio_per_round` gives each round's own ratio.
--cpu-time runs everything on one thread and divides by the process's CPU time instead of the wall clock
(images per CPU-second: steadier than wall time on a machine other jobs share). --ort-profile prints only
ONNX Runtime's own profile of the model's graph (one thread): each node's share of the kernel time.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import tempfile
import time
from collections import defaultdict
from typing import Any

import numpy as np
import onnxruntime as ort
import torch

from service.contract import create_session, session_options, usable_cpus
from training.benchmarks.machine import machine_description
from training.benchmarks.raw_ort import parallel_slice
from training.benchmarks.timing import Clock, timed_runs
from training.export.card import INPUT_NAME
from training.export.exporter import DEFAULT_OPSET
from training.export.graphs import ImageGraph, to_onnx
from training.fitting.architectures import get_architecture
from training.fitting.device import keep_freed_memory, resolve_device, synchronize, use_amp
from training.fitting.loop import make_optimizer, optimizer_step
from training.fitting.train import TrainConfig, model_config_for
from training.options import add_device


def time_training(
    cfg: TrainConfig, device: torch.device, steps: int, warmup: int = 2, clock: Clock = time.perf_counter
) -> float:
    """Images/s of full training steps (forward, margin + reconstruction loss, backward, Adam)."""
    arch = get_architecture(cfg.arch)
    model = arch.build(model_config_for(cfg)).to(device).train()
    optimizer = make_optimizer(model, cfg.lr)
    images = torch.rand(cfg.batch_size, 1, 28, 28, device=device)
    labels = torch.randint(0, 10, (cfg.batch_size,), device=device)
    amp = use_amp(cfg.amp, device)
    for k in range(warmup + steps):
        if k == warmup:
            synchronize(device)
            start = clock()
        with torch.autocast(device_type=device.type, dtype=torch.bfloat16, enabled=amp):
            out = arch.forward(model, images, labels)
        optimizer_step(optimizer, arch.loss(out, images, labels, 0.0).total)
    synchronize(device)
    return steps * cfg.batch_size / (clock() - start)


def time_inference(
    cfg: TrainConfig, device: torch.device, batch: int, seconds: float = 3.0, clock: Clock = time.perf_counter
) -> float:
    arch = get_architecture(cfg.arch)
    model = arch.build(model_config_for(cfg)).to(device).eval()
    images = torch.rand(batch, 1, 28, 28, device=device)
    with torch.inference_mode():
        for _ in range(2):
            arch.forward(model, images, None)
        synchronize(device)
        start = clock()
        runs = len(timed_runs(lambda: arch.forward(model, images, None), seconds, clock=clock))
        synchronize(device)
    return runs * batch / (clock() - start)


ORT_BATCH = 32  # the inference batch the training rate is compared with
ORT_BATCHES = (1, 2, 4, 8, 16, 32, 64)
# Parallel callers each hold a batch's votes: EM's paper preset at batch 64 on two callers needs over 20 GiB, and EM
# is fastest at small batches anyway; the serial sweep covers the large ones.
PARALLEL_BATCHES = (1, 2, 4, 8)
EM_TARGETS = {"train_ratio": 0.15, "onnx_ratio": 0.14}  # EM / dynamic on the same machine


def onnx_graph(cfg: TrainConfig) -> tuple[bytes, list[str], tuple[int, ...]]:
    """The model's ONNX graph (random weights), built in memory by the export code: (graph, outputs, input shape)."""
    arch = get_architecture(cfg.arch)
    if arch.export is None:
        raise ValueError(f"architecture {cfg.arch!r} has no ONNX export")
    config = model_config_for(cfg)
    model = arch.build(config).eval()
    spec = arch.export(model, config)
    outputs = [o.name for o in spec.outputs]
    example = torch.rand(2, *spec.input_shape)
    proto = to_onnx(ImageGraph(model, spec).eval(), (example,), [INPUT_NAME], outputs, DEFAULT_OPSET)
    return proto.SerializeToString(), outputs, tuple(spec.input_shape)


def random_images(batch: int, shape: tuple[int, ...]) -> dict[str, np.ndarray]:
    return {INPUT_NAME: np.random.default_rng(0).random((batch, *shape), dtype=np.float32)}


class OnnxTimer:
    """One model's ONNX graph (random weights, built once) timed in ONNX Runtime (CPU, float32): serially on a
    session of `threads` intra-op threads (None: ONNX Runtime's default), or by parallel callers sharing a
    single-thread session, as the service runs batches under load (`CAPSNET_PARALLEL_RUNS`)."""

    def __init__(self, cfg: TrainConfig, threads: int | None = None, clock: Clock = time.perf_counter) -> None:
        self.graph, self.outputs, self.shape = onnx_graph(cfg)
        self.session = create_session(self.graph, "cpu", threads)
        self.clock = clock
        self._narrow: ort.InferenceSession | None = None

    def serial(self, batch: int, seconds: float) -> float:
        """Images/s of back-to-back runs at `batch` for `seconds` (after two warm-up runs)."""
        images = random_images(batch, self.shape)
        for _ in range(2):
            self.session.run(self.outputs, images)
        start = self.clock()
        runs = len(timed_runs(lambda: self.session.run(self.outputs, images), seconds, clock=self.clock))
        return round(runs * batch / (self.clock() - start), 1)

    def parallel(self, batch: int, seconds: float, callers: int) -> float:
        """Images/s (wall clock) of `callers` threads sharing one single-thread session at `batch`."""
        if self._narrow is None:
            self._narrow = create_session(self.graph, "cpu", 1)
        feed = random_images(batch, self.shape)
        for _ in range(2):  # warm-up: the arena grows over a new shape's first runs
            parallel_slice(self._narrow, feed, 0.0, callers)
        images, elapsed, _ = parallel_slice(self._narrow, feed, seconds, callers)
        return round(images / elapsed, 1)


def time_onnx(
    cfg: TrainConfig,
    batches: tuple[int, ...],
    seconds: float,
    clock: Clock = time.perf_counter,
    threads: int | None = None,
) -> dict[int, float]:
    """ONNX Runtime (CPU, float32) images/s of the model's ONNX graph; `threads` None: ONNX Runtime's default."""
    timer = OnnxTimer(cfg, threads, clock)
    return {batch: timer.serial(batch, seconds) for batch in batches}


PROFILE_RUNS = 5  # profiled runs per batch, after a warm-up run (arena growth, first-touch pages) left out
PROFILE_TOP = 25  # nodes listed per batch


def profile_onnx(cfg: TrainConfig, batch: int, top: int = PROFILE_TOP) -> dict[str, Any]:
    """ONNX Runtime's profile of the model's graph at one batch, one thread (SessionOptions.enable_profiling).

    Each node's kernel time is its fastest of PROFILE_RUNS runs after a warm-up run, summed per (op type, output
    shape); returns the rate while profiling, the kernel ms of one run, and the `top` entries as shares of it.
    """
    graph, outputs, shape = onnx_graph(cfg)
    with tempfile.TemporaryDirectory() as tmp:
        session = create_session(graph, "cpu", options=session_options(1, profile_prefix=os.path.join(tmp, "ort")))
        images = random_images(batch, shape)
        session.run(outputs, images)
        start = time.process_time()
        for _ in range(PROFILE_RUNS):
            session.run(outputs, images)
        rate = PROFILE_RUNS * batch / (time.process_time() - start)
        with open(session.end_profiling()) as f:
            events = json.load(f)
    warm = next(e for e in events if e.get("cat") == "Session" and e["name"] == "model_run")
    fastest: dict[str, float] = {}  # node -> its fastest run: a busy machine's preemptions only ever add time
    kind: dict[str, str] = {}
    for e in events:
        if e.get("cat") == "Node" and e["name"].endswith("_kernel_time") and e["ts"] > warm["ts"] + warm["dur"]:
            shapes = [next(iter(t.values())) for t in e["args"].get("output_type_shape", [])]
            kind[e["name"]] = f"{e['args']['op_name']} {shapes[0] if shapes else []}"
            fastest[e["name"]] = min(e["dur"], fastest.get(e["name"], float("inf")))
    kernel: dict[str, float] = defaultdict(float)
    for name, dur in fastest.items():
        kernel[kind[name]] += dur
    total = sum(kernel.values())
    ranked = sorted(kernel.items(), key=lambda item: -item[1])[:top]
    return {
        "images_per_cpu_s_while_profiling": round(rate, 1),
        "kernel_ms_per_run": round(total / 1000, 1),
        "nodes": {k: round(v / total, 3) for k, v in ranked},
    }


def train_vs_ort(
    train_rate: float, cfg: TrainConfig, seconds: float, clock: Clock, threads: int | None
) -> dict[str, float]:
    """ORT float32 batch-32 inference rate of the same model, and training rate / that rate."""
    ort_rate = time_onnx(cfg, (ORT_BATCH,), seconds, clock, threads)[ORT_BATCH]
    return {
        f"ort_float32_infer_images_per_s_batch{ORT_BATCH}": ort_rate,
        "train_to_ort_ratio": round(train_rate / ort_rate, 3),
    }


ORT_ROUNDS = 3  # alternations of the two models' ONNX Runtime measurements in `em_vs_dynamic`

Rates = dict[str, dict[int, float]]  # mode ("serial", "parallel") -> batch -> images/s


def em_vs_dynamic(
    preset: str,
    device: torch.device,
    steps: int,
    seconds: float,
    iterations: int | None = None,
    clock: Clock = time.perf_counter,
    threads: int | None = None,
    rounds: int = ORT_ROUNDS,
) -> dict[str, Any]:
    """EM against the paper's dynamic CapsNet in one run: training at batch 32, ONNX Runtime at batches 1..64.

    The dynamic model is the paper's (its tiny preset when `preset` is tiny, for smoke tests); `iterations`
    sets EM's routing iterations (None: the trained default, 2; the paper routes 3 times). ONNX Runtime's
    measurements alternate between the two models `rounds` times, and each rate is the best of its rounds: the
    EM graph is bound by memory traffic, so whatever else shares the host's memory bandwidth moves its rate far
    more than the dynamic model's (a quarter between two single-window runs minutes apart). Each round's own
    ratio is kept (`onnx_ratio_per_round`), so the spread shows.
    """
    em = TrainConfig(arch="em", preset=preset, batch_size=32, routing_iterations=iterations)
    dynamic = TrainConfig(arch="dynamic", preset="tiny" if preset == "tiny" else "paper", batch_size=32)
    # ONNX Runtime first: after the EM training steps (GiBs of votes) the process is larger and inference slower
    timers = {"em": OnnxTimer(em, threads, clock), "dynamic": OnnxTimer(dynamic, threads, clock)}
    callers = usable_cpus()
    modes = ["serial"] + (["parallel"] if threads is None and callers > 1 else [])  # wall clock, several cores
    batches = {  # the dynamic model at its batch 32 only; EM over its sweep
        ("em", "serial"): ORT_BATCHES,
        ("em", "parallel"): PARALLEL_BATCHES,
        ("dynamic", "serial"): (32,),
        ("dynamic", "parallel"): (32,),
    }

    def measure(timer: OnnxTimer, mode: str, batch: int) -> float:
        return timer.serial(batch, seconds) if mode == "serial" else timer.parallel(batch, seconds, callers)

    per_round: list[dict[str, Rates]] = [
        {
            name: {mode: {b: measure(timer, mode, b) for b in batches[name, mode]} for mode in modes}
            for name, timer in timers.items()
        }
        for _ in range(max(1, rounds))
    ]
    best: dict[str, Rates] = {
        name: {mode: {b: max(r[name][mode][b] for r in per_round) for b in per_round[0][name][mode]} for mode in modes}
        for name in timers
    }
    train = {c.arch: time_training(c, device, steps, clock=clock) for c in (em, dynamic)}
    mode, batch = max(((m, b) for m in modes for b in best["em"][m]), key=lambda mb: best["em"][mb[0]][mb[1]])

    def top(rates: Rates) -> float:
        return max(v for by_batch in rates.values() for v in by_batch.values())

    parallel = "parallel" in modes
    return {
        "train_images_per_s_batch32": {k: round(v, 1) for k, v in train.items()},
        "train_ratio": round(train["em"] / train["dynamic"], 3),
        "onnx_rounds": len(per_round),
        "onnx_images_per_s_em": best["em"]["serial"],
        "onnx_images_per_s_dynamic_batch32": best["dynamic"]["serial"][32],
        "onnx_images_per_s_em_parallel": best["em"]["parallel"] if parallel else None,
        "onnx_images_per_s_dynamic_batch32_parallel": best["dynamic"]["parallel"][32] if parallel else None,
        "onnx_parallel_callers": callers if parallel else None,
        "onnx_best_em": {"mode": mode, "batch": batch},
        "onnx_best_batch_em": batch,
        "onnx_ratio": round(best["em"][mode][batch] / top(best["dynamic"]), 3),
        "onnx_ratio_per_round": [round(top(r["em"]) / top(r["dynamic"]), 3) for r in per_round],
        "onnx_ratio_serial": round(max(best["em"]["serial"].values()) / best["dynamic"]["serial"][32], 3),
        # the batch sweep's collapse check: serial runs, the largest batch against the best one
        "onnx_largest_batch_vs_best": round(
            best["em"]["serial"][ORT_BATCHES[-1]] / max(best["em"]["serial"].values()), 3
        ),
        "targets": EM_TARGETS,
    }


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m training.benchmarks.speed", description=__doc__.splitlines()[0])
    p.add_argument("--arch", default="dynamic", choices=["dynamic", "em"], help="architecture (default: dynamic)")
    p.add_argument("--preset", default="paper", choices=["paper", "small", "tiny"], help="model size (default: paper)")
    add_device(p)
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
    p.add_argument(
        "--rounds",
        type=int,
        default=ORT_ROUNDS,
        help=f"with --arch em: alternations of the two models' ONNX Runtime measurements; each rate is the best of "
        f"its rounds, and each round's ratio is printed too (default: {ORT_ROUNDS})",
    )
    p.add_argument(
        "--cpu-time",
        action="store_true",
        help="one thread (PyTorch and ONNX Runtime), rates per CPU-second of this process (default: wall clock)",
    )
    p.add_argument(
        "--glibc-malloc-defaults",
        action="store_true",
        help="leave glibc's malloc as it is instead of tuning it as capsnet-train does (keep_freed_memory), to "
        "measure what the tuning gives (default: tuned)",
    )
    p.add_argument(
        "--ort-profile",
        type=int,
        nargs="+",
        metavar="BATCH",
        default=None,
        help="print only ONNX Runtime's per-node profile of the model's graph at these batches (default: off)",
    )
    return p


def main(argv: list[str] | None = None) -> int:
    p = build_parser()
    args = p.parse_args(argv)
    if args.rounds < 1:
        p.error(f"--rounds must be at least 1, got {args.rounds}")
    if args.ort_profile is not None and min(args.ort_profile) < 1:
        p.error(f"--ort-profile batches must be at least 1, got {min(args.ort_profile)}")
    tuned = False if args.glibc_malloc_defaults else keep_freed_memory()  # as capsnet-train runs
    cfg = TrainConfig(
        arch=args.arch,
        preset=args.preset,
        routing=args.routing,
        routing_iterations=args.routing_iterations,
        batch_size=args.batch_size,
        amp=args.amp,
    )
    torch.manual_seed(0)
    if args.ort_profile is not None:
        profile = {str(b): profile_onnx(cfg, b) for b in args.ort_profile}
        print(json.dumps({"arch": args.arch, "preset": args.preset, "ort_profile": profile}, indent=2))
        return 0
    device = resolve_device(args.device)
    clock, threads = (time.process_time, 1) if args.cpu_time else (time.perf_counter, None)
    if args.cpu_time:
        torch.set_num_threads(1)
    train_rate = time_training(cfg, device, args.train_steps, clock=clock)
    result = {
        "machine": machine_description(device),
        "arch": args.arch,
        "preset": args.preset,
        "routing": args.routing or "default",
        "routing_iterations": model_config_for(cfg).get("routing_iterations"),
        "clock": "cpu, 1 thread" if args.cpu_time else "wall",
        "malloc": "tuned as capsnet-train (keep_freed_memory)"
        if tuned
        else ("glibc defaults" if args.glibc_malloc_defaults else "the C library's defaults (not glibc)"),
        f"train_images_per_s_batch{args.batch_size}": round(train_rate, 1),
        "peak_rss_gib_after_training": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20, 2),
        "infer_images_per_s_batch1": round(time_inference(cfg, device, 1, args.seconds, clock), 1),
        "infer_images_per_s_batch128": round(time_inference(cfg, device, 128, args.seconds, clock), 1),
    }
    if get_architecture(args.arch).export is not None:
        result |= train_vs_ort(train_rate, cfg, args.seconds, clock, threads)
    if args.arch == "em":
        result["em_vs_dynamic"] = em_vs_dynamic(
            args.preset, device, args.train_steps, args.seconds, args.routing_iterations, clock, threads, args.rounds
        )
    print(json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

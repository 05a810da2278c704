"""Two training runs with one thread each, or one run with two threads: which trains more images per second here.

    python -m training.benchmarks.threads [--arch baseline dynamic] [--steps 4] [--batch-size 128] [--amp]

Each layout runs in fresh processes, so one cannot warm the other's caches: `1x1` is one run with one thread,
`1x2` one run with two threads, and `2x1` two runs with one thread each at the same time (their images/s summed).
Prints one JSON object: the machine, and per architecture each layout's images/s and `2x1 / 1x2`, the figure
that says whether the report's background runs should go two at a time. Needs a quiet machine.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from typing import Any

LAYOUTS = {"1x1": (1, 1), "1x2": (1, 2), "2x1": (2, 1)}  # name: (processes, threads per process)


def worker(arch: str, steps: int, batch: int, amp: bool) -> float:
    """Images/s of `steps` training steps in this process (its thread count set by the caller's environment)."""
    import torch

    from training.benchmarks.speed import time_training
    from training.fitting.train import TrainConfig

    torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS", "1")))
    cfg = TrainConfig(arch=arch, batch_size=batch, amp=amp, device="cpu")
    return time_training(cfg, torch.device("cpu"), steps, warmup=1)


def run_layout(arch: str, processes: int, threads: int, steps: int, batch: int, amp: bool) -> list[float]:
    """Start `processes` workers of `threads` threads at once; each one's images/s."""
    env = {**os.environ, "OMP_NUM_THREADS": str(threads), "MKL_NUM_THREADS": str(threads)}
    cmd = [sys.executable, "-m", "training.benchmarks.threads", "--worker", "--arch", arch, "--steps", str(steps),
           "--batch-size", str(batch)] + (["--amp"] if amp else [])  # fmt: skip
    procs = [subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, text=True) for _ in range(processes)]
    rates = []
    for p in procs:
        out, _ = p.communicate()
        if p.returncode != 0:
            raise RuntimeError(f"a {arch} worker failed with exit {p.returncode}")
        rates.append(float(out.strip().splitlines()[-1]))
    return rates


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument(
        "--arch", nargs="+", default=["baseline", "dynamic"], help="architectures to time (default: baseline dynamic)"
    )
    parser.add_argument(
        "--steps", type=int, default=4, help="timed training steps per worker, after one warm-up (default: 4)"
    )
    parser.add_argument("--batch-size", type=int, default=128, help="training batch (default: 128)")
    parser.add_argument("--amp", action="store_true", help="bfloat16 autocast, as the report's runs use (default: off)")
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.worker:
        print(worker(args.arch[0], args.steps, args.batch_size, args.amp))
        return 0
    import torch

    from training.benchmarks.machine import machine_description

    result: dict[str, Any] = {
        "machine": machine_description(torch.device("cpu")), "steps": args.steps, "batch_size": args.batch_size,
        "amp": args.amp, "architectures": {},
    }  # fmt: skip
    for arch in args.arch:
        try:
            rates = {
                name: run_layout(arch, n, t, args.steps, args.batch_size, args.amp) for name, (n, t) in LAYOUTS.items()
            }
        except RuntimeError as e:
            print(f"threads: error: {e}", file=sys.stderr)
            return 2
        total = {name: round(sum(r), 2) for name, r in rates.items()}
        result["architectures"][arch] = {
            "images_per_second": total,
            "per_process": {name: [round(x, 2) for x in r] for name, r in rates.items()},
            "two_runs_over_one": round(total["2x1"] / total["1x2"], 3),
        }
        print(json.dumps({arch: result["architectures"][arch]}), file=sys.stderr, flush=True)
    print(json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())

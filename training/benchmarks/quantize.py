"""`capsnet-quantize bench`: raw ONNX Runtime throughput of two model directories, alternated in rounds."""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import onnxruntime as ort

from service.contract import GRAPH_FILE, create_session, default_intra_op_threads, load_model_dir
from training.benchmarks.raw_ort import raw_slice
from training.entry import cli_error
from training.options import add_threads

BENCH_BATCHES = (1, 32)


def _throughput(session: ort.InferenceSession, feed: dict[str, np.ndarray], seconds: float) -> tuple[float, float]:
    """(images/s, CPU seconds per image) of back-to-back runs of `feed` for at least `seconds` (and 3 runs).

    The CPU time is this process's (all of ONNX Runtime's threads): other jobs on a shared machine
    stretch the wall time of a run far more than the work it does.
    """
    batch = len(next(iter(feed.values())))
    session.run(None, feed)
    start, cpu = time.perf_counter(), time.process_time()
    images = batch * len(raw_slice(session, feed, seconds))
    return images / (time.perf_counter() - start), (time.process_time() - cpu) / images


def benchmark(
    baseline_dir: str | os.PathLike[str],
    candidate_dir: str | os.PathLike[str],
    *,
    rounds: int = 5,
    seconds: float = 2.0,
    threads: int | None = None,
    batches: Sequence[int] = BENCH_BATCHES,
) -> dict[str, Any]:
    """Raw ONNX Runtime images/s of two model directories at each batch size, alternated in rounds; ratios per round.

    Also the CPU time per image of each and its ratio (SECOND's speed-up in CPU time), steadier than the
    wall-time ratio on a busy machine but blind to how well each graph spreads over the threads.

    Sessions use the service's options (`service.runtime.model_dir.create_session` on CPU; intra-op threads
    from $OMP_NUM_THREADS or ONNX Runtime's default unless `threads` is given). Random images: the speed of
    these graphs does not depend on the pixels.
    """
    threads = threads or default_intra_op_threads()
    models = {}
    for path in (Path(baseline_dir), Path(candidate_dir)):
        card = load_model_dir(path).raw_card
        models[card["name"]] = (create_session(path / GRAPH_FILE, "cpu", threads), card)
    if len(models) != 2:
        raise ValueError(f"both model directories hold a model named {next(iter(models))!r}: nothing to compare")
    (base, (base_session, base_card)), (cand, (cand_session, _)) = models.items()
    rng = np.random.default_rng(0)
    shape = base_card["input"]["shape"][1:]
    results: dict[str, Any] = {"threads": threads, "rounds": rounds, "seconds_per_measurement": seconds, "batches": {}}
    for b in batches:
        feed = {base_card["input"]["name"]: rng.random((b, *shape), dtype=np.float32)}
        rates: dict[str, list[float]] = {base: [], cand: []}
        cpu: dict[str, list[float]] = {base: [], cand: []}
        for _ in range(rounds):
            for name, session in ((base, base_session), (cand, cand_session)):
                rate, cpu_per_image = _throughput(session, feed, seconds)
                rates[name].append(rate)
                cpu[name].append(cpu_per_image)
        ratios = [c / f for f, c in zip(rates[base], rates[cand], strict=True)]
        cpu_ratios = [f / c for f, c in zip(cpu[base], cpu[cand], strict=True)]
        results["batches"][str(b)] = {
            f"{base}_images_per_second": round(statistics.median(rates[base]), 1),
            f"{cand}_images_per_second": round(statistics.median(rates[cand]), 1),
            "ratio_median": round(statistics.median(ratios), 3),
            "ratio_per_round": [round(r, 3) for r in ratios],
            f"{base}_cpu_ms_per_image": round(1000 * statistics.median(cpu[base]), 3),
            f"{cand}_cpu_ms_per_image": round(1000 * statistics.median(cpu[cand]), 3),
            "cpu_ratio_median": round(statistics.median(cpu_ratios), 3),
        }
    return results


def build_bench_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="capsnet-quantize bench",
        description="Raw ONNX Runtime throughput of two model directories at batch 1 and 32, alternated in rounds "
        "so drift on a shared machine hits both; prints JSON with the speed ratio SECOND / FIRST in wall time (the "
        "target's measure) and in CPU time per image (steadier on a busy machine).",
    )
    p.add_argument("baseline", metavar="FIRST", help="model directory, e.g. model/zoo/capsnet-mnist")
    p.add_argument("candidate", metavar="SECOND", help="model directory, e.g. model/zoo/capsnet-mnist-int8")
    p.add_argument("--rounds", type=int, default=5, help="alternating rounds per batch size (default: 5)")
    p.add_argument("--seconds", type=float, default=2.0, help="seconds per measurement (default: 2.0)")
    add_threads(p, "intra-op threads", default_text="the CPU quota, as the service")
    return p


def main(argv: list[str]) -> int:
    args = build_bench_parser().parse_args(argv)
    if args.rounds < 1 or args.seconds <= 0:
        print("capsnet-quantize bench: error: --rounds must be >= 1 and --seconds > 0", file=sys.stderr)
        return 2
    try:
        result = benchmark(
            args.baseline, args.candidate, rounds=args.rounds, seconds=args.seconds, threads=args.threads
        )
    except ValueError as e:
        return cli_error("capsnet-quantize bench", e)
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

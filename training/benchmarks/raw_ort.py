"""Raw ONNX Runtime timing, the reference every benchmark compares with: serial runs on one session with every
intra-op thread, and parallel callers sharing a single-thread session (as the service's parallel runs do)."""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass

import numpy as np
import onnxruntime as ort

from service.contract import ModelCard
from training.benchmarks.timing import timed_runs


def percentile_ms(latencies: list[float], q: float) -> float:
    return float(np.percentile(np.array(latencies) * 1000.0, q)) if latencies else float("nan")


def parallel_slice(
    session: ort.InferenceSession, feed: dict[str, np.ndarray], seconds: float, callers: int
) -> tuple[int, float, list[float]]:
    """`callers` threads run the batch in `feed` on one session for `seconds` (each at least 3 times), as the
    service's parallel runs do: (images, wall seconds, the latency of each run)."""
    latencies: list[list[float]] = [[] for _ in range(callers)]
    batch = len(next(iter(feed.values())))
    start = time.perf_counter()

    def call(mine: list[float]) -> None:
        mine += timed_runs(lambda: session.run(None, feed), seconds, min_runs=3)

    threads = [threading.Thread(target=call, args=(mine,)) for mine in latencies]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    elapsed = time.perf_counter() - start
    return batch * sum(len(m) for m in latencies), elapsed, [x for m in latencies for x in m]


def parallel_sweep(
    session: ort.InferenceSession, card: ModelCard, batches: list[int], seconds: float, callers: int
) -> list[RawRow]:
    """Raw throughput of `callers` threads sharing one single-thread session, at each batch."""
    rows = []
    for batch in batches:
        feed = random_feed(card, batch)
        parallel_slice(session, feed, 0.0, callers)  # warm-up
        cpu = time.process_time()
        images, elapsed, latencies = parallel_slice(session, feed, seconds, callers)
        cpu_ms = 1000 * (time.process_time() - cpu) / images
        rows.append(RawRow(batch, len(latencies), images / elapsed, percentile_ms(latencies, 50), cpu_ms))
        print(f"  {card.name} raw batch {batch:4d} x{callers} callers, 1 thread each: {images / elapsed:9.1f} img/s")
    return rows


def raw_slice(session: ort.InferenceSession, feed: dict[str, np.ndarray], seconds: float) -> list[float]:
    """Run the batch in `feed` for `seconds` (at least 3 runs), serially; the latency of each run."""
    return parallel_slice(session, feed, seconds, 1)[2]


def random_feed(card: ModelCard, batch: int) -> dict[str, np.ndarray]:
    return {card.input.name: np.random.default_rng(batch).random((batch, *card.image_shape), dtype=np.float32)}


def raw_sweep(session: ort.InferenceSession, card: ModelCard, batches: list[int], seconds: float) -> list[RawRow]:
    rows = []
    for batch in batches:
        feed = random_feed(card, batch)
        raw_slice(session, feed, 0.0)  # warm-up
        times = RawTimes([])
        times.add(session, feed, seconds)
        images = batch * len(times.latencies)
        rows.append(
            RawRow(
                batch,
                len(times.latencies),
                images / sum(times.latencies),
                percentile_ms(times.latencies, 50),
                1000 * times.cpu_s / images,
            )
        )
        r = rows[-1]
        print(f"  {card.name} raw batch {batch:4d}: {r.throughput:9.1f} img/s  p50 {r.p50_ms:8.2f} ms", flush=True)
    return rows


@dataclass
class RawRow:
    batch: int
    runs: int
    throughput: float  # images/s
    p50_ms: float
    cpu_ms_per_image: float  # process CPU time (every ONNX Runtime thread) per image


@dataclass
class RawTimes:
    """Raw ONNX Runtime latencies and CPU time gathered over several slices."""

    latencies: list[float]
    cpu_s: float = 0.0

    def add(self, session: ort.InferenceSession, feed: dict[str, np.ndarray], seconds: float) -> None:
        cpu = time.process_time()
        self.latencies += raw_slice(session, feed, seconds)
        self.cpu_s += time.process_time() - cpu


@dataclass(frozen=True)
class Parallel:
    """Raw parallel runs: a single-thread session, `callers` threads, at the batch that was fastest so."""

    session: ort.InferenceSession
    callers: int
    best_batch: int

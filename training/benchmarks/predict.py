"""capsnet-predict's throughput on MNIST IDX input against raw ONNX Runtime's best batched rate, and Ray's overhead.

    python -m training.benchmarks.predict --data-dir ../shared/data/mnist [--ray]

Raw: the test images already in memory as float32, one session with the job's threads, each batch size in turn;
the best rate is the reference. Job: the whole single-machine job (read the IDX file, prepare, run, score, write
Parquet) over the same images. Ray: the same job as a Ray Data pipeline on a local Ray instance. The runs alternate
`--repeats` times and the best of each is kept, so that a burst of other work on the machine hurts neither side alone.
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from service.contract import cpu_busy_percent, cpu_model, create_session, load_average, load_model_dir, usable_cpus
from training.data.mnist import find_idx_file, resolve_data_dir
from training.options import add_data_dir
from training.predict.job import JobConfig, run_job
from training.predict.predictor import PredictOptions, Predictor, default_threads
from training.predict.sources import IdxSource, open_source

TEST_IMAGES = "t10k-images-idx3-ubyte"


def test_images(path: Path, n: int) -> np.ndarray:
    """The first `n` images as the model's input (N, 1, 28, 28) float32, pixel / 255 as the job computes it."""
    source = IdxSource(path, None)
    pixels = np.stack([item.pixels for _, item in zip(range(n), source.items(), strict=False)])
    return (pixels.astype(np.float64) / 255.0).astype(np.float32)[:, None]


@dataclass
class Rate:
    """The best images per second of wall time, and the least CPU time (every thread of this process) per image."""

    per_second: float = 0.0
    cpu_ms: float = float("inf")

    def add(self, images: int, wall: float, cpu: float) -> Rate:
        self.per_second = max(self.per_second, images / wall)
        self.cpu_ms = min(self.cpu_ms, 1000 * cpu / images)
        return self

    def __str__(self) -> str:
        return f"{self.per_second:8.1f} images/s, {self.cpu_ms:6.2f} ms CPU per image"


def raw_run(model: Path, images: np.ndarray, batch: int, threads: int | None) -> tuple[int, float, float]:
    """(images, wall seconds, CPU seconds) of back-to-back runs of `batch` images on one session, after a warm-up."""
    session = create_session(load_model_dir(model).graph, "cpu", threads)
    name = session.get_inputs()[0].name
    session.run(None, {name: images[:batch]})
    start, cpu = time.perf_counter(), time.process_time()
    for i in range(0, len(images), batch):
        session.run(None, {name: images[i : i + batch]})
    return len(images), time.perf_counter() - start, time.process_time() - cpu


def job_run(model: Path, path: Path, n: int, options: PredictOptions, workers: int) -> tuple[int, float, float]:
    """(images, wall seconds, CPU seconds) of the single-machine job over the first `n` images of `path`."""
    predictor = Predictor(model, options)
    with tempfile.TemporaryDirectory() as out:
        config = JobConfig(out=Path(out) / "job", workers=workers, limit=n, progress=False)
        start, cpu = time.perf_counter(), time.process_time()
        run_job(open_source(path), predictor, config, {"path": os.fspath(path)})
        return n, time.perf_counter() - start, time.process_time() - cpu


def ray_rate(model: Path, path: Path, n: int, options: PredictOptions) -> tuple[float, float]:
    """(images per second of the Ray job, seconds to start the local Ray instance)."""
    import ray

    from training.predict.ray_job import run_ray_job

    start = time.perf_counter()
    if not ray.is_initialized():
        ray.init(num_cpus=usable_cpus(), include_dashboard=False, log_to_driver=False)
    started = time.perf_counter() - start
    with tempfile.TemporaryDirectory() as out:
        start = time.perf_counter()
        run_ray_job(path, load_model_dir(model), options, Path(out) / "ray", limit=n)
        return n / (time.perf_counter() - start), started


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m training.benchmarks.predict", description=__doc__.splitlines()[0])
    add_data_dir(p)
    p.add_argument(
        "--model",
        type=Path,
        default=Path("model/zoo/capsnet-mnist"),
        help="model directory (default: model/zoo/capsnet-mnist)",
    )
    p.add_argument("--images", type=int, default=10_000, help="test images per run (default: 10000, all)")
    p.add_argument("--batches", default="16,32,64,128", help="raw batch sizes (default: 16,32,64,128)")
    p.add_argument("--batch-size", type=int, default=32, help="the job's batch size (default: 32)")
    p.add_argument("--repeats", type=int, default=2, help="alternating rounds, best kept (default: 2)")
    p.add_argument("--ray", action="store_true", help="also run the Ray Data job on a local Ray (default: off)")
    p.add_argument("--dry-run", action="store_true", help="256 images, one round, batch 64 only")
    args = p.parse_args(argv)
    path = find_idx_file(resolve_data_dir(args.data_dir), TEST_IMAGES)
    n, batches, repeats = args.images, [int(b) for b in args.batches.split(",")], args.repeats
    if args.dry_run:
        n, batches, repeats = 256, [64], 1
    n = min(n, IdxSource(path, None).count())
    threads = default_threads()
    options = PredictOptions(batch_size=args.batch_size, threads=threads)
    print(
        f"machine: {cpu_model()}, {usable_cpus()} usable CPUs, load average {load_average()}, "
        f"busy {cpu_busy_percent()}% before the runs"
    )
    print(f"model {args.model.name}, {n} MNIST test images from {path.name}, {threads} intra-op threads")
    images = test_images(path, n)
    raw = {batch: Rate() for batch in batches}
    job = Rate()
    ray_best = 0.0
    ray_start = None
    for round_ in range(repeats):
        for batch in batches:
            raw[batch].add(*raw_run(args.model, images, batch, threads))
            print(f"  round {round_ + 1} raw batch {batch:4d}: {raw[batch]} (best so far)", flush=True)
        job.add(*job_run(args.model, path, n, options, workers=threads))
        print(f"  round {round_ + 1} capsnet-predict: {job} (best so far)", flush=True)
        if args.ray:
            rate, started = ray_rate(args.model, path, n, PredictOptions(batch_size=args.batch_size, threads=1))
            ray_best, ray_start = max(ray_best, rate), ray_start if ray_start is not None else started
            print(f"  round {round_ + 1} capsnet-predict --engine ray: {ray_best:8.1f} images/s (best so far)")
    best = max(raw, key=lambda b: raw[b].per_second)
    leanest = min(raw, key=lambda b: raw[b].cpu_ms)
    print(
        f"raw ONNX Runtime: best rate at batch {best}: {raw[best].per_second:.1f} images/s; "
        f"least CPU at batch {leanest}: {raw[leanest].cpu_ms:.2f} ms per image"
    )
    print(
        f"capsnet-predict (local, batch {args.batch_size}): {job.per_second:.1f} images/s = "
        f"{100 * job.per_second / raw[best].per_second:.1f}% of raw's best rate; {job.cpu_ms:.2f} ms CPU per image "
        f"= {100 * raw[leanest].cpu_ms / job.cpu_ms:.1f}% of raw's images per CPU second"
    )
    if args.ray:
        print(
            f"capsnet-predict --engine ray ({usable_cpus()} actors of 1 thread): {ray_best:.1f} images/s = "
            f"{100 * ray_best / job.per_second:.1f}% of the local job "
            f"(overhead {100 * (1 - ray_best / job.per_second):.1f}%); "
            f"starting the local Ray instance took {ray_start:.1f} s more"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

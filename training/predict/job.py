"""The single-machine job: a source streamed through a `Predictor` into Parquet shards, resumable shard by shard.

Shard i holds items [i * shard_size, (i + 1) * shard_size) of the source, written to a temporary file and renamed
when complete: a shard file that exists is finished, and a rerun starts after the last one. Memory is bounded by
the batches in flight, whatever the size of the source.
"""

from __future__ import annotations

import itertools
import json
import logging
import os
import sys
import time
from collections import deque
from collections.abc import Iterable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import pyarrow as pa
import pyarrow.parquet as pq
from tqdm import tqdm

from training.predict.predictor import Predictor, Prepared, Ran, job_fingerprint
from training.predict.sources import Item, Source

logger = logging.getLogger(__name__)

MANIFEST = "_job.json"
PARTIAL_SUFFIX = ".partial"
T = TypeVar("T")


class JobError(RuntimeError):
    """The job cannot start or go on: an output directory of another job, or an unreadable image with fail_fast."""


@dataclass(frozen=True)
class JobConfig:
    out: Path
    shard_size: int = 50_000
    workers: int = 1  # threads preparing images
    fail_fast: bool = False
    overwrite: bool = False
    limit: int | None = None  # only the first `limit` images
    progress: bool | None = None  # None: a bar when stderr is a terminal


@dataclass
class JobResult:
    rows: int = 0  # written by this run
    errors: int = 0
    skipped_shards: int = 0  # finished by an earlier run
    shards: list[Path] = field(default_factory=list)
    seconds: float = 0.0


def part_name(index: int) -> str:
    return f"part-{index:05d}.parquet"


def chunked(items: Iterable[T], size: int) -> Iterator[list[T]]:
    iterator = iter(items)
    while chunk := list(itertools.islice(iterator, size)):
        yield chunk


def shards(items: Iterator[Item], size: int) -> Iterator[Iterator[Item]]:
    """Consecutive runs of `size` items, each a lazy iterator (a shard's images are never all in memory): consume
    each before asking for the next."""
    while (first := next(items, None)) is not None:
        yield itertools.chain([first], itertools.islice(items, size - 1))


def run_job(source: Source, predictor: Predictor, config: JobConfig, describe: dict[str, Any]) -> JobResult:
    """Predict every item of `source` into `config.out`, skipping the shards an earlier run of the same job wrote.

    `describe` names the input (kind, path as given); with the model and options it must match the manifest of an
    existing output directory (a JobError otherwise, unless `overwrite`).
    """
    start_time = time.perf_counter()
    total = source.count()
    if config.limit is not None:
        total = config.limit if total is None else min(total, config.limit)
    manifest = {
        "format": 1,
        "input": describe,
        "limit": config.limit,
        "shard_size": config.shard_size,
        **job_fingerprint(predictor.model, predictor.options),
    }
    prepare_output(config.out, manifest, config.overwrite)
    done = finished_shards(config.out)
    result = JobResult(skipped_shards=done)
    start = done * config.shard_size
    if total is not None and start >= total:
        logger.info("all %d shards of %s were already written", done, config.out)
        finish_manifest(config.out, manifest, done)
        return result
    items: Iterator[Item] = source.items(start)
    if config.limit is not None:
        items = itertools.islice(items, max(0, config.limit - start))
    show = sys.stderr.isatty() if config.progress is None else config.progress
    with tqdm(total=total, initial=start, unit="img", disable=not show, dynamic_ncols=True) as bar:
        for index, shard in enumerate(shards(items, config.shard_size), start=done):
            path = config.out / part_name(index)
            rows, errors = write_shard(path, shard, predictor, config, bar)
            result.rows += rows
            result.errors += errors
            result.shards.append(path)
    finish_manifest(config.out, manifest, done + len(result.shards))
    result.seconds = time.perf_counter() - start_time
    return result


def prepare_output(out: Path, manifest: dict[str, Any], overwrite: bool) -> None:
    """Create `out`, or check that it holds shards of this same job (a JobError naming what differs)."""
    if out.exists() and not out.is_dir():
        raise JobError(f"output {out} exists and is not a directory")
    out.mkdir(parents=True, exist_ok=True)
    file = out / MANIFEST
    if overwrite:
        for old in [*out.glob("part-*.parquet"), *out.glob(f"part-*.parquet{PARTIAL_SUFFIX}"), file]:
            old.unlink(missing_ok=True)
    elif file.is_file():
        existing = json.loads(file.read_text())
        existing.pop("complete", None)
        existing.pop("shards", None)
        differs = sorted(k for k in set(existing) | set(manifest) if existing.get(k) != manifest.get(k))
        if differs:
            raise JobError(
                f"output {out} holds shards of another job (it differs in {', '.join(differs)}); "
                "choose another --out or pass --overwrite"
            )
    elif any(out.iterdir()):
        raise JobError(f"output {out} is not empty and holds no {MANIFEST}; choose another --out or pass --overwrite")
    file.write_text(json.dumps(manifest, indent=2) + "\n")


def finish_manifest(out: Path, manifest: dict[str, Any], shards: int) -> None:
    (out / MANIFEST).write_text(json.dumps({**manifest, "shards": shards, "complete": True}, indent=2) + "\n")


def finished_shards(out: Path) -> int:
    """How many shards, counted from the first, an earlier run finished."""
    count = 0
    while (out / part_name(count)).is_file():
        count += 1
    return count


def write_shard(
    path: Path, items: Iterable[Item], predictor: Predictor, config: JobConfig, bar: tqdm[Any]
) -> tuple[int, int]:
    """Predict `items` into the shard file `path` (renamed into place when complete): (rows, error rows)."""
    partial = path.with_name(path.name + PARTIAL_SUFFIX)
    rows = errors = 0
    with pq.ParquetWriter(partial, predictor.schema) as writer:
        for batch in predicted_batches(predictor, items, config.workers):
            failed = batch.num_rows - batch.column("error").null_count
            if config.fail_fast and failed:
                raise JobError(first_error(batch))
            writer.write_batch(batch)
            rows += batch.num_rows
            errors += failed
            bar.update(batch.num_rows)
    os.replace(partial, path)
    return rows, errors


def first_error(batch: pa.RecordBatch) -> str:
    for source, error in zip(batch.column("source").to_pylist(), batch.column("error").to_pylist(), strict=True):
        if error is not None:
            return f"{source}: {error} (without --fail-fast the error is recorded in the row and the job goes on)"
    raise AssertionError("no error in the batch")


def run_when_prepared(predictor: Predictor, prepared: Future[Prepared]) -> Ran:
    return predictor.run_prepared(prepared.result())


def predicted_batches(predictor: Predictor, items: Iterable[Item], workers: int) -> Iterator[pa.RecordBatch]:
    """Record batches of `items` in order: images are prepared on `workers` threads while earlier batches run on the
    predictor's sessions (ONNX Runtime releases the GIL), at most a few batches in flight."""
    runs = predictor.options.parallel_runs
    depth = workers + runs + 1
    with ThreadPoolExecutor(workers) as prepare, ThreadPoolExecutor(runs) as run:
        inflight: deque[Future[Any]] = deque()
        for chunk in chunked(items, predictor.options.batch_size):
            prepared = prepare.submit(predictor.prepare, chunk)
            inflight.append(run.submit(run_when_prepared, predictor, prepared))
            if len(inflight) >= depth:
                yield predictor.finish(inflight.popleft().result())
        while inflight:
            yield predictor.finish(inflight.popleft().result())

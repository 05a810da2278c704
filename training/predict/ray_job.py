"""The same job as a Ray Data pipeline: read → `map_batches(RayPredictor)` (one ONNX Runtime session per actor) →
`write_parquet`, on the cluster at $RAY_ADDRESS or on a local Ray started for the job.

A folder tree is read with `read_binary_files`: the service's decoder (EXIF orientation, transparency, 16-bit) must
see the original bytes, which `read_images` would decode its own way. IDX, tar and Parquet inputs are split into
ranges of items that the actors read themselves with the job's sources, so that rows carry the same `source` names
as on one machine. Ray retries failed tasks; there is no shard-level resume as in the local job.
"""

from __future__ import annotations

import itertools
import math
import os
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa

from service.contract import ModelDir
from training.predict.predictor import PredictOptions, Predictor
from training.predict.sources import IMAGE_SUFFIXES, FolderSource, Item, SourceError, folder_label, open_source

RANGE_ITEMS = 2048  # most items per task for IDX, tar and Parquet inputs
RANGES_PER_ACTOR = 4  # fewer items per task when the input is small, so that every actor gets work
# Ray's CPU counts are reservations: an actor that took a whole CPU per thread would leave none for the read and
# write tasks beside it, and the pipeline would wait forever on a cluster as small as its actor pool.
ACTOR_CPU_SHARE = 0.8
TASK_CPUS = 0.2


class RayPredictor:
    """A Ray Data actor: one `Predictor` (one session) for its lifetime; each call maps a batch to output rows.

    A batch is either files from `read_binary_files` (columns `bytes`, `path`) or ranges (`start`, `count`) of the
    source at `source_path`, read here.
    """

    def __init__(self, model: str, options: PredictOptions, source: dict[str, Any]) -> None:
        self.predictor = Predictor(model, options)
        self.source_args = source
        self.root = Path(source["path"]).resolve()
        self._source: Any = None

    def __call__(self, batch: dict[str, np.ndarray]) -> pa.Table:
        if "bytes" in batch:
            items = [
                self.file_item(bytes(data), str(path)) for data, path in zip(batch["bytes"], batch["path"], strict=True)
            ]
        else:
            items = []
            for start, count in zip(batch["start"], batch["count"], strict=True):
                items += itertools.islice(self.source().items(int(start)), int(count))
        return pa.Table.from_batches([self.predictor.predict(items)], schema=self.predictor.schema)

    def file_item(self, data: bytes, path: str) -> Item:
        relative = Path(path).resolve().relative_to(self.root).as_posix()
        return Item(relative, folder_label(relative), data=data)

    def source(self) -> Any:
        if self._source is None:
            args = self.source_args
            self._source = open_source(Path(args["path"]), args["labels"], args["image_column"], args["label_column"])
        return self._source


def run_ray_job(
    input_path: Path,
    model: ModelDir,
    options: PredictOptions,
    out: Path,
    *,
    labels: Path | None = None,
    image_column: str = "image",
    label_column: str | None = "label",
    limit: int | None = None,
    overwrite: bool = False,
    actors: int | None = None,
) -> int:
    """Run the job on Ray (connecting to $RAY_ADDRESS, else starting a local Ray); the number of rows written.

    `options.parallel_runs` is ignored: each of `actors` actors (default: the cluster's CPUs / threads per actor)
    holds one session of `options.threads` threads (default 1).
    """
    import ray
    import ray.data

    if not ray.is_initialized():
        ray.init(address=os.environ.get("RAY_ADDRESS") or None, include_dashboard=False, log_to_driver=False)
    context = ray.data.DataContext.get_current()
    context.execution_options.preserve_order = True
    context.enable_progress_bars = sys.stderr.isatty()
    threads = options.threads or 1
    options = PredictOptions(**{**options.__dict__, "threads": threads, "parallel_runs": 1})
    pool = actors or max(1, int(ray.cluster_resources().get("CPU", 1)) // threads)
    source = {
        "path": os.fspath(input_path),
        "labels": None if labels is None else os.fspath(labels),
        "image_column": image_column,
        "label_column": label_column,
    }
    dataset = input_dataset(input_path, source, limit, pool)
    dataset = dataset.map_batches(
        RayPredictor,
        fn_constructor_kwargs={"model": os.fspath(model.path), "options": options, "source": source},
        batch_size=options.batch_size if input_path.is_dir() else 1,
        batch_format="numpy",
        compute=ray.data.ActorPoolStrategy(size=pool),
        num_cpus=threads * ACTOR_CPU_SHARE,
    )
    if out.exists() and any(out.iterdir()) and not overwrite:
        raise SourceError(f"output {out} is not empty; choose another --out or pass --overwrite")
    dataset.write_parquet(os.fspath(out.resolve()), mode="overwrite", ray_remote_args={"num_cpus": TASK_CPUS})
    import pyarrow.parquet as pq

    return sum(pq.ParquetFile(f).metadata.num_rows for f in sorted(out.glob("*.parquet")))


def input_dataset(input_path: Path, source: dict[str, Any], limit: int | None, actors: int) -> Any:
    """Folder: the image files as Ray reads them; else ranges of items for the actors to read."""
    import ray.data

    if input_path.is_dir():
        FolderSource(input_path)  # the same checks (and error for a folder without images) as the local job
        extensions = sorted({s.lstrip(".") for s in IMAGE_SUFFIXES} | {s.lstrip(".").upper() for s in IMAGE_SUFFIXES})
        files = ray.data.read_binary_files(
            os.fspath(input_path.resolve()), include_paths=True, file_extensions=extensions, num_cpus=TASK_CPUS
        )
        return files.limit(limit) if limit is not None else files
    opened = open_source(
        input_path, source["labels"] and Path(source["labels"]), source["image_column"], source["label_column"]
    )
    total = opened.count()
    if total is None:  # a compressed tar: count its images once
        total = sum(1 for _ in opened.items())
    if limit is not None:
        total = min(total, limit)
    size = max(1, min(RANGE_ITEMS, math.ceil(total / (actors * RANGES_PER_ACTOR))))
    ranges = [{"start": s, "count": min(size, total - s)} for s in range(0, total, size)]
    return ray.data.from_items(ranges, override_num_blocks=max(1, len(ranges)))

"""capsnet-predict: pose vectors, classes and "not a digit" scores for a whole dataset, written as Parquet.

Reads a folder tree of images, an MNIST IDX file, a tar of images or a Parquet file; runs a model directory with the
service's preprocessing, sessions and score; on one machine (`--engine local`) or as a Ray Data job (`--engine ray`).
docs/batch-predict.md describes the columns and the options.
"""

from __future__ import annotations

import argparse
import itertools
import logging
import os
import sys
from pathlib import Path

from service.contract import ModelDirError
from training.options import add_threads
from training.predict.predictor import PredictOptions, Predictor, default_threads
from training.predict.sources import Source, SourceError, open_source

EXIT_USAGE = 2
INVERT = {"auto": None, "true": True, "false": False}
RAY_HINT = "pip install -e '.[ray]' (from a clone) or pip install 'capsnet-serve[ray]'"


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="capsnet-predict", description=__doc__.splitlines()[0])
    p.add_argument("input", type=Path, help="a folder of images, an IDX image file, a tar or a Parquet file")
    p.add_argument(
        "--model",
        type=Path,
        default=Path("model/zoo/capsnet-mnist"),
        help="model directory (default: model/zoo/capsnet-mnist)",
    )
    p.add_argument("--out", type=Path, required=True, help="output directory of Parquet shards")
    p.add_argument(
        "--labels",
        type=Path,
        default=None,
        help="IDX label file (default: the *-labels-idx1-ubyte[.gz] beside an MNIST image file)",
    )
    p.add_argument("--image-column", default="image", help="Parquet input: the image column (default: image)")
    p.add_argument("--label-column", default="label", help="Parquet input: the label column if any (default: label)")
    p.add_argument("--all-poses", action="store_true", help="also write every class's pose (default: the winner's)")
    p.add_argument(
        "--invert",
        choices=sorted(INVERT),
        default="auto",
        help="encoded images: auto inverts dark-on-light ones, as the service does (default: auto)",
    )
    p.add_argument(
        "--no-normalize",
        dest="normalize",
        action="store_false",
        help="encoded images: only resize, no MNIST normalization (default: normalize, as the service)",
    )
    p.add_argument(
        "--batch-size",
        type=int,
        default=32,
        help="images per ONNX Runtime run, at most the card's serving.max_batch_size (default: 32)",
    )
    add_threads(
        p, "ONNX Runtime's intra-op threads in all", default_text="$OMP_NUM_THREADS, else ONNX Runtime's choice"
    )
    p.add_argument(
        "--parallel-runs",
        type=int,
        default=None,
        help="sessions running at once (default: 1; the cores for a model limited to one image per run)",
    )
    p.add_argument("--workers", type=int, default=None, help="threads preparing images (default: the cores)")
    p.add_argument("--shard-size", type=int, default=50_000, help="images per output file (default: 50000)")
    p.add_argument("--limit", type=int, default=None, help="only the first N images (default: all)")
    p.add_argument(
        "--fail-fast",
        action="store_true",
        help="stop at the first unreadable image (default: record its error in the row and go on)",
    )
    p.add_argument("--overwrite", action="store_true", help="replace the shards of another job in --out")
    p.add_argument("--no-progress", action="store_true", help="no progress bar (default: one on a terminal)")
    p.add_argument(
        "--engine",
        choices=("local", "ray"),
        default="local",
        help="local: this machine; ray: a Ray Data job on $RAY_ADDRESS or a local Ray, one actor per "
        "--parallel-runs, without --workers, --shard-size, --fail-fast or resumption (default: local)",
    )
    p.add_argument("--dry-run", action="store_true", help="predict one batch here, print it, write nothing")
    return p


def check_arguments(parser: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    for name in ("batch_size", "threads", "parallel_runs", "workers", "shard_size", "limit"):
        value = getattr(args, name)
        if value is not None and value < 1:
            parser.error(f"--{name.replace('_', '-')} must be at least 1, got {value}")


def predict_options(args: argparse.Namespace, max_batch: int | None) -> PredictOptions:
    runs = args.parallel_runs or (default_threads() if max_batch == 1 else 1)
    return PredictOptions(
        invert=INVERT[args.invert],
        normalize=args.normalize,
        batch_size=args.batch_size,
        threads=args.threads,
        parallel_runs=runs,
        all_poses=args.all_poses,
    )


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    check_arguments(parser, args)
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    try:
        return run(args)
    except (SourceError, ModelDirError, OSError) as e:
        print(f"capsnet-predict: error: {e}", file=sys.stderr)
        return EXIT_USAGE
    except ModuleNotFoundError as e:
        if args.engine != "ray" or (e.name or "").split(".")[0] != "ray":
            raise
        print(f"capsnet-predict: error: --engine ray needs Ray: {RAY_HINT}", file=sys.stderr)
        return EXIT_USAGE
    except KeyboardInterrupt:
        print(
            "capsnet-predict: interrupted; run the same command again to resume after the last shard", file=sys.stderr
        )
        return 130


def run(args: argparse.Namespace) -> int:
    from service.contract import load_model_dir
    from training.predict.job import JobConfig, JobError, run_job

    model = load_model_dir(args.model)
    max_batch = model.card.serving.max_batch_size if model.card.serving else None
    options = predict_options(args, max_batch)
    describe = {"path": os.fspath(args.input), "labels": None if args.labels is None else os.fspath(args.labels)}
    if args.engine == "ray" and not args.dry_run:
        from training.predict.ray_job import run_ray_job

        rows = run_ray_job(
            args.input,
            model,
            options,
            args.out,
            labels=args.labels,
            image_column=args.image_column,
            label_column=args.label_column,
            limit=args.limit,
            overwrite=args.overwrite,
            actors=args.parallel_runs,
        )
        print(f"wrote {rows} rows to {args.out} with Ray Data")
        return 0
    source = open_source(args.input, args.labels, args.image_column, args.label_column)
    describe["kind"] = source.kind
    predictor = Predictor(model, options)
    if args.dry_run:
        return dry_run(source, predictor)
    config = JobConfig(
        out=args.out,
        shard_size=args.shard_size,
        workers=args.workers or default_threads(),
        fail_fast=args.fail_fast,
        overwrite=args.overwrite,
        limit=args.limit,
        progress=False if args.no_progress else None,
    )
    try:
        result = run_job(source, predictor, config, describe)
    except JobError as e:
        print(f"capsnet-predict: error: {e}", file=sys.stderr)
        return 1
    rate = result.rows / result.seconds if result.seconds > 0 else 0.0
    skipped = f", {result.skipped_shards} shards kept from an earlier run" if result.skipped_shards else ""
    print(
        f"wrote {result.rows} rows ({result.errors} errors) in {len(result.shards)} shards to {args.out}"
        f"{skipped} in {result.seconds:.1f} s ({rate:.0f} images/s)"
    )
    return 0


def dry_run(source: Source, predictor: Predictor) -> int:
    items = list(itertools.islice(source.items(), predictor.options.batch_size))
    batch = predictor.predict(items)
    columns = ("source", "label", "predicted_label", "ood_score", "error")
    for row in batch.select(list(columns)).to_pylist()[:10]:
        print("  ".join(f"{name}={row[name]}" for name in columns))
    print(f"dry run: {batch.num_rows} images predicted, nothing written")
    return 0


if __name__ == "__main__":
    sys.exit(main())

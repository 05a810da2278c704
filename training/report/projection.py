"""How much more training a report run's curve says it needs: a power law fitted to its test error.

    python -m training.report.projection runs/report/baseline/baseline-mnist/metrics.jsonl --target 0.006 \
        --epoch-images 30000 [--key test_error] [--last N]

Fits log(error) = log(a) - b log(images) by least squares to the last `--last` epochs of a `metrics.jsonl` (by
default its second half; epoch k has seen k x `--epoch-images` images) and prints one JSON object: the slope b, the
images at which the line reaches `--target`, how many more that is, and the hours they take at the run's own
images/s. A curve that is not falling (b <= 0), or falls too slowly to get there within 1e15 images, reaches no
target. A power law without a floor is the optimistic reading of a curve that flattens: when even it needs more than
three times a run's planned compute, the target is out of that run's reach.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np

MIN_POINTS = 2
NEVER = 1e15  # training images beyond which a curve is said to reach no target (and floats would overflow)


@dataclass(frozen=True)
class Projection:
    """Where a curve's power law reaches a target error; `images_to_target` is None when it never does."""

    target: float
    epochs_fitted: int
    images_done: int
    error_now: float  # the fitted line's error at images_done
    best_error: float  # the lowest error the run measured
    slope: float  # b in error ~ images^-b
    images_to_target: int | None
    images_more: int | None
    hours_more: float | None  # at the run's mean images/s over the fitted epochs

    @property
    def reached(self) -> bool:
        return self.best_error <= self.target


def project(rows: list[dict[str, Any]], target: float, epoch_images: int, key: str = "test_error",
            last: int | None = None) -> Projection:  # fmt: skip
    """The power-law projection of `rows` (metrics.jsonl rows in epoch order) to `target` error, fitted to the
    `last` epochs (default: the second half of the curve, where its slope is its present one)."""
    if target <= 0 or epoch_images < 1 or (last is not None and last < MIN_POINTS):
        raise ValueError(f"--target must be above 0, --epoch-images at least 1 and --last at least {MIN_POINTS}")
    points = [(int(r["epoch"]) * epoch_images, float(r[key]), r) for r in rows if r.get(key) is not None]
    points = [p for p in points if p[1] > 0]
    points = points[-(last if last is not None else max(MIN_POINTS, math.ceil(len(points) / 2))) :]
    if len(points) < MIN_POINTS:
        raise ValueError(f"fitting needs at least 2 epochs with a positive {key}; the file has {len(points)}")
    fall, intercept = np.polyfit(np.log([n for n, _, _ in points]), np.log([e for _, e, _ in points]), 1)
    slope = float(-fall)
    done = points[-1][0]
    error_now = math.exp(intercept - slope * math.log(done))
    best = min(float(r[key]) for r in rows if r.get(key) is not None)
    rates = [float(r["images_per_second"]) for _, _, r in points if r.get("images_per_second")]
    rate = sum(rates) / len(rates) if rates else None
    to_target: int | None = None
    if best <= target:
        to_target = min(n for n, e, _ in points if e <= target) if any(e <= target for _, e, _ in points) else done
    elif slope > 0 and (log_images := math.log(done) + math.log(error_now / target) / slope) < math.log(NEVER):
        to_target = math.ceil(math.exp(log_images))
    more = None if to_target is None else max(0, to_target - done)
    hours = None if more is None or not rate else round(more / rate / 3600, 1)
    return Projection(target, len(points), done, round(error_now, 6), best, round(slope, 4), to_target, more, hours)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("metrics", type=Path, help="a run's metrics.jsonl (one JSON object per epoch)")
    p.add_argument("--target", type=float, required=True, help="the error to reach, e.g. 0.006 (required)")
    p.add_argument("--epoch-images", type=int, default=60000, help="training images per epoch (default: 60000)")
    p.add_argument("--key", default="test_error", help="the column to project (default: test_error)")
    p.add_argument("--last", type=int, default=None, help="epochs fitted (default: the second half of the curve)")
    args = p.parse_args(argv)
    try:
        rows = [json.loads(line) for line in args.metrics.read_text().splitlines() if line.strip()]
        result = project(rows, args.target, args.epoch_images, args.key, args.last)
    except (OSError, ValueError, KeyError) as e:
        print(f"projection: error: {e}", file=sys.stderr)
        return 2
    print(json.dumps({"metrics": str(args.metrics), "key": args.key, **asdict(result), "reached": result.reached}))
    return 0


if __name__ == "__main__":
    sys.exit(main())

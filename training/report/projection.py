"""How much more training a report run's curve says it needs: a power law fitted to its test error.

    python -m training.report.projection runs/report/baseline/baseline-mnist/metrics.jsonl --target 0.006 \
        --epoch-images 30000 [--key test_error] [--last N]

Fits log(error) = log(a) - b log(images) by least squares to the best error so far at each of the last `--last`
epochs of a `metrics.jsonl` (by default its second half; epoch k has seen k x `--epoch-images` images) and prints
one JSON object: the slope b, the images at which the line reaches `--target`, how many more that is, and the hours
they take at the run's own images/s. A curve that is not falling (b <= 0), or falls too slowly to get there within
1e15 images, reaches no target. A power law without a floor is the optimistic reading of a curve that flattens: when
even it needs more than three times a run's planned compute, the target is out of that run's reach. `verdict` and
`outlook` say so in words.
"""

from __future__ import annotations

import argparse
import itertools
import json
import math
import sys
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np

MIN_POINTS = 2
NEVER = 1e15  # training images beyond which a curve is said to reach no target (and floats would overflow)
REACH = 3  # a target needing more than this many times a run's planned training images is out of its reach


@dataclass(frozen=True)
class Projection:
    """Where a curve's power law reaches a target error; `images_to_target` is None when it never does."""

    target: float
    epoch_images: int
    epochs_fitted: int
    images_done: int
    error_now: float  # the fitted line's error at images_done
    best_error: float  # the lowest error the run measured
    slope: float  # b in error ~ images^-b
    images_to_target: int | None  # when reached: the images of the first epoch at or below the target
    images_more: int | None
    hours_more: float | None  # at the run's mean images/s over the fitted epochs

    @property
    def reached(self) -> bool:
        return self.best_error <= self.target


def project(rows: list[dict[str, Any]], target: float, epoch_images: int, key: str = "test_error",
            last: int | None = None) -> Projection:  # fmt: skip
    """The power-law projection of `rows` (metrics.jsonl rows in epoch order) to `target` error, fitted to the
    `last` epochs (default: the second half of the curve, where its slope is its present one) of the best error so
    far (the run's kept checkpoint), which a noisy curve's last few epochs cannot tip."""
    if target <= 0 or epoch_images < 1 or (last is not None and last < MIN_POINTS):
        raise ValueError(f"--target must be above 0, --epoch-images at least 1 and --last at least {MIN_POINTS}")
    measured = [(int(r["epoch"]) * epoch_images, float(r[key]), r) for r in rows if r.get(key) is not None]
    best_so_far = list(itertools.accumulate((e for _, e, _ in measured), min))
    points = [(n, b, r) for (n, _, r), b in zip(measured, best_so_far, strict=True) if b > 0]
    points = points[-(last if last is not None else max(MIN_POINTS, math.ceil(len(points) / 2))) :]
    best = min((e for _, e, _ in measured), default=math.inf)
    if best <= target and len(points) < MIN_POINTS:  # reached, at an error of 0 the line has nothing to fit
        hit, done = next(n for n, e, _ in measured if e <= target), measured[-1][0]
        return Projection(target, epoch_images, len(points), done, best, best, 0.0, hit, 0, 0.0)
    if len(points) < MIN_POINTS:
        raise ValueError(f"fitting needs at least 2 epochs with a positive {key}; the file has {len(points)}")
    fall, intercept = np.polyfit(np.log([n for n, _, _ in points]), np.log([e for _, e, _ in points]), 1)
    slope = float(-fall)
    done = points[-1][0]
    error_now = math.exp(intercept - slope * math.log(done))
    rate = images_per_second(rows, int(points[0][2]["epoch"]), int(points[-1][2]["epoch"]), epoch_images)
    to_target: int | None = None
    if best <= target:
        to_target = next(n for n, e, _ in measured if e <= target)
    elif slope > 0 and (log_images := math.log(done) + math.log(error_now / target) / slope) < math.log(NEVER):
        to_target = math.ceil(math.exp(log_images))
    more = None if to_target is None else max(0, to_target - done)
    hours = None if more is None or not rate else round(more / rate / 3600, 1)
    return Projection(
        target, epoch_images, len(points), done, round(error_now, 6), best, round(slope, 4), to_target, more, hours
    )


def images_per_second(rows: list[dict[str, Any]], first: int, last: int, epoch_images: int) -> float | None:
    """Training images over training seconds of the epochs `first` to `last` (evaluated or not), so slow epochs
    weigh as the time they took; from their `images_per_second` when the rows record no `seconds`."""
    span = [r for r in rows if first <= int(r["epoch"]) <= last]
    seconds = sum(float(r.get("seconds") or 0.0) for r in span)
    if seconds > 0 and all(r.get("seconds") for r in span):
        return len(span) * epoch_images / seconds
    rates = [float(r["images_per_second"]) for r in span if r.get("images_per_second")]
    return len(rates) / sum(1 / v for v in rates) if rates else None  # harmonic: images over time


def percent(error: float) -> str:
    return f"{100 * error:.2f}%"


def about(n: int) -> str:
    """`n` to three significant digits, as a projection deserves: 8,132,929 -> "8,130,000"."""
    return f"{round(n, min(0, 3 - len(str(n)))):,}"


def verdict(p: Projection, planned_images: int, *, unit: str = "images", measure: str = "test error",
            curve: str = "the curve above") -> str:  # fmt: skip
    """What `p` says of a run planned for `planned_images` training `unit`: the target reached (where), or the
    fit's slope, the images and hours it predicts, and whether that is within the plan, within `REACH` times it
    (extend by so many epochs), out of reach, or never (a curve that does not fall). `curve` names the evidence."""
    head = target_head(p.target, p.best_error, measure)
    if p.reached and p.images_to_target is not None:
        return f"{head} {reached_at(p.images_to_target // p.epoch_images, p.images_to_target, unit)}"
    fit = f"The power law fitted to the last {p.epochs_fitted} epochs has slope b = {p.slope:.2f} (error ∝ {unit}^−b)"
    if p.slope <= 0:
        return f"{head} {fit}: the curve does not fall, so more training like it reaches no target ({curve})."
    if p.images_to_target is None or p.images_more is None:
        return (
            f"{head} {fit}, too shallow to reach the target within {NEVER:.0e} training {unit}: out of reach: more "
            f"than three times the planned compute ({planned_images:,} {unit}); {curve} is the evidence."
        )
    if p.hours_more is None:
        hours = f"no time is estimated, as its epochs record no {unit}/s"
    else:
        hours = f"about {p.hours_more:g} h more at the run's own {unit}/s over those epochs"
    more = f"{about(p.images_more)} more than the {p.images_done:,} done" if p.images_more else "no more than done"
    reach = f"{fit} and reaches the target at about {about(p.images_to_target)} training {unit} ({more}; {hours})."
    if p.images_to_target <= planned_images:
        return f"{head} {reach} That is within the planned compute ({planned_images:,} {unit})."
    if p.images_to_target <= REACH * planned_images:
        epochs = math.ceil((p.images_to_target - planned_images) / p.epoch_images)
        return (
            f"{head} {reach} That is beyond the planned compute ({planned_images:,} {unit}) but within three times "
            f"it: the run should be extended by {epochs} epochs of {p.epoch_images:,} {unit} (to "
            f"{planned_images // p.epoch_images + epochs} epochs)."
        )
    return (
        f"{head} {reach} That is out of reach: more than three times the planned compute ({planned_images:,} {unit} "
        f"planned, about {about(p.images_to_target)} predicted); {curve} is the evidence."
    )


def target_head(target: float, best: float, measure: str) -> str:
    return f"The target is {percent(target)} {measure}; the best so far is {percent(best)}."


def reached_at(epoch: int, images: int, unit: str) -> str:
    return f"It is reached: first at epoch {epoch}, after {images:,} training {unit}."


def outlook(rows: list[dict[str, Any]], target: float, epoch_images: int, planned_images: int, *,
            key: str = "test_error", unit: str = "images", measure: str = "test error",
            curve: str = "the curve above") -> str:  # fmt: skip
    """`verdict` of a run's history `rows` (metrics.jsonl rows in epoch order), or, when fewer than `MIN_POINTS`
    epochs have a positive `key`, that the curve is too short to project (or the epoch that reached the target)."""
    measured = [float(r[key]) for r in rows if r.get(key) is not None]
    if not measured:
        return (
            f"The target is {percent(target)} {measure}. No epoch is measured yet: the curve is too short to project."
        )
    usable = [e for e in itertools.accumulate(measured, min) if e > 0]  # the best-so-far errors `project` fits
    if len(usable) >= MIN_POINTS or min(measured) <= target:
        p = project(rows, target, epoch_images, key)
        return verdict(p, planned_images, unit=unit, measure=measure, curve=curve)
    epochs = f"{len(usable)} epoch{'' if len(usable) == 1 else 's'}"
    head = target_head(target, min(measured), measure)
    return f"{head} The curve has {epochs} so far, too short to project (a power law needs {MIN_POINTS})."


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

"""The "not a digit" score: how far an image's capsule outputs lie outside those of MNIST digits (numpy only).

After Frosst, Sabour & Hinton 2018 (DARCCC): a digit is redrawn well by its winning capsule's
reconstruction and has a long winning capsule; a non-digit is not or has not. Each feature below is
compared with its distribution on reference MNIST images, stored on the card as quantiles; the score is
the largest -log tail probability over the features, and images scoring above the card's threshold are
out of distribution. `training.ood.calibrate` calibrates the card's `ood` object with these same functions, so
the service computes exactly the score that was calibrated. docs/model-card.md specifies the object.
"""

from __future__ import annotations

import bisect
import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

import numpy as np

Tail = Literal["upper", "lower", "both"]
TAILS = ("upper", "lower", "both")
FEATURE_TAILS: dict[str, Tail] = {  # each feature and the way it points away from digits
    "distance": "upper",
    "relative_distance": "upper",
    "winning_score": "lower",
    "margin": "lower",
    "ink": "both",
}
NORM_FLOOR = 1e-3  # ||x|| below this (a blank image) is taken as this in relative_distance


CHUNK_FLOATS = 16_000  # float64 values per temporary: 128,000 bytes, below glibc's 128 KiB mmap threshold


def chunk_rows(images: np.ndarray) -> int:
    """Images per pass of `image_features`: as many as keep its float64 temporaries under CHUNK_FLOATS (at least 1;
    20 for 28×28 images)."""
    per_image = int(np.prod(images.shape[1:])) if images.ndim > 1 else 1
    return max(1, CHUNK_FLOATS // max(1, per_image))


def image_features(images: np.ndarray, scores: np.ndarray, reconstruction: np.ndarray | None) -> dict[str, np.ndarray]:
    """Per-image features (N,) from the model's input (N, ...), scores (N, K) and reconstruction (N, ...) or None.

    distance: ||x - reconstruction||_2; relative_distance: distance / ||x||; winning_score: the largest
    score (capsule length or activation); margin: largest minus second-largest score; ink: sum of x.
    Without a reconstruction (no decoder) the two distances are absent.

    Computed `chunk_rows` images at a time (the same arithmetic): a float64 temporary over 128 KiB is mapped and
    unmapped by malloc on every call, which made 24 MNIST images cost 8 times as much as 16.
    """
    step = chunk_rows(images)
    if len(images) > step:
        parts = [
            image_features(
                images[i : i + step],
                scores[i : i + step],
                None if reconstruction is None else reconstruction[i : i + step],
            )
            for i in range(0, len(images), step)
        ]
        return {name: np.concatenate([p[name] for p in parts]) for name in parts[0]}
    x = images.reshape(len(images), -1).astype(np.float64)
    ranked = np.sort(scores.astype(np.float64), axis=1)
    features = {
        "winning_score": ranked[:, -1],
        "margin": ranked[:, -1] - ranked[:, -2] if scores.shape[1] > 1 else ranked[:, -1],
        "ink": x.sum(axis=1),
    }
    if reconstruction is not None:
        r = reconstruction.reshape(len(reconstruction), -1).astype(np.float64)
        distance = np.sqrt(((x - r) ** 2).sum(axis=1))
        features["distance"] = distance
        features["relative_distance"] = distance / np.maximum(np.sqrt((x * x).sum(axis=1)), NORM_FLOOR)
    return features


@dataclass(frozen=True)
class FeatureReference:
    """One feature's reference distribution: `values` at cumulative probabilities `levels` (both increasing)."""

    name: str
    tail: Tail
    levels: np.ndarray
    values: np.ndarray
    floor: float  # smallest tail probability: half of 1 / (number of reference images)
    # `values` and `levels` as Python floats, for `tail_probability` (one value without a numpy call)
    _xp: list[float] = field(init=False, repr=False, compare=False)
    _fp: list[float] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "_xp", [float(v) for v in self.values])
        object.__setattr__(self, "_fp", [float(v) for v in self.levels])

    def surprise(self, x: np.ndarray) -> np.ndarray:
        """-log tail probability of each value under the reference (interpolated between quantiles)."""
        cdf = np.interp(x, self.values, self.levels, left=0.0, right=1.0)
        if self.tail == "upper":
            p = 1.0 - cdf
        elif self.tail == "lower":
            p = cdf
        else:
            p = np.minimum(cdf, 1.0 - cdf)
        return -np.log(np.maximum(p, self.floor))

    def tail_probability(self, x: float) -> float:
        """The tail probability of one finite value, floored: `surprise` is -log of it, to the last bit.

        Plain Python (numpy's `interp` transcribed, its slope form and its knots), so one image's score costs no
        numpy call per feature: at concurrency 1 each numpy call runs from cold caches after the model's run.
        """
        xp, fp = self._xp, self._fp
        if x < xp[0]:
            cdf = 0.0
        elif x > xp[-1]:
            cdf = 1.0
        else:
            j = bisect.bisect_right(xp, x) - 1  # xp[j] <= x < xp[j + 1], as numpy's binary search finds it
            if j == len(xp) - 1 or xp[j] == x:
                cdf = fp[j]
            else:
                cdf = (fp[j + 1] - fp[j]) / (xp[j + 1] - xp[j]) * (x - xp[j]) + fp[j]
        if self.tail == "upper":
            p = 1.0 - cdf
        elif self.tail == "lower":
            p = cdf
        else:
            p = min(cdf, 1.0 - cdf)
        return max(p, self.floor)


@dataclass(frozen=True)
class OODCalibration:
    """The card's `ood` object as the service uses it."""

    features: tuple[FeatureReference, ...]
    threshold: float

    @classmethod
    def from_card(cls, ood: Mapping[str, Any]) -> OODCalibration:
        """Parse and check the card's `ood` object; a ValueError (or KeyError, TypeError) names what is wrong."""
        levels = np.asarray(ood["levels"], dtype=np.float64)
        if levels.ndim != 1 or len(levels) < 2 or np.any(np.diff(levels) < 0) or levels[0] < 0 or levels[-1] > 1:
            raise ValueError("levels must be increasing probabilities in [0, 1]")
        floor = 0.5 / int(ood["reference"]["n"])
        features = []
        for entry in ood["features"]:
            values = np.asarray(entry["values"], dtype=np.float64)
            if entry["name"] not in FEATURE_TAILS or entry["tail"] not in TAILS:
                raise ValueError(f"unknown feature {entry['name']!r} or tail {entry['tail']!r}")
            if values.shape != levels.shape or np.any(np.diff(values) < 0):
                raise ValueError(f"{entry['name']}: values must be {len(levels)} increasing numbers, one per level")
            features.append(FeatureReference(entry["name"], entry["tail"], levels, values, floor))
        if not features:
            raise ValueError("no features")
        return cls(tuple(features), float(ood["threshold"]))

    @property
    def needs_reconstruction(self) -> bool:
        return any(f.name in ("distance", "relative_distance") for f in self.features)

    def score(self, features: Mapping[str, np.ndarray]) -> np.ndarray:
        """(N,) scores: the largest surprise over the calibrated features."""
        return np.max([f.surprise(features[f.name]) for f in self.features], axis=0)

    def assess(
        self, images: np.ndarray, scores: np.ndarray, reconstruction: np.ndarray | None
    ) -> tuple[np.ndarray, np.ndarray]:
        """(score (N,), in_distribution (N,) bool) for a batch of model inputs and outputs."""
        score = self._score_one(images, scores, reconstruction) if len(images) == 1 else None
        if score is None:
            score = self.score(image_features(images, scores, reconstruction))
        return score, score <= self.threshold

    def _score_one(
        self, images: np.ndarray, scores: np.ndarray, reconstruction: np.ndarray | None
    ) -> np.ndarray | None:
        """`score` of a single image with a fifth of the numpy calls (a lone request pays them all from cold
        caches): the same arithmetic, bit for bit, on Python floats where it is scalar. None for non-finite
        values (NaN sorts and compares differently in Python): `score` decides those."""
        x = images.reshape(1, -1).astype(np.float64)
        features = {"ink": float(x.sum(axis=1)[0])}
        ranked = sorted(scores.reshape(-1).tolist())  # float32 to float64 is exact, as astype(np.float64) is
        features["winning_score"] = ranked[-1]
        features["margin"] = ranked[-1] - ranked[-2] if len(ranked) > 1 else ranked[-1]
        if reconstruction is not None:
            r = reconstruction.reshape(1, -1).astype(np.float64)
            features["distance"] = distance = math.sqrt(float(((x - r) ** 2).sum(axis=1)[0]))
            features["relative_distance"] = distance / max(math.sqrt(float((x * x).sum(axis=1)[0])), NORM_FLOOR)
        if not all(math.isfinite(v) for v in (*ranked, *features.values())):
            return None
        p = np.array([f.tail_probability(features[f.name]) for f in self.features])
        return np.max(-np.log(p), axis=0, keepdims=True)

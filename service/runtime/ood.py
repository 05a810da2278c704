"""The "not a digit" score: how far an image's capsule outputs lie outside those of MNIST digits (numpy only).

Each feature (below) is compared with its distribution on reference MNIST images, stored on the card as
quantiles, giving its surprise: -log of the share of reference digits at least as extreme. The card's
`combiner` weighs the surprises into the score (a logistic regression fitted on digits against synthetic
non-digits); a card without one scores the largest surprise (DARCCC, Frosst, Sabour & Hinton 2018).
A card may also carry a `network` (`service.runtime.ood_pattern`): small perceptrons over all the capsules'
lengths and poses, fitted on digits against synthetic non-digits (outlier exposure), whose averaged output is one
more feature, `pattern`.
Images scoring above the card's threshold are out of distribution. `training.ood.calibrate` fits the card's
`ood` object with these same functions; docs/model-card.md and docs/not-a-digit.md specify it.
"""

from __future__ import annotations

import bisect
import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

import numpy as np
from threadpoolctl import threadpool_limits

from service.runtime.ood_pattern import NORM_FLOOR, PatternNetwork

Tail = Literal["upper", "lower", "both"]
TAILS = ("upper", "lower", "both")
FEATURE_TAILS: dict[str, Tail] = {  # each feature and the way it points away from digits
    "distance": "upper",
    "relative_distance": "upper",
    "winning_score": "lower",
    "margin": "lower",
    "ink": "both",
    "pose_distance": "upper",
    "scores_distance": "upper",
    "routing_share": "lower",
    "pattern": "upper",
}
GAUSSIAN_FEATURES = {"pose_distance": "poses", "scores_distance": "scores"}  # feature -> the output it measures
UNUSUAL = 0.01  # a part whose value fewer than this share of reference digits reach is called unusual
SOMEWHAT = 0.1  # ... and below this share, somewhat unusual
PART_WORDS = {  # what a high surprise of each feature means, in a user's words ({label}: the predicted class)
    "distance": "the reconstruction from the {label} capsule does not redraw the image",
    "relative_distance": "the reconstruction from the {label} capsule misses much of the ink",
    "winning_score": "the {label} capsule is shorter than for digits",
    "margin": "the {label} capsule hardly wins over the runner-up",
    "ink": "the amount of ink is unlike a digit's",
    "pose_distance": "the pose is unlike any {label} in training",
    "scores_distance": "the other capsules' lengths are unlike those of a {label}",
    "routing_share": "the routing sends little of the image to the {label} capsule",
    "pattern": "the capsules' lengths, poses and routing together look like a non-digit's, not a {label}'s",
}
CHUNK_FLOATS = 16_000  # float64 values per temporary: 128,000 bytes, below glibc's 128 KiB mmap threshold


def one_blas_thread() -> None:
    """numpy's BLAS on one thread for the whole process, wherever cards are scored (server, calibration, batch
    prediction): the pattern network's float32 bits depend on BLAS's threads, and a second OpenBLAS thread spinning
    after each small product takes a core from ONNX Runtime."""
    threadpool_limits(limits=1, user_api="blas")


def chunk_rows(images: np.ndarray) -> int:
    """Images per pass of `image_features`: as many as keep its float64 temporaries under CHUNK_FLOATS (at least 1;
    20 for 28×28 images)."""
    per_image = int(np.prod(images.shape[1:])) if images.ndim > 1 else 1
    return max(1, CHUNK_FLOATS // max(1, per_image))


def image_features(
    images: np.ndarray,
    scores: np.ndarray,
    reconstruction: np.ndarray | None,
    explanation: np.ndarray | None = None,
) -> dict[str, np.ndarray]:
    """Per-image features (N,) from the model's input (N, ...), scores (N, K), reconstruction (N, ...) or None
    and routing map (N, K, ...) or None.

    distance: ||x - reconstruction||_2; relative_distance: distance / ||x||; winning_score: the largest
    score (capsule length or activation); margin: largest minus second-largest score; ink: sum of x;
    routing_share: the winning class's share of the routing map. Absent without their output.

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
                None if explanation is None else explanation[i : i + step],
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
    if explanation is not None:
        mass = explanation.reshape(*explanation.shape[:2], -1).astype(np.float64).sum(axis=2)  # (N, K)
        winner = mass[np.arange(len(mass)), scores.argmax(axis=1)]
        features["routing_share"] = winner / np.maximum(mass.sum(axis=1), NORM_FLOOR)
    return features


@dataclass(frozen=True)
class ClassGaussian:
    """Class-conditional Gaussians with a shared covariance (Lee et al. 2018) on one output of the model:
    `distance` is the Mahalanobis distance of each image's vector to the mean of its predicted class."""

    output: str  # "poses": the predicted class's pose; "scores": the whole row of scores
    means: np.ndarray  # (K, D)
    whitening: np.ndarray  # (D, D): W with W^T W the inverse of the shared covariance

    @classmethod
    def from_card(cls, entry: Mapping[str, Any], k: int) -> ClassGaussian:
        means = np.asarray(entry["means"], dtype=np.float64)
        whitening = np.asarray(entry["whitening"], dtype=np.float64)
        d = means.shape[-1] if means.ndim == 2 else -1
        if means.shape != (k, d) or whitening.shape != (d, d) or not np.all(np.isfinite(whitening)):
            raise ValueError(f"{entry.get('output')} gaussian: means must be {k}xD and whitening DxD finite numbers")
        if entry["output"] not in GAUSSIAN_FEATURES.values():
            raise ValueError(f"unknown gaussian output {entry['output']!r}")
        return cls(entry["output"], means, whitening)

    def distance(self, scores: np.ndarray, poses: np.ndarray | None) -> np.ndarray:
        winner = scores.argmax(axis=1)
        if self.output == "poses":
            assert poses is not None
            vectors = poses.reshape(*poses.shape[:2], -1)[np.arange(len(poses)), winner]
        else:
            vectors = scores
        centred = vectors.astype(np.float64) - self.means[winner]
        return np.sqrt(((centred @ self.whitening.T) ** 2).sum(axis=1))


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
class Combiner:
    """score = bias + sum of weight * surprise over the features (a logistic regression's log-odds)."""

    bias: float
    weights: dict[str, float]

    @classmethod
    def from_card(cls, entry: Mapping[str, Any]) -> Combiner:
        weights = {str(k): float(v) for k, v in entry["weights"].items()}
        if entry.get("kind", "logistic") != "logistic" or not weights:
            raise ValueError("combiner must be a logistic regression with at least one weight")
        if not all(math.isfinite(w) for w in (*weights.values(), float(entry["bias"]))):
            raise ValueError("combiner weights and bias must be finite")
        return cls(float(entry["bias"]), weights)


@dataclass(frozen=True)
class OODPart:
    """One feature of one image's score: its value, the share of reference digits at least as extreme, and
    what it adds to the score (its weight times its surprise; for the max rule, the surprise itself)."""

    name: str
    value: float
    tail_share: float
    contribution: float

    def says(self, label: str) -> str:
        """The part in a user's words, e.g. "the pose is unlike any 4 in training: 0.02% of training digits are
        as far"; below SOMEWHAT "..., somewhat: 4.00% ..."; else that it is as for digits."""
        share = f"{self.tail_share:.2%}" if self.tail_share >= 0.0001 else "under 0.01%"
        words = PART_WORDS[self.name].format(label=label)
        if self.tail_share < UNUSUAL:
            return f"{words}: {share} of training digits are as extreme"
        if self.tail_share < SOMEWHAT:
            return f"{words}, somewhat: {share} of training digits are as extreme"
        return f"{self.name.replace('_', ' ')} as for digits: {share} of training digits are as extreme"


@dataclass(frozen=True)
class Veto:
    """A reading the network hardly makes is refused: an image whose `feature` (one that points low away from
    digits, as the margin does) is at most `at_most` scores at least `score`, a number above the threshold."""

    feature: str
    at_most: float
    score: float

    @classmethod
    def from_card(cls, entry: Mapping[str, Any], threshold: float) -> Veto:
        feature, at_most, score = str(entry["feature"]), float(entry["at_most"]), float(entry["score"])
        if FEATURE_TAILS.get(feature) != "lower":
            raise ValueError(f"veto feature {feature!r} must be one that is low away from digits (a lower tail)")
        if not (math.isfinite(at_most) and math.isfinite(score)) or score <= threshold:
            raise ValueError("veto at_most and score must be finite, the score above the threshold")
        return cls(feature, at_most, score)

    def apply(self, score: np.ndarray, value: np.ndarray) -> np.ndarray:
        """The scores with the veto: at least `self.score` where the feature's value is at most `at_most`."""
        return np.where(value <= self.at_most, np.maximum(score, self.score), score)


@dataclass(frozen=True)
class OODCalibration:
    """The card's `ood` object as the service uses it."""

    features: tuple[FeatureReference, ...]
    threshold: float
    gaussians: dict[str, ClassGaussian] = field(default_factory=dict)  # feature name -> its Gaussians
    combiner: Combiner | None = None
    network: PatternNetwork | None = None
    veto: Veto | None = None

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
        gaussians = {}
        for name, entry in ood.get("gaussians", {}).items():
            if GAUSSIAN_FEATURES.get(name) != entry["output"]:
                raise ValueError(f"gaussian {name!r} must measure output {GAUSSIAN_FEATURES.get(name)!r}")
            gaussians[name] = ClassGaussian.from_card(entry, len(entry["means"]))
        names = {f.name for f in features}
        missing = sorted(n for n in names & set(GAUSSIAN_FEATURES) if n not in gaussians)
        if missing:
            raise ValueError(f"features {missing} need their gaussians")
        network = PatternNetwork.from_card(ood["network"]) if ood.get("network") is not None else None
        if ("pattern" in names) != (network is not None):
            raise ValueError("the pattern feature and the network come together: give both or neither")
        combiner = Combiner.from_card(ood["combiner"]) if ood.get("combiner") is not None else None
        if combiner is not None and set(combiner.weights) != names:
            raise ValueError(
                f"combiner weights {sorted(combiner.weights)} must be those of the features {sorted(names)}"
            )
        threshold = float(ood["threshold"])
        veto = Veto.from_card(ood["veto"], threshold) if ood.get("veto") is not None else None
        if veto is not None and veto.feature not in names:
            raise ValueError(f"the veto's feature {veto.feature!r} must be one of the features {sorted(names)}")
        return cls(tuple(features), threshold, gaussians, combiner, network, veto)

    @property
    def needs_reconstruction(self) -> bool:
        uses = self.network is not None and "distance" in self.network.inputs
        return uses or any(f.name in ("distance", "relative_distance") for f in self.features)

    @property
    def needs_poses(self) -> bool:
        uses = self.network is not None and "poses" in self.network.inputs
        return uses or any(g.output == "poses" for g in self.gaussians.values())

    @property
    def uses_routing_share(self) -> bool:
        return any(f.name == "routing_share" for f in self.features)

    @property
    def needs_explanation(self) -> bool:
        return self.uses_routing_share or (self.network is not None and "explanation" in self.network.inputs)

    @property
    def needs_parts(self) -> bool:
        return self.network is not None and "parts" in self.network.inputs

    def measure(
        self,
        images: np.ndarray,
        scores: np.ndarray,
        reconstruction: np.ndarray | None,
        poses: np.ndarray | None = None,
        explanation: np.ndarray | None = None,
        parts: np.ndarray | None = None,
    ) -> dict[str, np.ndarray]:
        """Every feature the calibration uses, (N,) each, from the model's input and outputs."""
        features = image_features(images, scores, reconstruction, explanation if self.uses_routing_share else None)
        for name, gaussian in self.gaussians.items():
            features[name] = gaussian.distance(scores, poses)
        if self.network is not None:
            features["pattern"] = self.network.pattern(images, scores, poses, reconstruction, explanation, parts)
        return features

    def surprises(self, features: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        return {f.name: f.surprise(features[f.name]) for f in self.features}

    def score(self, features: Mapping[str, np.ndarray]) -> np.ndarray:
        """(N,) scores: the combiner's weighted sum of the surprises, or without one the largest surprise; then the
        veto, if the card has one."""
        base = self._combine(self.surprises(features))
        return base if self.veto is None else self.veto.apply(base, features[self.veto.feature])

    def _combine(self, surprise: Mapping[str, np.ndarray]) -> np.ndarray:
        if self.combiner is None:
            return np.max(list(surprise.values()), axis=0)
        total = np.full(len(next(iter(surprise.values()))), self.combiner.bias)
        for name, value in surprise.items():
            total = total + self.combiner.weights[name] * value
        return total

    def parts(self, features: Mapping[str, np.ndarray]) -> list[list[OODPart]]:
        """Per image, each feature's part of the score (in the card's order); what a veto adds is its feature's."""
        surprise = self.surprises(features)
        weights = self.combiner.weights if self.combiner is not None else {}
        lift = {}
        if self.veto is not None:
            base = self._combine(surprise)
            lift[self.veto.feature] = self.veto.apply(base, features[self.veto.feature]) - base
        columns = [
            (
                f.name,
                features[f.name].tolist(),
                np.exp(-surprise[f.name]).tolist(),
                surprise[f.name] * weights.get(f.name, 1.0) + lift.get(f.name, 0.0),
            )
            for f in self.features
        ]
        n = len(columns[0][1])
        return [[OODPart(name, float(v[i]), float(t[i]), float(c[i])) for name, v, t, c in columns] for i in range(n)]

    def assess(
        self,
        images: np.ndarray,
        scores: np.ndarray,
        reconstruction: np.ndarray | None,
        poses: np.ndarray | None = None,
        explanation: np.ndarray | None = None,
        parts: np.ndarray | None = None,
    ) -> tuple[np.ndarray, np.ndarray]:
        """(score (N,), in_distribution (N,) bool) for a batch of model inputs and outputs."""
        score = None
        if len(images) == 1:
            score = self._score_one(images, scores, reconstruction, poses, explanation, parts)
        if score is None:
            score = self.score(self.measure(images, scores, reconstruction, poses, explanation, parts))
        return score, score <= self.threshold

    def _score_one(
        self,
        images: np.ndarray,
        scores: np.ndarray,
        reconstruction: np.ndarray | None,
        poses: np.ndarray | None = None,
        explanation: np.ndarray | None = None,
        parts: np.ndarray | None = None,
    ) -> np.ndarray | None:
        """`score` of a single image with a fraction of the numpy calls (a lone request pays them all from cold
        caches): the same arithmetic on Python floats where it is scalar (bit for bit without a combiner, Gaussians
        or routing share; else to rounding). None for non-finite values (NaN sorts and compares differently in
        Python): `score` decides those."""
        x = images.reshape(1, -1).astype(np.float64)
        features = {"ink": float(x.sum(axis=1)[0])}
        row = scores.reshape(-1).tolist()  # float32 to float64 is exact, as astype(np.float64) is
        ranked = sorted(row)
        features["winning_score"] = ranked[-1]
        features["margin"] = ranked[-1] - ranked[-2] if len(ranked) > 1 else ranked[-1]
        if reconstruction is not None:
            r = reconstruction.reshape(1, -1).astype(np.float64)
            features["distance"] = distance = math.sqrt(float(((x - r) ** 2).sum(axis=1)[0]))
            features["relative_distance"] = distance / max(math.sqrt(float((x * x).sum(axis=1)[0])), NORM_FLOOR)
        winner = row.index(ranked[-1]) if math.isfinite(ranked[-1]) else 0  # argmax: the first of the largest
        if self.uses_routing_share and explanation is not None:
            mass = explanation.reshape(len(row), -1).astype(np.float64).sum(axis=1).tolist()
            features["routing_share"] = mass[winner] / max(sum(mass), NORM_FLOOR)
        for name, gaussian in self.gaussians.items():
            source = scores if gaussian.output == "scores" else poses
            if source is None:
                return None
            vector = source.reshape(len(row), -1)[winner] if gaussian.output == "poses" else source.reshape(-1)
            white = gaussian.whitening @ (vector.astype(np.float64) - gaussian.means[winner])
            features[name] = math.sqrt(float(white @ white))
        if self.network is not None:
            features["pattern"] = float(
                self.network.pattern(images, scores, poses, reconstruction, explanation, parts)[0]
            )
        if not all(math.isfinite(v) for v in (*ranked, *features.values())):
            return None
        if self.combiner is None:
            p = np.array([f.tail_probability(features[f.name]) for f in self.features])
            score = np.max(-np.log(p), axis=0, keepdims=True)
        else:
            weights = self.combiner.weights
            total = self.combiner.bias
            for f in self.features:
                total += weights[f.name] * -math.log(f.tail_probability(features[f.name]))
            score = np.array([total])
        if self.veto is not None and features[self.veto.feature] <= self.veto.at_most:
            score = np.maximum(score, self.veto.score)
        return score

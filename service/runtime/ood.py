"""The "not a digit" score: how far an image's capsule outputs lie outside those of MNIST digits (numpy only).

Each feature (below) is compared with its distribution on reference MNIST images, stored on the card as
quantiles, giving its surprise: -log of the share of reference digits at least as extreme. The card's
`combiner` weighs the surprises into the score (a logistic regression fitted on digits against synthetic
non-digits); a card without one scores the largest surprise (DARCCC, Frosst, Sabour & Hinton 2018).
A card may also carry a `network`: small perceptrons over all the capsules' lengths and poses, the routing
map or the activations of the capsules below the classes (`capsule_vector`), fitted on digits against synthetic
non-digits (outlier exposure, Hendrycks et al. 2019), whose averaged output is one more feature, `pattern`.
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
VECTOR_INPUTS = (  # what `capsule_vector` can hold
    "scores", "ranked_scores", "poses", "ink", "distance", "explanation", "parts",
)  # fmt: skip
RANKED = 3  # the largest scores, in order, that `ranked_scores` holds
NORM_FLOOR = 1e-3  # ||x|| below this (a blank image) is taken as this in relative_distance


ROW_BLOCK = 8  # the pattern network pads a batch to a multiple of this many rows, so that a row's bits do not
# depend on its batch: BLAS sums a row's products in an order that depends on the rows of the call
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


def capsule_vector(
    inputs: tuple[str, ...],
    images: np.ndarray,
    scores: np.ndarray,
    poses: np.ndarray | None,
    reconstruction: np.ndarray | None,
    explanation: np.ndarray | None = None,
    parts: np.ndarray | None = None,
) -> np.ndarray:
    """(N, D) float64 input of the `pattern` network, the `inputs` in order: scores (K), ranked_scores (the
    RANKED largest), poses (every capsule's, flattened), ink (sum of x / 100), distance (||x - reconstruction||
    and that over ||x||), explanation (the routing map, flattened: where each class's routed votes came from) and
    parts (the activations of the capsules below the classes, flattened). A ValueError names an input whose
    output the model lacks."""
    n = len(scores)
    x = images.reshape(n, -1).astype(np.float64)
    s = scores.astype(np.float64)
    columns = []
    for name in inputs:
        if name == "scores":
            columns.append(s)
        elif name == "ranked_scores":
            columns.append(-np.sort(-s, axis=1)[:, :RANKED])
        elif name == "poses":
            if poses is None:
                raise ValueError("the pattern network needs the model's poses")
            columns.append(poses.reshape(n, -1).astype(np.float64))
        elif name == "ink":
            columns.append(x.sum(axis=1, keepdims=True) / 100.0)
        elif name in ("explanation", "parts"):
            given = explanation if name == "explanation" else parts
            if given is None:
                raise ValueError(f"the pattern network needs the model's {name} output")
            columns.append(given.reshape(n, -1).astype(np.float64))
        elif name == "distance":
            if reconstruction is None:
                raise ValueError("the pattern network needs the model's reconstruction")
            d = np.sqrt(((x - reconstruction.reshape(n, -1).astype(np.float64)) ** 2).sum(axis=1))
            columns.append(np.stack([d, d / np.maximum(np.sqrt((x * x).sum(axis=1)), NORM_FLOOR)], axis=1))
        else:
            raise ValueError(f"unknown network input {name!r}; choose from {', '.join(VECTOR_INPUTS)}")
    return np.concatenate(columns, axis=1)


def vector_width(
    inputs: tuple[str, ...], k: int, pose_size: int, has_reconstruction: bool, maps: Mapping[str, int] | None = None
) -> int:
    """How many numbers `capsule_vector` gives per image for a model of `k` classes with poses of `pose_size`
    numbers and `maps` (the size of its explanation and parts outputs per image, those it has); a ValueError names
    an input the model cannot give."""
    maps = maps or {}
    sizes = {"scores": k, "ranked_scores": min(RANKED, k), "poses": k * pose_size, "ink": 1, "distance": 2, **maps}
    unknown = [n for n in inputs if n not in VECTOR_INPUTS]
    if unknown:
        raise ValueError(f"unknown network input {unknown[0]!r}; choose from {', '.join(VECTOR_INPUTS)}")
    if "distance" in inputs and not has_reconstruction:
        raise ValueError("the pattern network needs the model's reconstruction")
    lacking = [n for n in inputs if n not in sizes]
    if lacking:
        raise ValueError(f"the pattern network needs the model's {lacking[0]} output")
    return sum(sizes[n] for n in inputs)


@dataclass(frozen=True)
class PatternNetwork:
    """The card's `network`: standardise `capsule_vector` (mean, scale), then each member's dense layers with ReLU
    between them; the members' outputs (one number per image each) are averaged into the `pattern` feature
    (log-odds of a non-digit). Runs in float32 (as fitted), the members' first layers as one matrix product."""

    inputs: tuple[str, ...]
    mean: np.ndarray  # (D,)
    scale: np.ndarray  # (D,)
    members: tuple[tuple[tuple[np.ndarray, np.ndarray], ...], ...]  # per member: (weight (out, in), bias (out,))
    # for `__call__`: every member's first layer stacked, transposed (D, total width), and its bias; each member's
    # columns of it (start, end) and deeper layers (weight transposed (in, out), bias). float32, or float64 for weights
    # beyond float32's range
    _first: np.ndarray = field(init=False, repr=False, compare=False)
    _first_bias: np.ndarray = field(init=False, repr=False, compare=False)
    _deeper: tuple[tuple[int, int, tuple[tuple[np.ndarray, np.ndarray], ...]], ...] = field(
        init=False, repr=False, compare=False
    )

    def __post_init__(self) -> None:
        big = max(float(np.abs(a).max(initial=0.0)) for layers in self.members for layer in layers for a in layer)
        dtype = np.float32 if big <= float(np.finfo(np.float32).max) else np.float64
        firsts = [layers[0] for layers in self.members]
        object.__setattr__(self, "_first", np.ascontiguousarray(np.concatenate([w for w, _ in firsts]).T, dtype))
        object.__setattr__(self, "_first_bias", np.concatenate([b for _, b in firsts]).astype(dtype))
        deeper, start = [], 0
        for layers in self.members:
            end = start + len(layers[0][1])
            rest = tuple((np.ascontiguousarray(w.T, dtype), b.astype(dtype)) for w, b in layers[1:])
            deeper.append((start, end, rest))
            start = end
        object.__setattr__(self, "_deeper", tuple(deeper))

    @classmethod
    def from_card(cls, entry: Mapping[str, Any]) -> PatternNetwork:
        inputs = tuple(str(n) for n in entry["inputs"])
        unknown = [n for n in inputs if n not in VECTOR_INPUTS]
        if not inputs or unknown:
            raise ValueError(f"network inputs must be some of {', '.join(VECTOR_INPUTS)}; got {list(inputs)}")
        mean = np.asarray(entry["mean"], dtype=np.float64)
        scale = np.asarray(entry["scale"], dtype=np.float64)
        if mean.ndim != 1 or scale.shape != mean.shape or not np.all(scale > 0):
            raise ValueError("network mean and scale must be vectors of one length, every scale above 0")
        if not (np.all(np.isfinite(mean)) and np.all(np.isfinite(scale))):
            raise ValueError("network weights must be finite numbers")
        members = []
        for m, member in enumerate(entry["members"]):
            layers = []
            width = len(mean)
            for k, layer in enumerate(member["layers"]):
                weight = np.asarray(layer["weight"], dtype=np.float64)
                bias = np.asarray(layer["bias"], dtype=np.float64)
                if weight.ndim != 2 or weight.shape[1] != width or bias.shape != (weight.shape[0],):
                    raise ValueError(f"network member {m} layer {k}: weight must be (out, {width}) and bias (out,)")
                if not (np.all(np.isfinite(weight)) and np.all(np.isfinite(bias))):
                    raise ValueError("network weights must be finite numbers")
                layers.append((weight, bias))
                width = weight.shape[0]
            if not layers or width != 1:
                raise ValueError(f"network member {m}: the last layer must give one number")
            members.append(tuple(layers))
        if not members:
            raise ValueError("the network needs at least one member")
        return cls(inputs, mean, scale, tuple(members))

    @property
    def width(self) -> int:
        return len(self.mean)

    def __call__(self, vectors: np.ndarray) -> np.ndarray:
        """(N,) outputs for (N, D) capsule vectors."""
        if vectors.shape[1] != self.width:
            raise ValueError(
                f"the pattern network takes {self.width} numbers per image, the model gave {vectors.shape[1]}"
            )
        n = len(vectors)
        x = np.zeros((-(-n // ROW_BLOCK) * ROW_BLOCK, self.width), self._first.dtype)
        x[:n] = (vectors - self.mean) / self.scale  # standardised in float64, as fitted
        hidden = x @ self._first
        hidden += self._first_bias
        total = np.zeros(len(x))
        for start, end, layers in self._deeper:
            h = hidden[:, start:end]
            for weight, bias in layers:
                h = np.maximum(h, 0) @ weight
                h += bias
            total += h[:, 0]
        return total[:n] / len(self.members)

    def pattern(
        self,
        images: np.ndarray,
        scores: np.ndarray,
        poses: np.ndarray | None,
        reconstruction: np.ndarray | None,
        explanation: np.ndarray | None = None,
        parts: np.ndarray | None = None,
    ) -> np.ndarray:
        return self(capsule_vector(self.inputs, images, scores, poses, reconstruction, explanation, parts))


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
class OODCalibration:
    """The card's `ood` object as the service uses it."""

    features: tuple[FeatureReference, ...]
    threshold: float
    gaussians: dict[str, ClassGaussian] = field(default_factory=dict)  # feature name -> its Gaussians
    combiner: Combiner | None = None
    network: PatternNetwork | None = None

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
        return cls(tuple(features), float(ood["threshold"]), gaussians, combiner, network)

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
        """(N,) scores: the combiner's weighted sum of the surprises, or without one the largest surprise."""
        surprise = self.surprises(features)
        if self.combiner is None:
            return np.max(list(surprise.values()), axis=0)
        total = np.full(len(next(iter(surprise.values()))), self.combiner.bias)
        for name, value in surprise.items():
            total = total + self.combiner.weights[name] * value
        return total

    def parts(self, features: Mapping[str, np.ndarray]) -> list[list[OODPart]]:
        """Per image, each feature's part of the score (in the card's order)."""
        surprise = self.surprises(features)
        weights = self.combiner.weights if self.combiner is not None else {}
        columns = [
            (
                f.name,
                features[f.name].tolist(),
                np.exp(-surprise[f.name]).tolist(),
                surprise[f.name] * weights.get(f.name, 1.0),
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
            return np.max(-np.log(p), axis=0, keepdims=True)
        weights = self.combiner.weights
        total = self.combiner.bias
        for f in self.features:
            total += weights[f.name] * -math.log(f.tail_probability(features[f.name]))
        return np.array([total])

"""The `pattern` feature of the "not a digit" score: small perceptrons over every capsule's length and pose, the
routing map or the activations of the capsules below the classes (`capsule_vector`), fitted on digits against
synthetic non-digits (outlier exposure, Hendrycks et al. 2019); their averaged output is one feature of
`service.runtime.ood` (numpy only). `training.ood.network` fits the card's `network`.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np

VECTOR_INPUTS = (  # what `capsule_vector` can hold
    "scores", "ranked_scores", "poses", "ink", "distance", "explanation", "parts",
)  # fmt: skip
RANKED = 3  # the largest scores, in order, that `ranked_scores` holds
NORM_FLOOR = 1e-3  # ||x|| below this (a blank image) is taken as this in relative_distance


ROW_BLOCK = 8  # the pattern network pads a batch to a multiple of this many rows, so that a row's bits do not
# depend on its batch: BLAS sums a row's products in an order that depends on the rows of the call


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

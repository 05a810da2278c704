"""Seeded generated datasets from MNIST digits (numpy only): shifted and affine digits on a 40x40 canvas, MultiMNIST.

The affine set rebuilds the affNIST experiment of Sabour et al. 2017 §5.2 (affNIST itself is not
available here); MultiMNIST is their §6. Every generator is vectorised, deterministic for a given
seed, and returns uint8 images shaped like `MNISTSplit.images`: (N, 1, H, W).

Coordinates: x is the column, y the row (pointing down), pixel centres at integers.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import numpy as np

from training.data.mnist import MNISTSplit

AFFINE_CANVAS = 40  # affNIST's canvas: a 28x28 digit padded by 6 on every side
MULTIMNIST_SHIFT = 4  # §6: each digit shifted by up to 4 pixels in each direction
MULTIMNIST_CANVAS = 28 + 2 * MULTIMNIST_SHIFT  # 36
CHUNK = 2048  # images resampled at once (bounds the memory of the vectorised warp)


def _as_stack(images: np.ndarray) -> np.ndarray:
    """(N, 1, H, W) or (N, H, W) uint8 -> (N, H, W)."""
    if images.ndim == 4:
        if images.shape[1] != 1:
            raise ValueError(f"expected one channel, got images of shape {images.shape}")
        return images[:, 0]
    if images.ndim != 3:
        raise ValueError(f"expected images (N, 1, H, W) or (N, H, W), got shape {images.shape}")
    return images


def _rng(seed: int | np.random.Generator) -> np.random.Generator:
    return seed if isinstance(seed, np.random.Generator) else np.random.default_rng(seed)


def place_at(images: np.ndarray, canvas: int, rows: np.ndarray, cols: np.ndarray) -> np.ndarray:
    """Paste each (H, W) image into an empty canvas x canvas with its top-left corner at (rows[n], cols[n])."""
    digits = _as_stack(images)
    n, h, w = digits.shape
    if np.any(rows < 0) or np.any(cols < 0) or np.any(rows > canvas - h) or np.any(cols > canvas - w):
        raise ValueError(f"offsets must keep every {h}x{w} image inside the {canvas}x{canvas} canvas")
    out = np.zeros((n, canvas, canvas), dtype=np.uint8)
    r = rows.reshape(n, 1, 1) + np.arange(h).reshape(1, h, 1)  # (N, H, 1)
    c = cols.reshape(n, 1, 1) + np.arange(w).reshape(1, 1, w)  # (N, 1, W)
    out[np.arange(n).reshape(n, 1, 1), r, c] = digits
    return out[:, None]  # (N, 1, canvas, canvas)


def center_on_canvas(images: np.ndarray, canvas: int = AFFINE_CANVAS) -> np.ndarray:
    """Pad each image equally on every side to canvas x canvas (affNIST's untransformed set for canvas 40)."""
    digits = _as_stack(images)
    pad = canvas - digits.shape[1]
    if pad < 0 or pad % 2 or digits.shape[1] != digits.shape[2]:
        raise ValueError(f"cannot centre {digits.shape[1:]} images on a {canvas}x{canvas} canvas")
    return np.pad(digits, ((0, 0), (pad // 2, pad // 2), (pad // 2, pad // 2)))[:, None]


def pad_split(split: MNISTSplit, canvas: int) -> MNISTSplit:
    """The split with every digit centred on canvas x canvas (identity for canvas 28)."""
    if canvas == split.images.shape[-1]:
        return split
    return MNISTSplit(center_on_canvas(split.images, canvas), split.labels)


def shifted_on_canvas(
    images: np.ndarray, seed: int | np.random.Generator, canvas: int = AFFINE_CANVAS
) -> tuple[np.ndarray, np.ndarray]:
    """The training protocol of the affine experiment: each 28x28 digit at a uniformly random position on the canvas.

    Top-left corners are uniform in [0, canvas - 28] per axis, independently (0..12 on 40x40: a shift of
    up to ±6 pixels from the centre); the whole 28x28 frame stays inside, so no ink is clipped.

    Returns:
        images (N, 1, canvas, canvas) uint8 and offsets (N, 2) int64 as (row, col) of the top-left corner.
    """
    digits = _as_stack(images)
    rng = _rng(seed)
    span = canvas - digits.shape[1]
    offsets = rng.integers(0, span + 1, size=(digits.shape[0], 2))
    return place_at(digits, canvas, offsets[:, 0], offsets[:, 1]), offsets


@dataclass(frozen=True)
class AffineRanges:
    """The distribution of the affine transformations (each parameter independent and uniform).

    The forward map of a digit is A = R(θ) · Sh(k) · diag(sx, sy), applied about the centre of the digit's
    ink bounding box: scale first, then shear, then rotate, then translate. θ > 0 turns the digit
    counter-clockwise as displayed; the shear moves x by k·y. The translation is uniform over every
    position that keeps the transformed ink bounding box (plus one pixel for the bilinear support) inside
    the canvas, so no ink is ever clipped (affNIST, too, keeps the whole digit in its 40x40 frame).
    """

    canvas: int = AFFINE_CANVAS
    max_rotation_deg: float = 20.0  # θ ∈ [-20°, 20°] (the paper's affNIST: "random rotation of up to 20°")
    max_shear: float = 0.2  # k ∈ [-0.2, 0.2]: up to ±11.3° of slant
    min_scale: float = 0.8  # sx, sy ∈ [0.8, 1.2], drawn independently (aspect ratio 0.67..1.5)
    max_scale: float = 1.2

    def __post_init__(self) -> None:
        if not 0 < self.min_scale <= self.max_scale:
            raise ValueError(f"need 0 < min_scale <= max_scale, got {self.min_scale}, {self.max_scale}")
        if self.max_rotation_deg < 0 or self.max_shear < 0:
            raise ValueError("max_rotation_deg and max_shear must be >= 0")


@dataclass(frozen=True)
class AffineDigits:
    images: np.ndarray  # (N, 1, canvas, canvas) uint8
    labels: np.ndarray  # (N,) int64
    rotation_deg: np.ndarray  # (N,) θ, counter-clockwise as displayed
    shear: np.ndarray  # (N,) k
    scale: np.ndarray  # (N, 2) (sx, sy)
    centre: np.ndarray  # (N, 2) (x, y) on the canvas where the centre of the ink bounding box landed

    @property
    def split(self) -> MNISTSplit:
        return MNISTSplit(self.images, self.labels)


def affine_matrices(rotation_deg: np.ndarray, shear: np.ndarray, scale: np.ndarray) -> np.ndarray:
    """A = R(θ) Sh(k) S(sx, sy) in (x, y-down) coordinates -> (N, 2, 2)."""
    t = np.deg2rad(rotation_deg)
    cos, sin = np.cos(t), np.sin(t)
    rot = np.stack([np.stack([cos, sin], -1), np.stack([-sin, cos], -1)], -2)  # counter-clockwise with y down
    shr = np.zeros_like(rot)
    shr[:, 0, 0] = shr[:, 1, 1] = 1.0
    shr[:, 0, 1] = shear
    scl = np.zeros_like(rot)
    scl[:, 0, 0], scl[:, 1, 1] = scale[:, 0], scale[:, 1]
    return rot @ shr @ scl


def _ink_boxes(digits: np.ndarray) -> np.ndarray:
    """(N, H, W) -> (N, 4) as (x_min, x_max, y_min, y_max) of the nonzero pixels (the whole frame when blank)."""
    _, h, w = digits.shape
    ink: np.ndarray = digits > 0
    cols, rows = np.any(ink, axis=1), np.any(ink, axis=2)  # (N, W), (N, H)
    x_min = np.where(cols.any(1), cols.argmax(1), 0)
    x_max = np.where(cols.any(1), w - 1 - cols[:, ::-1].argmax(1), w - 1)
    y_min = np.where(rows.any(1), rows.argmax(1), 0)
    y_max = np.where(rows.any(1), h - 1 - rows[:, ::-1].argmax(1), h - 1)
    return np.stack([x_min, x_max, y_min, y_max], 1).astype(np.float64)


def _bilinear(src: np.ndarray, x: np.ndarray, y: np.ndarray) -> np.ndarray:
    """Sample src (N, H, W) at (x, y) (N, P) with bilinear weights; zero outside the frame."""
    n, h, w = src.shape
    flat = src.reshape(n, h * w)
    x0, y0 = np.floor(x).astype(np.int64), np.floor(y).astype(np.int64)
    fx, fy = x - x0, y - y0
    out = np.zeros(x.shape, dtype=np.float64)
    for dx, dy, weight in ((0, 0, (1 - fx) * (1 - fy)), (1, 0, fx * (1 - fy)), (0, 1, (1 - fx) * fy), (1, 1, fx * fy)):
        xi, yi = x0 + dx, y0 + dy
        inside = (xi >= 0) & (xi < w) & (yi >= 0) & (yi < h)
        idx = np.clip(yi, 0, h - 1) * w + np.clip(xi, 0, w - 1)  # (N, P)
        out += np.where(inside, weight * np.take_along_axis(flat, idx, axis=1), 0.0)
    return out


def warp_affine(
    images: np.ndarray, matrices: np.ndarray, source_points: np.ndarray, canvas_points: np.ndarray, canvas: int
) -> np.ndarray:
    """Map each digit by x_canvas = A (x_src - source_point) + canvas_point, bilinear, onto canvas x canvas.

    Args:
        images: (N, 1, H, W) or (N, H, W) uint8.
        matrices: (N, 2, 2) forward maps A.
        source_points, canvas_points: (N, 2) as (x, y).

    Returns:
        (N, 1, canvas, canvas) uint8 (rounded to nearest).
    """
    digits = _as_stack(images).astype(np.float64)
    n = digits.shape[0]
    out = np.empty((n, canvas * canvas), dtype=np.uint8)
    gy, gx = np.meshgrid(np.arange(canvas, dtype=np.float64), np.arange(canvas, dtype=np.float64), indexing="ij")
    grid = np.stack([gx.ravel(), gy.ravel()], 0)  # (2, P): canvas pixel centres as (x, y)
    for start in range(0, n, CHUNK):
        sl = slice(start, start + CHUNK)
        inverse = np.linalg.inv(matrices[sl])  # (n, 2, 2)
        rel = grid[None] - canvas_points[sl, :, None]  # (n, 2, P)
        src = inverse @ rel + source_points[sl, :, None]  # (n, 2, P): where each canvas pixel comes from
        values = _bilinear(digits[sl], src[:, 0], src[:, 1])
        out[sl] = np.clip(np.rint(values), 0, 255).astype(np.uint8)
    return out.reshape(n, 1, canvas, canvas)


def affine_digits(
    images: np.ndarray,
    labels: np.ndarray,
    seed: int | np.random.Generator,
    ranges: AffineRanges | None = None,
) -> AffineDigits:
    """One random affine transformation of each digit onto the canvas (the affNIST-like test set).

    Parameters are drawn in this order from one generator: θ, k, (sx, sy), then the translation fraction.
    """
    r = ranges or AffineRanges()
    rng = _rng(seed)
    digits = _as_stack(images)
    n = digits.shape[0]
    rotation = rng.uniform(-r.max_rotation_deg, r.max_rotation_deg, size=(n,))
    shear = rng.uniform(-r.max_shear, r.max_shear, size=(n,))
    scale = rng.uniform(r.min_scale, r.max_scale, size=(n, 2))
    fraction = rng.random((n, 2))
    a = affine_matrices(rotation, shear, scale)  # (N, 2, 2)
    box = _ink_boxes(digits)  # (N, 4): x_min, x_max, y_min, y_max
    # One pixel of margin on every side: bilinear sampling spreads ink up to one pixel beyond the box.
    corners_x = np.stack([box[:, 0] - 1, box[:, 1] + 1, box[:, 0] - 1, box[:, 1] + 1], 1)  # (N, 4)
    corners_y = np.stack([box[:, 2] - 1, box[:, 2] - 1, box[:, 3] + 1, box[:, 3] + 1], 1)
    source_centre = np.stack([(box[:, 0] + box[:, 1]) / 2, (box[:, 2] + box[:, 3]) / 2], 1)  # (N, 2)
    rel = np.stack([corners_x - source_centre[:, :1], corners_y - source_centre[:, 1:]], 1)  # (N, 2, 4)
    mapped = a @ rel  # (N, 2, 4): corners relative to the centre after the transformation
    low, high = mapped.min(axis=2), mapped.max(axis=2)  # (N, 2)
    lo_pos, hi_pos = -low, (r.canvas - 1) - high  # the centre may lie anywhere in [lo_pos, hi_pos]
    too_big = hi_pos < lo_pos  # cannot happen for MNIST digits (ink box <= 20x20 px); centre it then
    centre = np.where(too_big, (r.canvas - 1) / 2, lo_pos + fraction * np.maximum(hi_pos - lo_pos, 0.0))
    out = warp_affine(digits, a, source_centre, centre, r.canvas)
    return AffineDigits(out, labels.astype(np.int64), rotation, shear, scale, centre)


@dataclass(frozen=True)
class MultiDigits:
    images: np.ndarray  # (N, 1, canvas, canvas) uint8: the composite
    labels: np.ndarray  # (N, 2) int64: (base digit class, overlaid digit class), always different
    digits: np.ndarray  # (N, 2, 1, canvas, canvas) uint8: each placed digit alone (reconstruction targets)
    sources: np.ndarray  # (N, 2) int64: indices of the two digits in the source split
    offsets: np.ndarray  # (N, 2, 2) int64: (row, col) of each digit's top-left corner


def multimnist(
    images: np.ndarray,
    labels: np.ndarray,
    seed: int | np.random.Generator,
    pairs_per_digit: int = 1,
    shift: int = MULTIMNIST_SHIFT,
    combine: Literal["max", "clipped_sum"] = "max",
) -> MultiDigits:
    """MultiMNIST, Sabour et al. 2017 §6: each digit overlaid with a digit of another class from the same split.

    Every source digit is the base of `pairs_per_digit` composites (in order: all digits once, then again).
    The partner is drawn uniformly from the digits of the other nine classes. Both digits are placed on a
    (28 + 2·shift)² canvas with top-left corners uniform in [0, 2·shift] per axis, independently (a shift
    of up to ±shift pixels each, so their overlap is heavy: the paper reports 80% bounding-box overlap on
    average). The composite is the pixel-wise max of the two placed digits (`combine="max"`), or their sum
    clipped at 255 (`"clipped_sum"`, what the authors' released generator does).
    """
    digits = _as_stack(images)
    n, size = digits.shape[0], digits.shape[1]
    y = labels.astype(np.int64)
    if len(np.unique(y)) < 2:
        raise ValueError("MultiMNIST needs digits of at least two classes")
    rng = _rng(seed)
    base = np.tile(np.arange(n), pairs_per_digit)
    partner = rng.integers(0, n, size=base.shape)
    clash = y[partner] == y[base]
    while clash.any():  # rejection sampling: uniform over the digits of the other classes
        partner[clash] = rng.integers(0, n, size=int(clash.sum()))
        clash = y[partner] == y[base]
    canvas = size + 2 * shift
    offsets = rng.integers(0, 2 * shift + 1, size=(base.shape[0], 2, 2))  # (M, digit, (row, col))
    first = place_at(digits[base], canvas, offsets[:, 0, 0], offsets[:, 0, 1])
    second = place_at(digits[partner], canvas, offsets[:, 1, 0], offsets[:, 1, 1])
    if combine == "max":
        composite = np.maximum(first, second)
    elif combine == "clipped_sum":
        composite = np.minimum(first.astype(np.int16) + second, 255).astype(np.uint8)
    else:
        raise ValueError(f"combine must be 'max' or 'clipped_sum', got {combine!r}")
    return MultiDigits(
        images=composite,
        labels=np.stack([y[base], y[partner]], 1),
        digits=np.stack([first, second], 1),
        sources=np.stack([base, partner], 1),
        offsets=offsets,
    )

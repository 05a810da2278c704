"""Generated datasets: shifted and affine digits on 40x40, MultiMNIST; seeded, shaped, labelled, ink kept."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from training.data.generators import (
    AffineRanges,
    affine_digits,
    center_on_canvas,
    multimnist,
    pad_split,
    place_at,
    shifted_on_canvas,
)
from training.data.mnist import MNISTSplit, load_split
from training.fitting import train
from training.fitting.train import TrainConfig, mnist_trainer


def strokes(n: int, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """n MNIST-like 28x28 uint8 digits: two thick random strokes inside the central 20x20 box, black background."""
    rng = np.random.default_rng(seed)
    images = np.zeros((n, 1, 28, 28), dtype=np.uint8)
    yy, xx = np.mgrid[0:28, 0:28]
    for k in range(n):
        for _ in range(2):
            (x0, y0), (x1, y1) = rng.uniform(6, 21, size=(2, 2))
            t = np.clip(
                ((xx - x0) * (x1 - x0) + (yy - y0) * (y1 - y0)) / ((x1 - x0) ** 2 + (y1 - y0) ** 2 + 1e-9), 0, 1
            )
            dist = np.hypot(xx - (x0 + t * (x1 - x0)), yy - (y0 + t * (y1 - y0)))
            images[k, 0] = np.maximum(images[k, 0], np.clip(255 * (2.0 - dist), 0, 255).astype(np.uint8))
    return images, rng.integers(0, 10, n)


def principal_angle(image: np.ndarray) -> float:
    """Angle in degrees of the principal axis of the ink, counter-clockwise as displayed (y up), in (-90, 90]."""
    ys, xs = np.nonzero(image > 0)
    w = image[ys, xs].astype(np.float64)
    x, y = xs - np.average(xs, weights=w), -(ys - np.average(ys, weights=w))  # y up
    cxx, cyy, cxy = np.average(x * x, weights=w), np.average(y * y, weights=w), np.average(x * y, weights=w)
    return float(np.degrees(0.5 * np.arctan2(2 * cxy, cxx - cyy)))


# --- shifted and centred -----------------------------------------------------------------------------


def test_shifted_on_canvas_places_the_whole_digit_at_a_seeded_random_offset() -> None:
    images, _ = strokes(50)
    out, offsets = shifted_on_canvas(images, seed=3)
    again, offsets_again = shifted_on_canvas(images, seed=3)
    other, _ = shifted_on_canvas(images, seed=4)
    assert out.shape == (50, 1, 40, 40) and out.dtype == np.uint8
    assert np.array_equal(out, again) and np.array_equal(offsets, offsets_again) and not np.array_equal(out, other)
    assert offsets.min() >= 0 and offsets.max() <= 12 and len(np.unique(offsets)) > 8  # uses the whole range
    for k in range(50):
        r, c = offsets[k]
        assert np.array_equal(out[k, 0, r : r + 28, c : c + 28], images[k, 0])
        assert out[k].sum(dtype=np.int64) == images[k].sum(dtype=np.int64)  # nothing outside the digit's frame


def test_center_on_canvas_and_pad_split() -> None:
    images, labels = strokes(3)
    centred = center_on_canvas(images)
    assert centred.shape == (3, 1, 40, 40) and np.array_equal(centred[:, :, 6:34, 6:34], images)
    split = MNISTSplit(images, labels.astype(np.int64))
    assert pad_split(split, 28) is split
    padded = pad_split(split, 40)
    assert padded.images.shape == (3, 1, 40, 40) and padded.labels is split.labels
    with pytest.raises(ValueError, match="cannot centre"):
        center_on_canvas(images, 41)


def test_place_at_refuses_offsets_outside_the_canvas() -> None:
    images, _ = strokes(2)
    with pytest.raises(ValueError, match="inside the 36x36 canvas"):
        place_at(images, 36, np.array([0, 9]), np.array([0, 0]))


# --- affine ------------------------------------------------------------------------------------------


def test_affine_is_seeded_and_shaped() -> None:
    images, labels = strokes(40)
    a, b, c = (affine_digits(images, labels, seed) for seed in (7, 7, 8))
    assert a.images.shape == (40, 1, 40, 40) and a.images.dtype == np.uint8
    assert a.labels.dtype == np.int64 and np.array_equal(a.labels, labels)
    assert np.array_equal(a.images, b.images) and np.array_equal(a.rotation_deg, b.rotation_deg)
    assert not np.array_equal(a.images, c.images)
    assert a.split.images is a.images


def test_affine_parameters_stay_in_their_documented_ranges() -> None:
    images, labels = strokes(300)
    a = affine_digits(images, labels, 0)
    r = AffineRanges()
    assert np.abs(a.rotation_deg).max() <= r.max_rotation_deg and np.abs(a.rotation_deg).max() > 18
    assert np.abs(a.shear).max() <= r.max_shear and np.abs(a.shear).max() > 0.18
    assert a.scale.min() >= r.min_scale and a.scale.max() <= r.max_scale
    assert a.scale.min() < 0.82 and a.scale.max() > 1.18
    spread = a.centre.max(axis=0) - a.centre.min(axis=0)
    assert np.all(spread > 15)  # translated across the canvas, not just centred


def assert_ink_kept(images: np.ndarray, out: np.ndarray, scale: np.ndarray) -> None:
    border = np.concatenate([out[:, 0, 0], out[:, 0, -1], out[:, 0, :, 0], out[:, 0, :, -1]], axis=1)
    assert border.max() == 0, "ink reached the edge of the canvas: part of a digit may be clipped"
    mass_in = images.reshape(len(images), -1).sum(axis=1).astype(np.float64)
    mass_out = out.reshape(len(out), -1).sum(axis=1).astype(np.float64)
    ratio = mass_out / (mass_in * scale.prod(axis=1))  # area scales by det A = sx·sy; rotation and shear keep it
    assert np.all(np.abs(ratio - 1) < 0.08), ratio[np.abs(ratio - 1) >= 0.08]
    assert abs(ratio.mean() - 1) < 0.01


def test_affine_keeps_all_ink_visible_and_its_mass() -> None:
    images, labels = strokes(200, seed=1)
    a = affine_digits(images, labels, 2)
    assert_ink_kept(images, a.images, a.scale)


@pytest.mark.mnist
def test_affine_keeps_the_ink_of_real_digits(real_mnist: Path) -> None:
    test = load_split(real_mnist, "test").subset(2000)
    a = affine_digits(test.images, test.labels, 0)
    assert_ink_kept(test.images, a.images, a.scale)


def test_rotation_turns_a_bar_by_the_drawn_angle_within_20_degrees() -> None:
    bar = np.zeros((1, 1, 28, 28), dtype=np.uint8)
    bar[0, 0, 13:15, 6:22] = 255  # horizontal: principal axis at 0°
    n = 200
    rotation_only = AffineRanges(max_shear=0.0, min_scale=1.0, max_scale=1.0)
    a = affine_digits(np.repeat(bar, n, axis=0), np.zeros(n, dtype=np.int64), 5, rotation_only)
    measured = np.array([principal_angle(img[0]) for img in a.images])
    assert np.abs(measured - a.rotation_deg).max() < 1.5  # positive = counter-clockwise as displayed
    assert np.abs(measured).max() <= 20 + 1.5 and np.abs(measured).max() > 17


# --- MultiMNIST --------------------------------------------------------------------------------------


def test_multimnist_pairs_two_classes_and_composes_by_max() -> None:
    images, labels = strokes(60, seed=2)
    m = multimnist(images, labels, seed=0, pairs_per_digit=2)
    assert m.images.shape == (120, 1, 36, 36) and m.images.dtype == np.uint8
    assert m.digits.shape == (120, 2, 1, 36, 36) and m.digits.dtype == np.uint8
    assert m.labels.shape == (120, 2) and m.labels.dtype == np.int64
    assert np.all(m.labels[:, 0] != m.labels[:, 1])
    assert np.array_equal(m.sources[:, 0], np.tile(np.arange(60), 2))  # every digit is a base, in order
    assert np.array_equal(m.labels, labels[m.sources])
    assert np.array_equal(m.images, np.maximum(m.digits[:, 0], m.digits[:, 1]))
    assert m.offsets.min() >= 0 and m.offsets.max() <= 8  # shifts of up to ±4 px on 36x36
    for k in range(120):
        for j in range(2):
            r, c = m.offsets[k, j]
            assert np.array_equal(m.digits[k, j, 0, r : r + 28, c : c + 28], images[m.sources[k, j], 0])


def test_multimnist_is_seeded() -> None:
    images, labels = strokes(30, seed=3)
    a, b, c = (multimnist(images, labels, seed) for seed in (1, 1, 2))
    assert np.array_equal(a.images, b.images) and np.array_equal(a.labels, b.labels)
    assert not np.array_equal(a.images, c.images)


def test_multimnist_clipped_sum_and_errors() -> None:
    images, labels = strokes(20, seed=4)
    m = multimnist(images, labels, 0, combine="clipped_sum")
    expected = np.minimum(m.digits[:, 0].astype(np.int32) + m.digits[:, 1], 255)
    assert np.array_equal(m.images, expected)
    with pytest.raises(ValueError, match="at least two classes"):
        multimnist(images, np.zeros(20, dtype=np.int64), 0)
    with pytest.raises(ValueError, match="combine"):
        multimnist(images, labels, 0, combine="mean")  # type: ignore[arg-type]


# --- the 40x40 training protocol in the Trainer ------------------------------------------------------


def test_trainer_trains_on_the_40x40_shifted_protocol(synthetic_mnist: Path) -> None:
    cfg = TrainConfig(
        arch="baseline", preset="tiny", canvas=40, max_shift=6, batch_size=16, eval_batch_size=32, device="cpu",
        dry_run=True,
    )  # fmt: skip
    trainer = mnist_trainer(cfg, str(synthetic_mnist), None)
    assert trainer.task.train_split.images.shape[1:] == (1, 40, 40)
    assert trainer.task.test_split.images.shape[1:] == (1, 40, 40)
    assert trainer.model_config["image_size"] == 40
    history = trainer.fit()
    assert len(history) == 1 and 0.0 <= history[0]["test_error"] <= 1.0


def test_train_cli_accepts_baseline_and_canvas(synthetic_mnist: Path) -> None:
    argv = ["--data-dir", str(synthetic_mnist), "--arch", "baseline", "--preset", "tiny", "--canvas", "40"]
    assert train.main([*argv, "--max-shift", "6", "--dry-run", "--device", "cpu", "--batch-size", "16"]) == 0
    assert train.main([*argv[:-2], "--canvas", "27", "--dry-run", "--device", "cpu"]) == 2

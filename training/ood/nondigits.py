"""Held-out non-digit image sets for the "not a digit" score, generated here (no downloads), seeded.

Every image is drawn on its own canvas and then passed through the service's preprocessing
(`service.imaging.preprocess`: grayscale, polarity, stretch, crop, fit, centre of mass), exactly
as an upload would be, so the sets measure what users of the service get.
Letters are rendered with the DejaVu fonts of Debian's `fonts-dejavu-core` package; letters that
are glyph twins of digits (O, I, l, S, Z, B, G, o, s, z, b, g, q) are left out.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import numpy as np
from PIL import Image, ImageDraw, ImageFont

from service.contract import preprocess

FONT_DIR = Path("/usr/share/fonts/truetype/dejavu")
FONT_FILES = ("DejaVuSans.ttf", "DejaVuSerif.ttf", "DejaVuSans-Bold.ttf")
FONT_PACKAGE = "fonts-dejavu-core"
LETTERS = "ACDEFHJKLMNPQRTUVWXYacdefhijkmnprtuvwxy"  # no glyph twins of digits
CANVAS = 112  # side of the drawing canvas for strokes and letters
FIELD = 64  # side of the blank, near-blank and texture canvases


class FontMissing(FileNotFoundError):
    """The DejaVu fonts are not installed."""


def font_paths() -> list[Path]:
    paths = [FONT_DIR / name for name in FONT_FILES]
    missing = [p for p in paths if not p.is_file()]
    if missing:
        raise FontMissing(f"letters need the DejaVu fonts ({FONT_PACKAGE}); missing {', '.join(map(str, missing))}")
    return paths


def _uniform(rng: np.random.Generator) -> np.ndarray:
    return rng.uniform(0, 1, (28, 28))


def _gaussian(rng: np.random.Generator) -> np.ndarray:
    return np.clip(rng.normal(0.5, 0.2, (28, 28)), 0, 1)


def _blank(rng: np.random.Generator) -> np.ndarray:
    return np.full((FIELD, FIELD), rng.uniform(0, 1))


def _near_blank(rng: np.random.Generator) -> np.ndarray:
    """A blank page with one to three specks of 1-2 pixels."""
    field = np.zeros((FIELD, FIELD))
    for _ in range(rng.integers(1, 4)):
        r, c = rng.integers(0, FIELD, 2)
        field[r : r + rng.integers(1, 3), c : c + rng.integers(1, 3)] = rng.uniform(0.3, 1)
    return field


def _strokes(rng: np.random.Generator) -> np.ndarray:
    """Two to five random polylines, 6-11 pixels wide on a 112 canvas."""
    canvas = Image.new("L", (CANVAS, CANVAS), 0)
    draw = ImageDraw.Draw(canvas)
    for _ in range(rng.integers(2, 6)):
        points = [tuple(int(v) for v in rng.integers(0, CANVAS, 2)) for _ in range(rng.integers(2, 5))]
        draw.line(points, fill=255, width=int(rng.integers(6, 12)))
    return np.asarray(canvas) / 255.0


def _letter(rng: np.random.Generator) -> np.ndarray:
    paths = font_paths()
    char = LETTERS[rng.integers(len(LETTERS))]
    font = ImageFont.truetype(str(paths[rng.integers(len(paths))]), 80)
    canvas = Image.new("L", (CANVAS, CANVAS), 0)
    ImageDraw.Draw(canvas).text((CANVAS // 2, CANVAS // 2), char, fill=255, font=font, anchor="mm")
    return np.asarray(canvas) / 255.0


def _texture(rng: np.random.Generator) -> np.ndarray:
    """Natural-image-like 1/f^a noise (a in [1.5, 2.5] in power), rescaled to [0, 1]."""
    freq = np.fft.fftfreq(FIELD)[:, None] ** 2 + np.fft.fftfreq(FIELD)[None, :] ** 2
    noise = rng.normal(size=(FIELD, FIELD)) + 1j * rng.normal(size=(FIELD, FIELD))
    field = np.real(np.fft.ifft2(noise / np.maximum(freq, 1e-4) ** rng.uniform(0.75, 1.25)))
    return (field - field.min()) / (field.max() - field.min())


NONDIGIT_SETS: dict[str, Callable[[np.random.Generator], np.ndarray]] = {
    "uniform": _uniform,
    "gaussian": _gaussian,
    "blank": _blank,
    "near_blank": _near_blank,
    "strokes": _strokes,
    "letters": _letter,
    "textures": _texture,
}


def to_model_input(picture: np.ndarray, shape: tuple[int, ...]) -> np.ndarray:
    """A picture (H, W) in [0, 1] as the service would feed it to a model of input `shape` (C, H, W)."""
    image = Image.fromarray((np.clip(picture, 0, 1) * 255).astype(np.uint8))
    return preprocess(image, (shape[-2], shape[-1])).array.reshape(shape).astype(np.float32)


def make_set(name: str, n: int, seed: int, shape: tuple[int, ...] = (1, 28, 28)) -> np.ndarray:
    """n preprocessed images (n, *shape) of one set; the same (name, n, seed) always gives the same images."""
    if name not in NONDIGIT_SETS:
        raise ValueError(f"unknown non-digit set {name!r}; choose one of {sorted(NONDIGIT_SETS)}")
    draw = NONDIGIT_SETS[name]
    rng = np.random.default_rng([seed, list(NONDIGIT_SETS).index(name)])
    return np.stack([to_model_input(draw(rng), shape) for _ in range(n)])

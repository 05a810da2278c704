"""The reported test sets' drawn non-digits: strokes, scribbles, textures, noise and pages that no fitting,
validation or confirmation set draws (`training.ood.nondigits.TEST_SETS`).

Each generator is its own kind of image, not a variant of a fitting one: zigzags (a pen tried out or a word
crossed out), hatching (an artist's shading, sometimes crossed), plaids (woven bands of several widths), ordered
dithering (a picture reduced to black and white by a Bayer matrix), transparency checkerboards (an empty canvas as
an image editor shows it) and wiped boards (the faint ghost of erased writing).
"""

from __future__ import annotations

import numpy as np
from PIL import Image, ImageDraw, ImageFilter

from training.ood.shapes import BAYER, CANVAS, FIELD, smooth_noise, turn_lines, wobbly


def zigzags(rng: np.random.Generator) -> np.ndarray:
    """A zigzag drawn in one go: 4 to 9 legs with sharp turns between two wavering edges, each of its own height,
    as a pen is tried out or a word crossed out; turned by up to 40 degrees, 2 to 7 pixels wide on a 112 canvas."""
    turns = int(rng.integers(4, 10))
    x = np.linspace(-1, 1, turns + 1) + rng.normal(0, 0.03, turns + 1)
    y = np.where(np.arange(turns + 1) % 2 == 0, -1.0, 1.0) * rng.uniform(0.25, 0.6, turns + 1)
    canvas = Image.new("L", (CANVAS, CANVAS), 0)
    draw = ImageDraw.Draw(canvas)
    width = int(rng.integers(2, 8))
    line = turn_lines([np.stack([x, y], axis=1)], rng.uniform(-0.7, 0.7), rng.uniform(35, 50),
                      np.array([CANVAS / 2, CANVAS / 2]))[0]  # fmt: skip
    draw.line(wobbly(line, rng, 0.4), fill=255, width=width, joint="curve")
    return np.asarray(canvas) / 255.0


def hatching(rng: np.random.Generator) -> np.ndarray:
    """A patch of hatching as an artist shades: 5 to 12 short parallel strokes side by side, each of its own length,
    and half the time a second layer across them; 1 to 4 pixels wide on a 112 canvas."""
    canvas = Image.new("L", (CANVAS, CANVAS), 0)
    draw = ImageDraw.Draw(canvas)
    width = int(rng.integers(1, 5))
    angle = rng.uniform(0, np.pi)
    for layer in range(1 + int(rng.integers(2))):
        count = int(rng.integers(5, 13))
        offsets = np.linspace(-0.8, 0.8, count)
        strokes = [np.array([[o, -rng.uniform(0.4, 0.9)], [o + rng.uniform(-0.1, 0.1), rng.uniform(0.4, 0.9)]])
                   for o in offsets]  # fmt: skip
        turn = angle + layer * rng.uniform(0.5, np.pi - 0.5)
        for line in turn_lines(strokes, turn, rng.uniform(30, 45), np.array([CANVAS / 2, CANVAS / 2])):
            draw.line(wobbly(line, rng, 0.5), fill=255, width=width)
    return np.asarray(canvas) / 255.0


def plaids(rng: np.random.Generator) -> np.ndarray:
    """A woven plaid, 64 pixels a side: the same sequence of 3 to 7 bands of several widths and shades across and
    down, each crossing the mean of its two bands, and half the time a fine twill of diagonal threads."""
    widths = rng.integers(2, 12, int(rng.integers(3, 8)))
    shades = rng.uniform(0, 1, len(widths))
    stripe = np.resize(np.repeat(shades, widths), FIELD)
    stripe = np.roll(stripe, int(rng.integers(FIELD)))
    cloth = (stripe[:, None] + stripe[None, :]) / 2
    if rng.integers(2):
        y, x = np.mgrid[0:FIELD, 0:FIELD]
        cloth = cloth * np.where((x + y) % 4 < 2, 1.0, 0.8)
    return cloth


def dithers(rng: np.random.Generator) -> np.ndarray:
    """A smooth random picture reduced to black and white by ordered dithering (a 4 by 4 Bayer matrix, each of its
    cells 1 to 3 pixels), 32 to 96 pixels a side: the cross-hatched grain of a one-bit image."""
    side = int(rng.integers(32, 97))
    tone = smooth_noise(rng, (side, side), rng.uniform(3, 12))
    cell = int(rng.integers(1, 4))
    matrix = np.kron(BAYER, np.ones((cell, cell)))
    reps = -(-side // len(matrix))
    return (tone > np.tile(matrix, (reps, reps))[:side, :side]).astype(np.float64)


def checkerboards(rng: np.random.Generator) -> np.ndarray:
    """An empty canvas as an image editor shows transparency: a checkerboard of light squares (4 to 16 pixels) of
    two shades 3% to 20% of full contrast apart, 48 to 160 pixels a side."""
    h, w = (int(v) for v in rng.integers(48, 161, 2))
    square = int(rng.integers(4, 17))
    y, x = np.mgrid[0:h, 0:w]
    light = rng.uniform(0.8, 1.0)
    return np.where((x // square + y // square) % 2 == 0, light, light - rng.uniform(0.03, 0.2))


def wiped_boards(rng: np.random.Generator) -> np.ndarray:
    """A whiteboard wiped clean, 80 to 140 pixels a side: the ghost of 3 to 8 words of erased writing (looping
    strokes across the board), smeared by the wipe and at 5% to 20% of full contrast."""
    h, w = (int(v) for v in rng.integers(80, 141, 2))
    canvas = Image.new("L", (w, h), 0)
    draw = ImageDraw.Draw(canvas)
    for _ in range(int(rng.integers(3, 9))):
        start = rng.uniform([0.05 * w, 0.1 * h], [0.6 * w, 0.9 * h])
        length = rng.uniform(0.15, 0.4) * w
        t = np.linspace(0, 1, 40)
        loops = rng.uniform(2, 5)
        x = start[0] + t * length + 0.03 * w * np.sin(2 * np.pi * loops * t)
        y = start[1] + 0.05 * h * np.cos(2 * np.pi * loops * t) * rng.uniform(0.5, 1.5)
        draw.line(list(zip(x.tolist(), y.tolist(), strict=True)), fill=255, width=int(rng.integers(2, 5)))
    board = np.asarray(canvas.filter(ImageFilter.GaussianBlur(rng.uniform(1.5, 3.5))), np.float64) / 255.0
    return board * rng.uniform(0.05, 0.2)

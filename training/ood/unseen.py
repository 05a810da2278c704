"""The reported test sets' drawn non-digits: strokes, scribbles, textures, noise and pages that no fitting,
validation or confirmation set draws (`training.ood.nondigits.TEST_SETS`).

Each generator is its own kind of image, not a variant of a fitting one: waves (a wavy line whose swing swells and
fades), staves (five lines of music with a few notes), terrazzo (chips of stone set in a ground), fax noise (runs of
black and white along the rows, as a garbled fax prints them), empty windows (a blank dialog as a screenshot shows it)
and stamps (the faint imprint of a rubber stamp).
"""

from __future__ import annotations

import numpy as np
from PIL import Image, ImageDraw, ImageFilter

from training.ood.shapes import CANVAS, FIELD, turn_lines, wobbly


def waves(rng: np.random.Generator) -> np.ndarray:
    """A wavy line drawn in one go: 1.5 to 4 periods of a sine whose swing swells and fades along it, turned by up to
    40 degrees, 2 to 7 pixels wide on a 112 canvas."""
    t = np.linspace(-1, 1, 120)
    periods = rng.uniform(1.5, 4)
    swing = rng.uniform(0.15, 0.45) * (1 + rng.uniform(-0.6, 0.6) * t)
    line = np.stack([t, swing * np.sin(np.pi * periods * t + rng.uniform(0, 2 * np.pi))], axis=1)
    canvas = Image.new("L", (CANVAS, CANVAS), 0)
    (line,) = turn_lines([line], rng.uniform(-0.7, 0.7), rng.uniform(35, 50), np.array([CANVAS / 2, CANVAS / 2]))
    ImageDraw.Draw(canvas).line(wobbly(line, rng, 0.3), fill=255, width=int(rng.integers(2, 8)), joint="curve")
    return np.asarray(canvas) / 255.0


def staves(rng: np.random.Generator) -> np.ndarray:
    """A bar of music: five staff lines 6 to 12 pixels apart and 2 to 6 notes on them (filled or hollow heads, most
    with a stem), on a 112 canvas, turned by up to 5 degrees."""
    canvas = Image.new("L", (CANVAS, CANVAS), 0)
    draw = ImageDraw.Draw(canvas)
    gap = int(rng.integers(6, 13))
    top = CANVAS // 2 - 2 * gap + int(rng.integers(-8, 9))
    left, right = int(rng.integers(4, 20)), CANVAS - int(rng.integers(4, 20))
    for k in range(5):
        draw.line([(left, top + k * gap), (right, top + k * gap)], fill=255, width=1 + int(rng.integers(2)))
    notes = int(rng.integers(2, 7))
    for x in np.linspace(left + 10, right - 10, notes):
        y = top + rng.integers(-2, 11) * gap / 2
        head = [x - gap * 0.65, y - gap * 0.45, x + gap * 0.65, y + gap * 0.45]
        draw.ellipse(head, fill=255 if rng.integers(3) else None, outline=255, width=2)
        if rng.integers(4):
            up = 1 if y > top + 2 * gap else -1
            draw.line([(x + up * gap * 0.6, y), (x + up * gap * 0.6, y - up * 3.2 * gap)], fill=255, width=2)
    return np.asarray(canvas.rotate(float(rng.uniform(-5, 5)), resample=Image.Resampling.BILINEAR)) / 255.0


def terrazzo(rng: np.random.Generator) -> np.ndarray:
    """Terrazzo, 64 pixels a side: 40 to 160 chips of stone (polygons of 3 to 6 corners, 2 to 9 pixels across) in
    shades of their own, set in a ground of one shade."""
    canvas = Image.new("L", (FIELD, FIELD), int(rng.integers(0, 256)))
    draw = ImageDraw.Draw(canvas)
    for _ in range(int(rng.integers(40, 161))):
        centre = rng.uniform(0, FIELD, 2)
        corners = int(rng.integers(3, 7))
        angles = np.sort(rng.uniform(0, 2 * np.pi, corners))
        radii = rng.uniform(1, 4.5, corners)
        points = centre + np.stack([np.cos(angles), np.sin(angles)], axis=1) * radii[:, None]
        draw.polygon([tuple(p) for p in points], fill=int(rng.integers(0, 256)))
    return np.asarray(canvas) / 255.0


def fax_noise(rng: np.random.Generator) -> np.ndarray:
    """A garbled fax, 40 to 120 pixels a side: each row runs of black and white whose lengths are random (on average
    2 to 12 pixels), and rows printed twice or three times when the line rate slips."""
    h, w = (int(v) for v in rng.integers(40, 121, 2))
    mean = rng.uniform(2, 12)
    rows: list[np.ndarray] = []
    while len(rows) < h:
        runs = rng.geometric(1 / mean, w)
        row = np.repeat(np.arange(len(runs)) % 2, runs)[:w] ^ int(rng.integers(2))
        rows.extend([row] * int(rng.integers(1, 4)))
    return np.array(rows[:h], np.float64)


def empty_windows(rng: np.random.Generator) -> np.ndarray:
    """A blank dialog as a screenshot shows it, 60 to 180 pixels wide: a light pane with a 1 or 2 pixel border and a
    title bar, each 2% to 15% of full contrast from the pane."""
    h, w = int(rng.integers(40, 141)), int(rng.integers(60, 181))
    pane = rng.uniform(0.8, 1.0)
    window = np.full((h, w), pane)
    border = int(rng.integers(1, 3))
    window[: int(rng.integers(8, 20))] = pane - rng.uniform(0.02, 0.15)
    edge = pane - rng.uniform(0.02, 0.15)
    window[:border], window[-border:], window[:, :border], window[:, -border:] = edge, edge, edge, edge
    return window


def stamps(rng: np.random.Generator) -> np.ndarray:
    """The faint imprint of a rubber stamp on a page, 80 to 140 pixels a side: a double frame around 2 or 3 rows of
    short bars (its lettering), turned by up to 30 degrees, blotchy, at 5% to 20% of full contrast."""
    side = int(rng.integers(80, 141))
    canvas = Image.new("L", (side, side), 0)
    draw = ImageDraw.Draw(canvas)
    w, h = side * rng.uniform(0.5, 0.8), side * rng.uniform(0.25, 0.45)
    x0, y0 = (side - w) / 2, (side - h) / 2
    draw.rectangle([x0, y0, x0 + w, y0 + h], outline=255, width=3)
    draw.rectangle([x0 + 5, y0 + 5, x0 + w - 5, y0 + h - 5], outline=255, width=1)
    rows = int(rng.integers(2, 4))
    for k in range(rows):
        y = y0 + h * (k + 1) / (rows + 1)
        x = x0 + 10
        while x < x0 + w - 14:
            length = rng.uniform(3, 9)
            draw.line([(x, y), (x + length, y)], fill=255, width=int(rng.integers(2, 4)))
            x += length + rng.uniform(2, 4)
    canvas = canvas.rotate(float(rng.uniform(-30, 30)), resample=Image.Resampling.BILINEAR)
    ink = np.asarray(canvas.filter(ImageFilter.GaussianBlur(0.8)), np.float64) / 255.0
    blotch = rng.uniform(0.4, 1.0, ink.shape)
    return ink * blotch * rng.uniform(0.05, 0.2)

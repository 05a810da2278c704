"""The reported test sets' drawn non-digits: strokes, scribbles, textures, noise and pages that no fitting,
validation or confirmation set draws (`training.ood.nondigits.TEST_SETS`).

Each generator is its own kind of image, not a variant of a fitting one: heartbeats (the trace of an
electrocardiogram: a level line with a spike at every beat), crayons (a patch coloured in with a wax crayon, back
and forth, its strokes broken by the grain of the paper), knits (the stitches of knitted fabric: columns of Vs, or
ribs of Vs and purl bumps), TV snow (an untuned analogue television: noise smeared along the rows under a rolling
bright band), folded sheets (a blank sheet once folded, its two faces lit differently) and crumpled pages (a blank
page crumpled and smoothed out: faint facets between creases).
"""

from __future__ import annotations

import numpy as np
from PIL import Image, ImageDraw, ImageFilter

from training.ood.shapes import CANVAS, FIELD, smooth_noise, turn_lines, wobbly


def _beat(rng: np.random.Generator, t: np.ndarray) -> np.ndarray:
    """One heartbeat at times `t` in [0, 1]: a small P wave, a sharp QRS spike (down, up, down) and a T wave."""
    p = rng.uniform(0.05, 0.15) * np.exp(-(((t - 0.2) / 0.04) ** 2))
    q = -rng.uniform(0.05, 0.2) * np.exp(-(((t - 0.36) / 0.012) ** 2))
    r = rng.uniform(0.6, 1.0) * np.exp(-(((t - 0.4) / 0.015) ** 2))
    s = -rng.uniform(0.1, 0.35) * np.exp(-(((t - 0.44) / 0.015) ** 2))
    return p + q + r + s + rng.uniform(0.1, 0.3) * np.exp(-(((t - 0.68) / 0.07) ** 2))


def heartbeats(rng: np.random.Generator) -> np.ndarray:
    """The trace of an electrocardiogram: 2 to 4 beats (each a P wave, a QRS spike and a T wave) on a level line,
    4 to 1.6 times as wide as high, turned by up to 15 degrees, 2 to 5 pixels wide on a 112 canvas."""
    beats = int(rng.integers(2, 5))
    t = np.linspace(0, 1, 80)
    y = np.concatenate([_beat(rng, t) for _ in range(beats)])
    x = np.linspace(-1, 1, y.size)
    line = np.stack([x, -y * rng.uniform(0.4, 0.8) + 0.25], axis=1)
    canvas = Image.new("L", (CANVAS, CANVAS), 0)
    (line,) = turn_lines([line], rng.uniform(-0.26, 0.26), rng.uniform(40, 50), np.array([CANVAS / 2, CANVAS / 2]))
    ImageDraw.Draw(canvas).line(wobbly(line, rng, 0.15), fill=255, width=int(rng.integers(2, 6)), joint="curve")
    return np.asarray(canvas) / 255.0


def crayons(rng: np.random.Generator) -> np.ndarray:
    """A patch coloured in with a wax crayon on a 112 canvas: back-and-forth strokes 3 to 6 pixels wide, 3 to 7
    apart at one slant, filling two to four overlapping ellipses (and overshooting them a little), with the ink
    broken where the paper's grain is low (a quarter to a half of it)."""
    shape = Image.new("L", (CANVAS, CANVAS), 0)
    draw = ImageDraw.Draw(shape)
    for _ in range(int(rng.integers(2, 5))):
        cx, cy = rng.uniform(35, CANVAS - 35, 2)
        rx, ry = rng.uniform(15, 35, 2)
        draw.ellipse([cx - rx, cy - ry, cx + rx, cy + ry], fill=255)
    region = np.asarray(shape.filter(ImageFilter.MaxFilter(5))) > 0
    strokes = Image.new("L", (2 * CANVAS, 2 * CANVAS), 0)
    gap, width = rng.uniform(3, 7), int(rng.integers(3, 7))
    rows = np.arange(0, 2 * CANVAS, gap)
    ends = rng.normal(0, 4, (rows.size, 2)) + np.array([0, 2 * CANVAS])
    path = [(float(ends[k, k % 2]), float(y + rng.normal(0, 1))) for k, y in enumerate(rows)]
    ImageDraw.Draw(strokes).line(path, fill=255, width=width, joint="curve")
    strokes = strokes.rotate(float(rng.uniform(0, 180)), resample=Image.Resampling.BILINEAR)
    ink = np.asarray(strokes, np.float64)[CANVAS // 2 : CANVAS // 2 + CANVAS, CANVAS // 2 : CANVAS // 2 + CANVAS]
    grain = smooth_noise(rng, (CANVAS, CANVAS), 0.7) > rng.uniform(0.25, 0.5)
    return ink / 255.0 * region * grain


def knits(rng: np.random.Generator) -> np.ndarray:
    """Knitted fabric, 64 pixels a side: stitches (5 to 9 pixels wide, 4 to 7 high) as columns of Vs (two slanted
    loops of yarn each), or a rib (columns of Vs between columns of purl bumps), lit unevenly, turned by up to 20
    degrees."""
    side = 2 * FIELD
    canvas = Image.new("L", (side, side), int(rng.integers(0, 60)))
    draw = ImageDraw.Draw(canvas)
    w, h = rng.uniform(5, 9), rng.uniform(4, 7)
    rib = int(rng.integers(0, 3))  # 0: all Vs; 1 or 2: that many Vs, then as many purl columns
    for j in range(int(side / w) + 1):
        purl = rib > 0 and (j // rib) % 2 == 1
        for i in range(int(side / h) + 2):
            x, y, shade = j * w, i * h, int(rng.integers(150, 256))
            if purl:
                draw.ellipse([x + 0.5, y + h * 0.2, x + w - 0.5, y + h * 0.8], fill=shade)
                continue
            for sign in (-1, 1):
                cx = x + w / 2 + sign * w / 4
                leg = [(cx - sign * w * 0.2, y - h * 0.1), (cx + sign * w * 0.2, y + h)]
                draw.line(leg, fill=shade, width=max(2, int(w / 3)))
    canvas = canvas.rotate(float(rng.uniform(-20, 20)), resample=Image.Resampling.BILINEAR)
    cloth = np.asarray(canvas, np.float64)[FIELD // 2 : FIELD // 2 + FIELD, FIELD // 2 : FIELD // 2 + FIELD] / 255.0
    light = 1 - rng.uniform(0, 0.4) * smooth_noise(rng, (FIELD, FIELD), 12)
    return cloth * light


def tv_snow(rng: np.random.Generator) -> np.ndarray:
    """An untuned analogue television, 48 to 128 pixels a side: Gaussian noise smeared along each row (over 2 to 6
    pixels, the set's narrow bandwidth) around a mid gray, under a soft horizontal band 10% to 30% brighter (the
    rolling bar of a lost vertical hold)."""
    h, w = (int(v) for v in rng.integers(48, 129, 2))
    smear = int(rng.integers(2, 7))
    raw = rng.normal(0, 1, (h, w + smear - 1))
    rows = np.stack([np.convolve(r, np.ones(smear) / np.sqrt(smear), mode="valid") for r in raw])
    y = np.arange(h)[:, None] / h
    band = rng.uniform(0.1, 0.3) * np.exp(-(((y - rng.uniform(0, 1)) / rng.uniform(0.08, 0.25)) ** 2))
    return np.clip(rng.uniform(0.35, 0.6) + band + rng.uniform(0.1, 0.2) * rows, 0, 1)


def folded_sheets(rng: np.random.Generator) -> np.ndarray:
    """A blank sheet once folded corner to corner and opened, 40 to 160 pixels wide and 0.75 to 1.33 times as high:
    the fold (near the middle, within 15 degrees of a diagonal; the smaller face is a triangle or a broad trapezoid,
    never an upright bar) a soft step between two faces lit 2% to 15% of full contrast apart, over a drift of at most
    3 of 255 levels."""
    w = int(rng.integers(40, 161))
    h = int(w * rng.uniform(0.75, 1.33))
    y, x = np.mgrid[0:h, 0:w].astype(np.float64)
    cy, cx = rng.uniform(0.4, 0.6) * h, rng.uniform(0.4, 0.6) * w
    angle = np.pi / 4 + np.pi / 2 * int(rng.integers(2)) + np.deg2rad(rng.uniform(-15, 15))
    across = (x - cx) * np.cos(angle) + (y - cy) * np.sin(angle)
    face = 1 / (1 + np.exp(-across / rng.uniform(0.5, 2)))  # 0 on one face, 1 on the other
    drift = rng.uniform(0, 3 / 255) * (x * np.cos(angle + 1) + y * np.sin(angle + 1)) / max(h, w)
    paper = rng.uniform(0.75, 0.97)
    return np.clip(paper - rng.uniform(0.02, 0.15) * face + drift, 0, 1)


def crumpled(rng: np.random.Generator) -> np.ndarray:
    """A blank page crumpled and smoothed out, 48 to 140 pixels a side: 10 to 24 creases (straight ridges or valleys
    across the page at any angle, each sloping off evenly on both sides for a tenth to half the page), their relief
    lit from one side into faint flat facets at most 6% to 24% of full contrast apart."""
    h, w = (int(v) for v in rng.integers(48, 141, 2))
    y, x = np.mgrid[0:h, 0:w].astype(np.float64) / max(h, w)
    relief = np.zeros((h, w))
    for _ in range(int(rng.integers(10, 25))):
        angle = rng.uniform(0, np.pi)
        across = (x - rng.uniform(0, w / max(h, w))) * np.cos(angle) + (y - rng.uniform(0, h / max(h, w))) * np.sin(
            angle
        )
        relief += rng.choice([-1, 1]) * rng.uniform(0.3, 1) * np.maximum(0, 1 - np.abs(across) / rng.uniform(0.1, 0.5))
    gy, gx = np.gradient(relief)
    light = rng.uniform(0, 2 * np.pi)
    shade = gx * np.cos(light) + gy * np.sin(light)
    shade = shade / max(float(np.abs(shade).max()), 1e-9)
    return np.clip(rng.uniform(0.7, 0.95) + rng.uniform(0.03, 0.12) * shade, 0, 1)

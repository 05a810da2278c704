"""Fitting non-digits drawn after things a camera or a scanner meets (`training.ood.nondigits.NONDIGIT_SETS`), each
its own kind of image, not a variant of another: seismograms (one to three level traces, quiet until a quake's burst
that rings down), pen tests (the row of tight spirals a ballpoint leaves when tried out), wood grain (growth rings
bending round a knot, with fibres along them), thermal prints (a receipt's dots fading along the paper, with dead
heating elements), envelopes (the back of a blank envelope in a phone photo) and pencil ticks (a page with one faint
tick or a staple's two holes).
"""

from __future__ import annotations

import numpy as np
from PIL import Image, ImageDraw, ImageFilter

from training.ood.shapes import CANVAS, FIELD, smooth_noise


def seismograms(rng: np.random.Generator) -> np.ndarray:
    """One to three seismograph traces one above the other on a 112 canvas, 1 to 3 pixels wide: each level with a
    faint tremor, until a burst (a sharp onset, then swings of 10 to 25 pixels ringing down) at its own time."""
    canvas = Image.new("L", (CANVAS, CANVAS), 0)
    draw = ImageDraw.Draw(canvas)
    traces = int(rng.integers(1, 4))
    x = np.linspace(6, CANVAS - 6, 300)
    for k in range(traces):
        level = CANVAS / 2 + (k - (traces - 1) / 2) * rng.uniform(22, 30)
        onset = rng.uniform(0.2, 0.6) * CANVAS
        after = np.maximum(x - onset, 0)
        ring = np.exp(-after / rng.uniform(6, 18)) * (x > onset)
        swing = rng.uniform(10, 25 if traces == 1 else 11) * ring * np.sin(after * rng.uniform(0.8, 1.6))
        y = level + swing + rng.normal(0, rng.uniform(0.2, 0.8), x.size)
        draw.line(list(zip(x.tolist(), y.tolist(), strict=True)), fill=255, width=int(rng.integers(1, 4)))
    return np.asarray(canvas) / 255.0


def pen_tests(rng: np.random.Generator) -> np.ndarray:
    """A ballpoint tried out on a 112 canvas: three to five tight spirals (3 to 6 turns, 12 to 22 pixels across) in a
    row, each run into the next, 1 or 2 pixels wide, the row turned by up to 20 degrees."""
    spirals = int(rng.integers(3, 6))
    centres = np.linspace(-1, 1, spirals) * (spirals - 1) * rng.uniform(16, 21) / 2
    path: list[np.ndarray] = []
    for cx in centres:
        turns, radius = rng.uniform(3, 6), rng.uniform(6, 11)
        t = np.linspace(0, 2 * np.pi * turns, int(60 * turns))
        r = radius * (0.25 + 0.75 * t / t[-1])
        path.append(np.stack([cx + r * np.cos(t), rng.normal(0, 3) + r * np.sin(t) * rng.uniform(0.7, 1)], axis=1))
    points = np.concatenate(path)
    turn = np.deg2rad(rng.uniform(-20, 20))
    points = points @ np.array([[np.cos(turn), np.sin(turn)], [-np.sin(turn), np.cos(turn)]]) + CANVAS / 2
    canvas = Image.new("L", (CANVAS, CANVAS), 0)
    ImageDraw.Draw(canvas).line([tuple(p) for p in points], fill=255, width=int(rng.integers(1, 3)), joint="curve")
    return np.asarray(canvas) / 255.0


def wood_grain(rng: np.random.Generator) -> np.ndarray:
    """Wood, 64 pixels a side: growth rings (dark lines 4 to 9 pixels apart, wavering) that bend round a knot, over
    light fibres streaked along them, the whole turned by any angle."""
    side = 2 * FIELD
    y, x = np.mgrid[0:side, 0:side].astype(np.float64)
    ky, kx, size = rng.uniform(0.3, 0.7) * side, rng.uniform(0.2, 0.8) * side, rng.uniform(6, 14)
    knot = size * 2.5 * np.exp(-((x - kx) ** 2 / (4 * size * size) + (y - ky) ** 2 / (size * size)))
    waver = 6 * (smooth_noise(rng, (side, side), 10) - 0.5)
    phase = (y + waver + knot * np.sign(y - ky)) / rng.uniform(4, 9)
    rings = np.abs(np.sin(np.pi * phase)) ** rng.uniform(4, 12)
    fibres = np.asarray(Image.fromarray(rng.integers(0, 256, (side, side), dtype=np.uint8)).resize((side // 8, side))
                        .resize((side, side), Image.Resampling.BILINEAR), np.float64) / 255.0  # fmt: skip
    wood = 0.55 + 0.15 * fibres - rng.uniform(0.25, 0.45) * (1 - rings)
    turned = Image.fromarray((np.clip(wood, 0, 1) * 255).astype(np.uint8)).rotate(float(rng.uniform(0, 360)))
    return np.asarray(turned, np.float64)[FIELD // 2 : FIELD // 2 + FIELD, FIELD // 2 : FIELD // 2 + FIELD] / 255.0


def thermal_prints(rng: np.random.Generator) -> np.ndarray:
    """A thermal receipt printed a flat gray and faded, 48 to 128 pixels a side: one-bit dots, each printed with a
    chance that falls smoothly along the paper (from a half to nine tenths down to a tenth or less), in rows, with
    one to four dead heating elements (columns never printed) and rows jittered where the head caught."""
    h, w = (int(v) for v in rng.integers(48, 129, 2))
    fade = np.linspace(rng.uniform(0.5, 0.9), rng.uniform(0.0, 0.1), h)[:, None]
    dots = rng.random((h, w)) < fade * (0.8 + 0.4 * smooth_noise(rng, (h, w), 4))
    for row in np.nonzero(rng.random(h) < 0.05)[0]:
        dots[row] = np.roll(dots[row], int(rng.integers(-3, 4)))
    dots[:, rng.integers(0, w, int(rng.integers(1, 5)))] = False
    return dots.astype(np.float64)


def envelopes(rng: np.random.Generator) -> np.ndarray:
    """The back of a blank envelope in a phone photo: a pale page 1.4 to 2.4 times as wide as high (40 to 180
    pixels wide), the V of its flap and a soft shadow across it each up to 12% of full contrast darker (as a phone's
    exposure leaves them: about two in three stay under the service's contrast floor and come out empty)."""
    w = int(rng.integers(40, 181))
    h = max(16, int(w / rng.uniform(1.4, 2.4)))
    y, x = np.mgrid[0:h, 0:w].astype(np.float64)
    tip = rng.uniform(0.45, 0.7) * h
    flap = np.abs(y - tip * (1 - np.abs(x - w / 2) / (w / 2))) < 1
    angle = rng.uniform(0, 2 * np.pi)
    across = (x - w / 2) * np.cos(angle) + (y - h / 2) * np.sin(angle) - rng.uniform(-0.3, 0.3) * w
    shadow = 1 / (1 + np.exp(-across / rng.uniform(3, 12)))
    paper = rng.uniform(0.7, 0.97)
    return np.clip(paper - rng.uniform(0, 0.12) * flap - rng.uniform(0, 0.12) * shadow, 0, 1)


def pencil_ticks(rng: np.random.Generator) -> np.ndarray:
    """A page with one small faint mark, 60 to 140 pixels a side: a pencil tick (a short stroke down and a longer
    one up, 8 to 16 pixels, at 10% to 35% of full contrast) or a staple's two holes (dots 1 to 2 pixels, 6 to 14
    apart, joined by the staple's faint trace)."""
    h, w = (int(v) for v in rng.integers(60, 141, 2))
    canvas = Image.new("L", (w, h), 0)
    draw = ImageDraw.Draw(canvas)
    x, y = rng.uniform(0.15, 0.85) * w, rng.uniform(0.15, 0.85) * h
    if rng.random() < 0.5:
        size = rng.uniform(8, 16)
        tick = [(x, y), (x + size * 0.35, y + size * 0.45), (x + size, y - size * 0.6)]
        draw.line(tick, fill=int(255 * rng.uniform(0.1, 0.35)), width=1)
        return np.asarray(canvas.filter(ImageFilter.GaussianBlur(0.4)), np.float64) / 255.0
    gap, dot = rng.uniform(6, 14), rng.uniform(0.5, 1)
    draw.line([(x, y), (x + gap, y)], fill=int(255 * rng.uniform(0.03, 0.1)), width=1)
    for cx in (x, x + gap):
        draw.ellipse([cx - dot, y - dot, cx + dot, y + dot], fill=int(255 * rng.uniform(0.4, 0.8)))
    return np.asarray(canvas, np.float64) / 255.0

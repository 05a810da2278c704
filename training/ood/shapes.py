"""Drawn non-digits that need no font: noise, blank pages, strokes, scribbles and textures, each on its own canvas.

The generators here fit the score (and train a network on non-digits with `capsnet-train --exposure`); the roles
that use them are listed in `training.ood.nondigits`. The reported test sets draw with `training.ood.unseen`
instead, whose shapes none of these draws.
"""

from __future__ import annotations

import io
from itertools import pairwise

import numpy as np
from PIL import Image, ImageDraw, ImageFilter

CANVAS = 112  # side of the drawing canvas for strokes and letters
FIELD = 64  # side of the blank, near-blank and texture canvases
BAYER = np.array([[0, 8, 2, 10], [12, 4, 14, 6], [3, 11, 1, 9], [15, 7, 13, 5]]) / 16 + 1 / 32  # ordered dither


def uniform(rng: np.random.Generator) -> np.ndarray:
    return rng.uniform(0, 1, (28, 28))


def gaussian(rng: np.random.Generator) -> np.ndarray:
    return np.clip(rng.normal(0.5, 0.2, (28, 28)), 0, 1)


def blank(rng: np.random.Generator) -> np.ndarray:
    return np.full((FIELD, FIELD), rng.uniform(0, 1))


def near_blank(rng: np.random.Generator) -> np.ndarray:
    """A blank page with one to three specks of 1-2 pixels."""
    field = np.zeros((FIELD, FIELD))
    for _ in range(rng.integers(1, 4)):
        r, c = rng.integers(0, FIELD, 2)
        field[r : r + rng.integers(1, 3), c : c + rng.integers(1, 3)] = rng.uniform(0.3, 1)
    return field


def strokes(rng: np.random.Generator) -> np.ndarray:
    """Two to five random polylines, 6-11 pixels wide on a 112 canvas."""
    canvas = Image.new("L", (CANVAS, CANVAS), 0)
    draw = ImageDraw.Draw(canvas)
    for _ in range(rng.integers(2, 6)):
        points = [tuple(int(v) for v in rng.integers(0, CANVAS, 2)) for _ in range(rng.integers(2, 5))]
        draw.line(points, fill=255, width=int(rng.integers(6, 12)))
    return np.asarray(canvas) / 255.0


def scribble(rng: np.random.Generator) -> np.ndarray:
    """One to three smooth random curves (cubic Bezier chains), 5-12 pixels wide on a 112 canvas."""
    canvas = Image.new("L", (CANVAS, CANVAS), 0)
    draw = ImageDraw.Draw(canvas)
    t = np.linspace(0, 1, 24)[:, None]
    for _ in range(rng.integers(1, 4)):
        points = rng.uniform(8, CANVAS - 8, (3 * int(rng.integers(1, 4)) + 1, 2))
        curve = []
        for i in range(0, len(points) - 1, 3):
            p0, p1, p2, p3 = points[i : i + 4]
            curve += (((1 - t) ** 3) * p0 + 3 * (1 - t) ** 2 * t * p1 + 3 * (1 - t) * t**2 * p2 + t**3 * p3).tolist()
        draw.line([tuple(p) for p in curve], fill=255, width=int(rng.integers(5, 13)), joint="curve")
    return np.asarray(canvas) / 255.0


def grating(rng: np.random.Generator) -> np.ndarray:
    """A sum of two or three sinusoidal gratings, or a checkerboard."""
    y, x = np.mgrid[0:FIELD, 0:FIELD] / FIELD
    if rng.random() < 0.3:
        k = int(rng.integers(3, 12))
        return ((np.floor(x * k) + np.floor(y * k)) % 2).astype(np.float64)
    field = sum(
        np.sin(2 * np.pi * rng.uniform(2, 12) * (np.cos(a) * x + np.sin(a) * y) + rng.uniform(0, 2 * np.pi))
        for a in rng.uniform(0, np.pi, rng.integers(2, 4))
    )
    return rescaled(np.asarray(field, np.float64))


def noise(rng: np.random.Generator) -> np.ndarray:
    """Uniform, Gaussian or salt-and-pepper noise, on a 28 or 64 canvas."""
    side = int(rng.choice([28, FIELD]))
    kind = rng.integers(3)
    if kind == 0:
        return rng.uniform(0, 1, (side, side))
    if kind == 1:
        return np.clip(rng.normal(0.5, rng.uniform(0.1, 0.3), (side, side)), 0, 1)
    return (rng.random((side, side)) < rng.uniform(0.05, 0.5)).astype(np.float64)


def texture(rng: np.random.Generator) -> np.ndarray:
    """Natural-image-like 1/f^a noise (a in [1.5, 2.5] in power), rescaled to [0, 1]."""
    freq = np.fft.fftfreq(FIELD)[:, None] ** 2 + np.fft.fftfreq(FIELD)[None, :] ** 2
    field = rng.normal(size=(FIELD, FIELD)) + 1j * rng.normal(size=(FIELD, FIELD))
    return rescaled(np.real(np.fft.ifft2(field / np.maximum(freq, 1e-4) ** rng.uniform(0.75, 1.25))))


def elastic(picture: np.ndarray, rng: np.random.Generator, shift: float = 9.0, knots: int = 5) -> np.ndarray:
    """`picture` (H, W) bent by a smooth random displacement (up to about `shift` pixels), as handwriting bends
    type: a `knots` x `knots` grid of random shifts, upsampled bilinearly, each pixel read from where it points."""
    h, w = picture.shape
    field = []
    for _ in range(2):
        coarse = Image.fromarray(rng.uniform(-shift, shift, (knots, knots)).astype(np.float32), mode="F")
        field.append(np.asarray(coarse.resize((w, h), Image.Resampling.BILINEAR)))
    rows, columns = np.mgrid[0:h, 0:w]
    r = np.clip(np.rint(rows + field[0]), 0, h - 1).astype(int)
    c = np.clip(np.rint(columns + field[1]), 0, w - 1).astype(int)
    return picture[r, c]


# Generators the fitting sets also use: pen strokes, doodles, cells, field noise, pages and dust.


def pen_strokes(rng: np.random.Generator) -> np.ndarray:
    """Two to four pen strokes: paths of short steps whose heading turns smoothly (a random curvature that
    drifts), 4-10 pixels wide on a 112 canvas, as a hand moves a pen without writing anything."""
    canvas = Image.new("L", (CANVAS, CANVAS), 0)
    draw = ImageDraw.Draw(canvas)
    for _ in range(rng.integers(2, 5)):
        point = rng.uniform(20, CANVAS - 20, 2)
        heading, curvature = rng.uniform(0, 2 * np.pi), rng.uniform(-0.12, 0.12)
        path = [tuple(point)]
        for _ in range(rng.integers(15, 40)):
            curvature = float(np.clip(curvature + rng.normal(0, 0.04), -0.2, 0.2))
            heading += curvature
            point = np.clip(point + rng.uniform(3, 5) * np.array([np.cos(heading), np.sin(heading)]), 2, CANVAS - 2)
            path.append(tuple(point))
        draw.line(path, fill=255, width=int(rng.integers(4, 11)), joint="curve")
    return np.asarray(canvas) / 255.0


def _curve(rng: np.random.Generator) -> np.ndarray:
    """The points (N, 2) of one doodle in [-1, 1]: a spiral, a zig-zag, a chain of loops or hatching."""
    kind = rng.integers(4)
    if kind == 0:  # an Archimedean spiral of 1.5 to 3.5 turns
        t = np.linspace(0, 2 * np.pi * rng.uniform(1.5, 3.5), 160)
        r = t / t[-1]
        return np.stack([r * np.cos(t), rng.uniform(0.6, 1.0) * r * np.sin(t)], axis=1)
    if kind == 1:  # a zig-zag of 4 to 9 teeth
        teeth = int(rng.integers(4, 10))
        x = np.linspace(-1, 1, 2 * teeth + 1)
        return np.stack([x, rng.uniform(0.2, 0.8) * np.where(np.arange(len(x)) % 2, 1.0, -1.0)], axis=1)
    if kind == 2:  # a chain of 3 to 6 loops, as a pen tests itself (a prolate cycloid)
        loops = int(rng.integers(3, 7))
        t = np.linspace(0, 2 * np.pi * loops, 40 * loops)
        x, y = t - rng.uniform(1.5, 3.0) * np.sin(t), -np.cos(t)
        return np.stack([2 * (x - x.min()) / (x.max() - x.min()) - 1, rng.uniform(0.3, 0.7) * y], axis=1)
    lines = int(rng.integers(4, 9))  # hatching: parallel strokes joined end to start, as one pen movement
    ends = np.linspace(-1, 1, lines)
    return np.array([p for k, v in enumerate(ends) for p in ([v, -1], [v, 1])[:: 1 if k % 2 == 0 else -1]], float)


def doodles(rng: np.random.Generator) -> np.ndarray:
    """One or two doodles (a spiral, a zig-zag, a chain of loops or hatching), each turned, scaled and placed at
    random, 4-9 pixels wide on a 112 canvas."""
    canvas = Image.new("L", (CANVAS, CANVAS), 0)
    draw = ImageDraw.Draw(canvas)
    for _ in range(rng.integers(1, 3)):
        angle = rng.uniform(0, 2 * np.pi)
        turn = np.array([[np.cos(angle), -np.sin(angle)], [np.sin(angle), np.cos(angle)]])
        points = _curve(rng) @ turn.T * rng.uniform(25, 45) + rng.uniform(40, CANVAS - 40, 2)
        draw.line([tuple(p) for p in points], fill=255, width=int(rng.integers(4, 10)), joint="curve")
    return np.asarray(canvas) / 255.0


def cells(rng: np.random.Generator) -> np.ndarray:
    """A texture of another kind than 1/f noise or gratings: the edges of random (Voronoi) cells, a jittered grid of
    dots, or plaid (stripes of random widths both ways)."""
    y, x = np.mgrid[0:FIELD, 0:FIELD].astype(np.float64)
    kind = rng.integers(3)
    if kind == 0:
        seeds = rng.uniform(0, FIELD, (int(rng.integers(8, 30)), 2))
        d = np.sort(np.hypot(y[..., None] - seeds[:, 0], x[..., None] - seeds[:, 1]), axis=-1)
        return (d[..., 1] - d[..., 0] < rng.uniform(1.0, 3.0)).astype(np.float64)
    if kind == 1:
        step = rng.uniform(6, 14)
        centres = np.mgrid[0 : FIELD + step : step, 0 : FIELD + step : step].reshape(2, -1).T
        centres = centres + rng.normal(0, step / 6, centres.shape)
        d = np.min(np.hypot(y[..., None] - centres[:, 0], x[..., None] - centres[:, 1]), axis=-1)
        return (d < rng.uniform(0.2, 0.4) * step).astype(np.float64)
    rows = np.repeat(rng.uniform(0, 1, FIELD // 2 + 1), rng.integers(1, 5, FIELD // 2 + 1))[:FIELD]
    columns = np.repeat(rng.uniform(0, 1, FIELD // 2 + 1), rng.integers(1, 5, FIELD // 2 + 1))[:FIELD]
    rows, columns = np.resize(rows, FIELD), np.resize(columns, FIELD)
    return (rows[:, None] + columns[None, :]) / 2


def field_noise(rng: np.random.Generator) -> np.ndarray:
    """Noise of other kinds than uniform, Gaussian or salt-and-pepper: smooth (blurred) noise at a random scale,
    impulses on a gray page, or scan lines (each row, or each column, of its own gray)."""
    side = int(rng.choice([40, FIELD, 96]))
    kind = rng.integers(3)
    if kind == 0:
        raw = Image.fromarray((rng.uniform(0, 255, (side, side))).astype(np.uint8))
        blurred = np.asarray(raw.filter(ImageFilter.GaussianBlur(float(rng.uniform(1, 4)))), np.float64)
        return rescaled(blurred)
    if kind == 1:
        page = np.full((side, side), rng.uniform(0.3, 0.7))
        hit = rng.random((side, side)) < rng.uniform(0.02, 0.2)
        page[hit] = rng.integers(0, 2, int(hit.sum()))
        return page
    lines = np.repeat(rng.uniform(0, 1, (side, 1)), side, axis=1)
    return lines if rng.random() < 0.5 else lines.T


def pages(rng: np.random.Generator) -> np.ndarray:
    """A blank page of one gray, of random height and width (16 to 200 pixels): photographs and scans are rarely
    square."""
    return np.full(tuple(int(v) for v in rng.integers(16, 201, 2)), rng.uniform(0, 1))


def dust(rng: np.random.Generator) -> np.ndarray:
    """A near-blank page of random size (48 to 128 pixels): four to ten single-pixel dots, or one or two faint soft
    smudges (Gaussian, 1 to 2.5 pixels)."""
    h, w = (int(v) for v in rng.integers(48, 129, 2))
    page = np.zeros((h, w))
    if rng.random() < 0.5:
        n = int(rng.integers(4, 11))
        page[rng.integers(0, h, n), rng.integers(0, w, n)] = rng.uniform(0.2, 1, n)
        return page
    y, x = np.mgrid[0:h, 0:w]
    for _ in range(rng.integers(1, 3)):
        r, c, s = rng.uniform(0, h), rng.uniform(0, w), rng.uniform(1, 2.5)
        page += rng.uniform(0.2, 0.6) * np.exp(-((y - r) ** 2 + (x - c) ** 2) / (2 * s * s))
    return np.clip(page, 0, 1)


# More generators the fitting sets use: brush strokes, spirographs, masonry, block noise, lit pages, sensor noise.


def brush_strokes(rng: np.random.Generator) -> np.ndarray:
    """Two to four brush strokes: each a smooth path (a random cubic through four points) laid down as discs whose
    width swells and thins along it (2 to 14 pixels), as a brush or a felt pen moves, on a 112 canvas."""
    canvas = Image.new("L", (CANVAS, CANVAS), 0)
    draw = ImageDraw.Draw(canvas)
    t = np.linspace(0, 1, 90)[:, None]
    for _ in range(rng.integers(2, 5)):
        p0, p1, p2, p3 = rng.uniform(10, CANVAS - 10, (4, 2))
        path = ((1 - t) ** 3) * p0 + 3 * (1 - t) ** 2 * t * p1 + 3 * (1 - t) * t**2 * p2 + t**3 * p3
        phase, waves, widest = rng.uniform(0, 2 * np.pi), rng.uniform(0.5, 2.0), rng.uniform(5, 14)
        radius = 1 + (widest / 2 - 1) * (0.5 + 0.5 * np.sin(2 * np.pi * waves * t[:, 0] + phase))
        for (x, y), r in zip(path, radius, strict=True):
            draw.ellipse((x - r, y - r, x + r, y + r), fill=int(rng.uniform(200, 255)))
    return np.asarray(canvas) / 255.0


def spirographs(rng: np.random.Generator) -> np.ndarray:
    """A spirograph figure (a hypotrochoid or an epitrochoid of 3 to 9 lobes) or a rose of 3, 5 or 7 petals,
    3-7 pixels wide on a 112 canvas: figures with many lobes, unlike any digit."""
    canvas = Image.new("L", (CANVAS, CANVAS), 0)
    t = np.linspace(0, 2 * np.pi, 720)
    kind = rng.integers(3)
    if kind == 2:
        k = int(rng.choice([3, 5, 7]))
        r = np.cos(k * t)
        x, y = r * np.cos(t), r * np.sin(t)
    else:
        lobes = int(rng.integers(3, 10))
        big, small = 1.0, 1.0 / lobes
        pen = small * rng.uniform(0.6, 1.6)
        if kind == 0:  # hypotrochoid: a wheel rolling inside a ring
            x = (big - small) * np.cos(t) + pen * np.cos((big - small) / small * t)
            y = (big - small) * np.sin(t) - pen * np.sin((big - small) / small * t)
        else:  # epitrochoid: a wheel rolling outside it
            x = (big + small) * np.cos(t) - pen * np.cos((big + small) / small * t)
            y = (big + small) * np.sin(t) - pen * np.sin((big + small) / small * t)
    points = np.stack([x, y], axis=1)
    points = points / np.abs(points).max() * rng.uniform(30, 50) + CANVAS / 2 + rng.uniform(-8, 8, 2)
    ImageDraw.Draw(canvas).line([tuple(p) for p in points], fill=255, width=int(rng.integers(3, 8)), joint="curve")
    return np.asarray(canvas) / 255.0


def masonry(rng: np.random.Generator) -> np.ndarray:
    """A texture of a kind no other set draws: a brick wall (mortar lines, rows offset by half a brick),
    herringbone stripes, or wood grain (rings around a far centre, warped by a slow wave)."""
    y, x = np.mgrid[0:FIELD, 0:FIELD].astype(np.float64)
    kind = rng.integers(3)
    if kind == 0:
        height, width, mortar = rng.uniform(5, 12), rng.uniform(10, 24), rng.uniform(1, 2.5)
        row = np.floor(y / height)
        across = (x + (row % 2) * width / 2) % width
        return 1.0 - ((y % height < mortar) | (across < mortar)).astype(np.float64) * rng.uniform(0.6, 1.0)
    if kind == 1:
        period, block = rng.uniform(4, 9), rng.uniform(8, 16)
        flip = (np.floor(x / block) % 2) * 2 - 1
        return (((x * flip + y) % period) < period / 2).astype(np.float64)
    cy, cx = rng.uniform(-3, 4, 2) * FIELD
    warp = rng.uniform(1, 4) * np.sin(2 * np.pi * (x + y) / rng.uniform(20, 60))
    rings = np.sin(2 * np.pi * (np.hypot(y - cy, x - cx) + warp) / rng.uniform(3, 8))
    return rescaled(rings + rng.normal(0, 0.15, rings.shape))


def block_noise(rng: np.random.Generator) -> np.ndarray:
    """Noise of kinds no other set draws: blocks of random grays (2 to 8 pixels a side, as a coarse JPEG), blotches
    (smooth noise cut at a level, black and white), or a ramp under Gaussian noise."""
    side = int(rng.choice([48, 80, 128]))
    kind = rng.integers(3)
    if kind == 0:
        block = int(rng.integers(2, 9))
        cells = rng.uniform(0, 1, (side // block + 1, side // block + 1))
        return np.kron(cells, np.ones((block, block)))[:side, :side]
    if kind == 1:
        raw = Image.fromarray((rng.uniform(0, 255, (side, side))).astype(np.uint8))
        smooth = np.asarray(raw.filter(ImageFilter.GaussianBlur(float(rng.uniform(2, 6)))), np.float64)
        return (smooth > np.quantile(smooth, rng.uniform(0.3, 0.7))).astype(np.float64)
    ramp = np.linspace(0, 1, side)[None, :] * np.ones((side, 1))
    ramp = ramp if rng.random() < 0.5 else ramp.T
    return np.clip(ramp + rng.normal(0, rng.uniform(0.05, 0.3), (side, side)), 0, 1)


def lit_pages(rng: np.random.Generator) -> np.ndarray:
    """A blank sheet photographed under uneven light: a page of random size (24 to 160 pixels) whose gray drifts
    smoothly by at most 3 of 255 levels from one side to the other."""
    h, w = (int(v) for v in rng.integers(24, 161, 2))
    y, x = np.mgrid[0:h, 0:w] / max(h, w)
    angle = rng.uniform(0, 2 * np.pi)
    slope = (np.cos(angle) * x + np.sin(angle) * y) / (abs(np.cos(angle)) + abs(np.sin(angle)))  # within [-1, 1]
    drift = slope * rng.uniform(0, 1.5 / 255)
    return np.clip(rng.uniform(0.05, 0.95) + drift, 0, 1)


def sensor_noise(rng: np.random.Generator) -> np.ndarray:
    """A near-blank photograph: a dark page of random size (32 to 128 pixels) under faint sensor noise (Gaussian,
    at most 4% of full scale) with one to three hot pixels."""
    h, w = (int(v) for v in rng.integers(32, 129, 2))
    page = np.clip(rng.normal(0.05, rng.uniform(0.005, 0.04), (h, w)), 0, 1)
    n = int(rng.integers(1, 4))
    page[rng.integers(0, h, n), rng.integers(0, w, n)] = rng.uniform(0.5, 1, n)
    return page


def nib_strokes(rng: np.random.Generator) -> np.ndarray:
    """Two or three strokes of a broad-nib pen held at one angle (one alone is often a 1): along a smooth path (a
    quadratic through three points) the mark is widest (6 to 16 pixels) across the nib and thinnest (1 to 3) along
    it, on a 112 canvas."""
    canvas = Image.new("L", (CANVAS, CANVAS), 0)
    draw = ImageDraw.Draw(canvas)
    nib, t = rng.uniform(0, np.pi), np.linspace(0, 1, 80)[:, None]
    for _ in range(rng.integers(2, 4)):
        p0, p1, p2 = rng.uniform(12, CANVAS - 12, (3, 2))
        path = (1 - t) ** 2 * p0 + 2 * (1 - t) * t * p1 + t**2 * p2
        heading = np.arctan2(*np.gradient(path, axis=0).T[::-1])
        wide, thin = rng.uniform(6, 16), rng.uniform(1, 3)
        half = (thin + (wide - thin) * np.abs(np.sin(heading - nib))) / 2
        for (x, y), h in zip(path, half, strict=True):
            dx, dy = h * np.cos(nib), h * np.sin(nib)
            draw.line((x - dx, y - dy, x + dx, y + dy), fill=255, width=2)
    return np.asarray(canvas) / 255.0


def knots(rng: np.random.Generator) -> np.ndarray:
    """A closed random curve that crosses itself several times: x and y each a sum of harmonics 2 to 5 of random
    amplitude and phase (a Fourier knot), 3-7 pixels wide on a 112 canvas."""
    t = np.linspace(0, 2 * np.pi, 600)
    k = np.arange(2, 6)[:, None]
    x, y = ((rng.uniform(0.3, 1, (4, 1)) * np.cos(k * t + rng.uniform(0, 2 * np.pi, (4, 1)))).sum(0) for _ in "xy")
    points = np.stack([x, y], axis=1)
    points = points / np.abs(points).max() * rng.uniform(30, 48) + CANVAS / 2
    canvas = Image.new("L", (CANVAS, CANVAS), 0)
    ImageDraw.Draw(canvas).line([tuple(p) for p in points], fill=255, width=int(rng.integers(3, 8)), joint="curve")
    return np.asarray(canvas) / 255.0


def weaves(rng: np.random.Generator) -> np.ndarray:
    """A woven or printed textile: plaid (bands of random widths and grays across and down, averaged), basket
    weave (blocks of stripes turning by 90 degrees) or a grid of polka dots."""
    y, x = np.mgrid[0:FIELD, 0:FIELD].astype(np.float64)
    kind = rng.integers(3)
    if kind == 0:
        bands = []
        for v in (x, y):
            grays = rng.uniform(0, 1, int(rng.integers(3, 7)))
            bands.append(grays[np.floor(v / rng.uniform(3, 9)).astype(int) % len(grays)])
        return (bands[0] + bands[1]) / 2
    if kind == 1:
        block, period = rng.uniform(8, 16), rng.uniform(2.5, 5)
        turn = (np.floor(x / block) + np.floor(y / block)) % 2
        return np.where(turn == 0, (y % period) < period / 2, (x % period) < period / 2).astype(np.float64)
    step, radius = rng.uniform(8, 16), rng.uniform(0.2, 0.4)
    offset = (np.floor(y / step) % 2) * step / 2 * rng.integers(2)
    return (np.hypot((x + offset) % step - step / 2, y % step - step / 2) < radius * step).astype(np.float64)


def scan_noise(rng: np.random.Generator) -> np.ndarray:
    """Noise of kinds no other set draws: photon (Poisson) noise of a dim exposure, scan lines (every row its own
    gray), or a flat gray halftoned by an ordered 4x4 dither; 40 to 128 pixels a side."""
    side = int(rng.integers(40, 129))
    kind = rng.integers(3)
    if kind == 0:
        level = rng.uniform(0.5, 6)
        return np.clip(rng.poisson(level, (side, side)) / (3 * level), 0, 1)
    if kind == 1:
        rows = rng.uniform(0, 1, (side, 1))
        return np.clip(rows + rng.normal(0, 0.03, (side, side)), 0, 1)
    return (rng.uniform(0.15, 0.85) > np.tile(BAYER, (side // 4 + 1, side // 4 + 1))[:side, :side]).astype(np.float64)


def vignettes(rng: np.random.Generator) -> np.ndarray:
    """A blank sheet under a lens's vignetting: a page of random size (24 to 160 pixels) whose gray falls off
    towards the corners by at most 3 of 255 levels."""
    h, w = (int(v) for v in rng.integers(24, 161, 2))
    y, x = np.mgrid[0:h, 0:w]
    falloff = np.hypot((y - (h - 1) / 2) / max(h / 2, 1), (x - (w - 1) / 2) / max(w / 2, 1)) ** 2 / 2  # 0 to 1
    return np.clip(rng.uniform(0.05, 0.95) - falloff * rng.uniform(0, 3 / 255), 0, 1)


def stains(rng: np.random.Generator) -> np.ndarray:
    """A near-blank page (40 to 128 pixels a side) with one faint stain: smooth noise inside a soft disc of 3 to 10
    pixels, at most a third of full contrast, as a drop of coffee or a fingerprint leaves."""
    h, w = (int(v) for v in rng.integers(40, 129, 2))
    y, x = np.mgrid[0:h, 0:w]
    r, c, size = rng.uniform(0.2, 0.8) * h, rng.uniform(0.2, 0.8) * w, rng.uniform(3, 10)
    disc = np.exp(-((((y - r) ** 2 + (x - c) ** 2) / (2 * size * size)) ** 2))
    raw = Image.fromarray(rng.uniform(0, 255, (h, w)).astype(np.uint8)).filter(ImageFilter.GaussianBlur(2))
    return np.clip(disc * np.asarray(raw, np.float64) / 255 * rng.uniform(0.1, 0.6), 0, 1)


def smooth_noise(rng: np.random.Generator, shape: tuple[int, int], blur: float) -> np.ndarray:
    """Uniform byte noise of `shape` under a Gaussian blur of `blur` pixels, rescaled to [0, 1]."""
    noise = Image.fromarray(rng.integers(0, 256, shape, dtype=np.uint8)).filter(ImageFilter.GaussianBlur(blur))
    return rescaled(np.asarray(noise, np.float64))


def rescaled(field: np.ndarray) -> np.ndarray:
    span = field.max() - field.min()
    return (field - field.min()) / span if span > 0 else np.zeros_like(field)


def wobbly(points: np.ndarray, rng: np.random.Generator, jitter: float) -> list[tuple[float, float]]:
    """A polyline through `points` resampled every 3 pixels and displaced by smoothed noise, as a hand draws it."""
    steps = [np.linspace(a, b, max(2, int(np.hypot(*(b - a)) / 3)), endpoint=False) for a, b in pairwise(points)]
    path = np.concatenate([*steps, points[-1:]])
    noise = np.cumsum(rng.normal(0, jitter, path.shape), axis=0)
    noise -= np.linspace(noise[0], noise[-1], len(path))  # the ends stay where they were
    return [tuple(p) for p in path + noise]


def turn_lines(lines: list[np.ndarray], angle: float, size: float, centre: np.ndarray) -> list[np.ndarray]:
    rotation = np.array([[np.cos(angle), -np.sin(angle)], [np.sin(angle), np.cos(angle)]])
    return [line @ rotation.T * size + centre for line in lines]


def marks(rng: np.random.Generator) -> np.ndarray:
    """One or two marks a reviewer makes with a wobbly pen, 4-10 pixels wide on a 112 canvas: a tick, a cross, an
    arrow (one or two heads), an asterisk of three or four lines, or a double chevron."""
    canvas = Image.new("L", (CANVAS, CANVAS), 0)
    draw = ImageDraw.Draw(canvas)
    for _ in range(rng.integers(1, 3)):
        kind = rng.integers(5)
        if kind == 0:
            lines = [np.array([[-0.6, 0.0], [-0.1, 0.6], [0.9, -0.8]])]
        elif kind == 1:
            lines = [np.array([[-1.0, -1.0], [1.0, 1.0]]), np.array([[1.0, -1.0], [-1.0, 1.0]])]
        elif kind == 2:
            head = np.array([[0.5, -0.45], [1.0, 0.0], [0.5, 0.45]])
            lines = [np.array([[-1.0, 0.0], [1.0, 0.0]]), head] + ([-head] if rng.integers(2) else [])
        elif kind == 3:
            turns = np.pi * np.arange(n := int(rng.integers(3, 5))) / n
            lines = [np.array([[-np.cos(a), -np.sin(a)], [np.cos(a), np.sin(a)]]) for a in turns]
        else:
            lines = [np.array([[x - 0.5, -0.8], [x + 0.3, 0.0], [x - 0.5, 0.8]]) for x in (-0.4, 0.4)]
        width = int(rng.integers(4, 11))
        for line in turn_lines(lines, rng.uniform(0, 2 * np.pi), rng.uniform(18, 40), rng.uniform(35, CANVAS - 35, 2)):
            draw.line(wobbly(line, rng, 0.5), fill=255, width=width, joint="curve")
    return np.asarray(canvas) / 255.0


def _outline(kind: int, rng: np.random.Generator) -> list[np.ndarray]:
    """The lines of a simple sketch in a unit box: a house, a stick figure, a sun, a tree, a five-pointed star, a
    heart, a cloud or a fish."""
    t = np.linspace(0, 2 * np.pi, 40)
    ring = np.stack([np.cos(t), np.sin(t)], axis=1)
    if kind == 0:  # house: walls and a roof, a door
        walls = np.array([[-0.7, 0.9], [-0.7, 0.0], [0.7, 0.0], [0.7, 0.9], [-0.7, 0.9]])
        door = np.array([[-0.15, 0.9], [-0.15, 0.45], [0.2, 0.45], [0.2, 0.9]])
        return [walls, np.array([[-0.9, 0.05], [0.0, -0.8], [0.9, 0.05]]), door]
    if kind == 1:  # stick figure
        arms, legs = (
            np.array([[-0.55, -0.2], [0, -0.05], [0.55, -0.2]]),
            np.array([[-0.45, 0.95], [0, 0.35], [0.45, 0.95]]),
        )
        return [ring * 0.22 + [0, -0.7], np.array([[0, -0.48], [0, 0.35]]), arms, legs]
    if kind == 2:  # sun: a disc's outline and its rays
        turns = np.linspace(0, 2 * np.pi, int(rng.integers(6, 11)), endpoint=False)
        rays = [np.array([[0.5 * np.cos(a), 0.5 * np.sin(a)], [0.95 * np.cos(a), 0.95 * np.sin(a)]]) for a in turns]
        return [ring * 0.38, *rays]
    if kind == 3:  # tree: a trunk and a crown of three bumps
        crown = np.concatenate([ring[5:36] * 0.35 + c for c in ([-0.4, -0.1], [0, -0.55], [0.4, -0.1])])
        return [np.array([[-0.1, 0.95], [-0.1, 0.2]]), np.array([[0.1, 0.95], [0.1, 0.2]]), crown]
    if kind == 4:  # five-pointed star
        a = -np.pi / 2 + np.arange(11) * np.pi / 5
        r = np.where(np.arange(11) % 2 == 0, 0.95, 0.4)
        return [np.stack([r * np.cos(a), r * np.sin(a)], axis=1)]
    if kind == 5:  # heart
        x = 16 * np.sin(t) ** 3
        y = -(13 * np.cos(t) - 5 * np.cos(2 * t) - 2 * np.cos(3 * t) - np.cos(4 * t))
        return [np.stack([x, y], axis=1) / 17]
    if kind == 6:  # cloud: a row of bumps over a flat base
        bumps = [ring[20:41] * r + [c, 0.2] for c, r in ((-0.6, 0.3), (-0.15, 0.45), (0.4, 0.4), (0.75, 0.2))]
        return [np.concatenate([*bumps, [[-0.9, 0.2]]]), np.array([[-0.9, 0.2], [0.95, 0.2]])]
    body = np.stack([0.7 * np.cos(t), 0.4 * np.sin(t)], axis=1)  # fish: a body, a tail and an eye
    return [body, np.array([[0.7, 0.0], [1.0, -0.35], [1.0, 0.35], [0.7, 0.0]]), ring[::4] * 0.05 + [-0.4, -0.1]]


def sketches(rng: np.random.Generator) -> np.ndarray:
    """A quick sketch of a thing: a house, a stick figure, a sun, a tree, a star, a heart, a cloud or a fish, drawn
    with a wobbly pen 3-7 pixels wide, turned by up to 20 degrees, on a 112 canvas."""
    canvas = Image.new("L", (CANVAS, CANVAS), 0)
    draw = ImageDraw.Draw(canvas)
    size, centre = rng.uniform(30, 48), rng.uniform(50, CANVAS - 50, 2)
    lines = turn_lines(_outline(int(rng.integers(8)), rng), rng.uniform(-0.35, 0.35), size, centre)
    width = int(rng.integers(3, 8))
    for line in lines:
        draw.line(wobbly(line, rng, 0.3), fill=255, width=width, joint="curve")
    return np.asarray(canvas) / 255.0


def tilings(rng: np.random.Generator) -> np.ndarray:
    """A tiled surface, 64 pixels a side: Truchet tiles (quarter circles turned at random), a maze of random
    diagonals, a moiré of two fine gratings, or fish scales (rows of overlapping arcs)."""
    y, x = np.mgrid[0:FIELD, 0:FIELD].astype(np.float64)
    kind, cell = rng.integers(4), rng.uniform(8, 16)
    i, j = np.floor(y / cell).astype(int), np.floor(x / cell).astype(int)
    u, v = (x % cell) / cell, (y % cell) / cell
    flip = rng.integers(0, 2, (i.max() + 1, j.max() + 1))[i, j] == 1
    if kind == 0:
        u = np.where(flip, 1 - u, u)
        near = np.minimum(np.abs(np.hypot(u, v) - 0.5), np.abs(np.hypot(1 - u, 1 - v) - 0.5))
        return (near < 0.1).astype(np.float64)
    if kind == 1:
        return (np.abs(np.where(flip, u - v, u + v - 1)) < 0.12).astype(np.float64)
    if kind == 2:
        a, b = rng.uniform(0, np.pi), rng.uniform(0.05, 0.2)
        period = rng.uniform(2.5, 4)
        first = np.sin(2 * np.pi * (x * np.cos(a) + y * np.sin(a)) / period)
        second = np.sin(2 * np.pi * (x * np.cos(a + b) + y * np.sin(a + b)) / (period * rng.uniform(0.95, 1.05)))
        return (1 + first) * (1 + second) / 4
    shifted = (x + (i % 2) * cell / 2) % cell / cell
    return (np.abs(np.hypot(shifted - 0.5, v) - 0.5) < 0.08).astype(np.float64)


def codec_noise(rng: np.random.Generator) -> np.ndarray:
    """Noise of kinds no other set draws, 32 to 128 pixels a side: uniform noise after JPEG compression at quality
    2 to 10, interlaced video noise (odd rows shifted against even ones), or speckle (a gray multiplied by
    exponential noise, as in ultrasound and radar)."""
    side = int(rng.integers(32, 129))
    kind = rng.integers(3)
    if kind == 0:
        buffer = io.BytesIO()
        noise = Image.fromarray(rng.integers(0, 256, (side, side), dtype=np.uint8))
        noise.save(buffer, "JPEG", quality=int(rng.integers(2, 11)))
        return np.asarray(Image.open(buffer), np.float64) / 255.0
    if kind == 1:
        field = smooth_noise(rng, (side, side), 3)
        field[1::2] = np.roll(field[1::2], int(rng.integers(2, 7)), axis=1)
        return field
    return np.clip(rng.uniform(0.2, 0.6) * rng.exponential(1.0, (side, side)), 0, 1)


def paper(rng: np.random.Generator) -> np.ndarray:
    """A blank sheet of paper with its fibres: smooth grain of at most 3 of 255 gray levels on a page of random
    size (24 to 160 pixels)."""
    h, w = (int(v) for v in rng.integers(24, 161, 2))
    grain = smooth_noise(rng, (h, w), 1.5)
    return np.clip(rng.uniform(0.05, 0.95) + grain * rng.uniform(0, 3 / 255), 0, 1)


def notebook(rng: np.random.Generator) -> np.ndarray:
    """An empty page of a notebook (60 to 140 pixels a side): faint ruled lines 6 to 12 pixels apart at 4 to 20% of
    full contrast, sometimes a margin line or the grid of squared paper."""
    h, w = (int(v) for v in rng.integers(60, 141, 2))
    y, x = np.mgrid[0:h, 0:w].astype(np.float64)
    gap, contrast = rng.uniform(6, 12), rng.uniform(0.04, 0.2)
    page = ((y % gap) < 1).astype(np.float64)
    extra = rng.integers(3)
    if extra == 1:  # a margin
        page = np.maximum(page, (np.abs(x - w * 0.15) < 1).astype(np.float64))
    elif extra == 2:  # squared paper
        page = np.maximum(page, ((x % gap) < 1).astype(np.float64))
    return page * contrast

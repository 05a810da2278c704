"""Fitting non-digits drawn as pictures (`training.ood.nondigits.NONDIGIT_SETS`), each its own kind of image, not a
variant of another: signatures, outlined figures (never a circle, which is a 0), halftone screens, corrupt image
data, flat fills, show-through pages, zigzags, hatching, woven plaids, ordered dithering, transparency checkerboards,
wiped boards (the ghost of erased writing), waves, staves of music, terrazzo, fax noise, empty dialog windows, rubber
stamps, solid bars (a title bar or a rule out of a crop), heartbeats (an electrocardiogram's trace), crayon patches,
knitted fabric, TV snow, folded sheets (two faces lit differently), crumpled pages and solid shapes (triangles,
quadrilaterals, pentagons and wedges of one shade on another, as a folded sheet's lit face comes out of a crop).
"""

from __future__ import annotations

import numpy as np
from PIL import Image, ImageDraw, ImageFilter

from training.ood.shapes import BAYER, CANVAS, FIELD, smooth_noise, turn_lines, wobbly


def signatures(rng: np.random.Generator) -> np.ndarray:
    """A signature's scrawl: a pen moving right while it loops (a prolate trochoid of 3 to 7 loops, each of its own
    height), slanted, sometimes with an underline flourish; 2 to 7 pixels wide on a 112 canvas."""
    loops = int(rng.integers(3, 8))
    t = np.linspace(0, 2 * np.pi * loops, 60 * loops)
    heights = np.repeat(rng.uniform(0.5, 1.4, loops), 60)
    x = t / (2 * np.pi * loops) * 2 - 1 + 0.12 * np.sin(t) * rng.uniform(0.5, 1.5)
    y = -heights * 0.35 * np.cos(t) * rng.uniform(0.6, 1.0) + np.cumsum(rng.normal(0, 0.004, t.size))
    slant = rng.uniform(-0.4, 0.4)
    lines = [np.stack([x + slant * y, y], axis=1)]
    if rng.integers(2):
        lines.append(np.array([[-0.9, 0.55], [0.0, 0.5 + rng.uniform(0, 0.1)], [1.0, 0.45]]))
    canvas = Image.new("L", (CANVAS, CANVAS), 0)
    draw = ImageDraw.Draw(canvas)
    width = int(rng.integers(2, 8))
    placed = turn_lines(lines, rng.uniform(-0.3, 0.3), rng.uniform(35, 50), np.array([CANVAS / 2, CANVAS / 2]))
    for line in placed:
        draw.line(wobbly(line, rng, 0.3), fill=255, width=width, joint="curve")
    return np.asarray(canvas) / 255.0


def _figure(kind: int, rng: np.random.Generator) -> list[np.ndarray]:
    """The lines of an outlined figure in a unit box: a triangle, a square, a diamond, a pentagon or hexagon, a
    ticked box, two overlapping rectangles, or a square inside a square."""
    if kind in (0, 3):
        n = 3 if kind == 0 else int(rng.integers(5, 7))
        a = -np.pi / 2 + 2 * np.pi * np.arange(n + 1) / n
        return [np.stack([np.cos(a), np.sin(a)], axis=1) * 0.95]
    square = np.array([[-1.0, -1.0], [1.0, -1.0], [1.0, 1.0], [-1.0, 1.0], [-1.0, -1.0]]) * 0.85
    if kind == 1:
        return [square * [1.0, rng.uniform(0.6, 1.0)]]
    if kind == 2:
        return [np.array([[0.0, -1.0], [0.7, 0.0], [0.0, 1.0], [-0.7, 0.0], [0.0, -1.0]])]
    if kind == 4:
        return [square, np.array([[-0.5, 0.0], [-0.1, 0.45], [0.6, -0.55]])]
    if kind == 5:
        return [square * [0.8, 0.5] + [-0.2, -0.25], square * [0.6, 0.55] + [0.3, 0.3]]
    return [square, square * 0.45]


def figures(rng: np.random.Generator) -> np.ndarray:
    """One or two outlined figures drawn by hand (`_figure`), 3 to 9 pixels wide on a 112 canvas."""
    canvas = Image.new("L", (CANVAS, CANVAS), 0)
    draw = ImageDraw.Draw(canvas)
    for _ in range(rng.integers(1, 3)):
        width = int(rng.integers(3, 10))
        lines = turn_lines(_figure(int(rng.integers(7)), rng), rng.uniform(-0.5, 0.5), rng.uniform(20, 42),
                           rng.uniform(40, CANVAS - 40, 2))  # fmt: skip
        for line in lines:
            draw.line(wobbly(line, rng, 0.4), fill=255, width=width, joint="curve")
    return np.asarray(canvas) / 255.0


def halftones(rng: np.random.Generator) -> np.ndarray:
    """A smooth random picture printed as a halftone, 64 pixels a side: a screen of dots (on a grid 4 to 8 pixels
    apart, turned by any angle, each dot as large as the picture is dark there) or a line screen (parallel lines
    as thick as the picture is dark)."""
    tone = smooth_noise(rng, (FIELD, FIELD), rng.uniform(4, 10))
    y, x = np.mgrid[0:FIELD, 0:FIELD].astype(np.float64)
    pitch, angle = rng.uniform(4, 8), rng.uniform(0, np.pi / 2)
    u = (x * np.cos(angle) + y * np.sin(angle)) / pitch
    v = (-x * np.sin(angle) + y * np.cos(angle)) / pitch
    if rng.integers(2):
        distance = np.hypot(u - np.round(u), v - np.round(v))
        return (distance < 0.5 * np.sqrt(tone)).astype(np.float64)
    return (np.abs(u - np.round(u)) < 0.5 * tone).astype(np.float64)


def glitches(rng: np.random.Generator) -> np.ndarray:
    """Corrupt image data, 32 to 128 pixels a side: random bytes whose rows get stuck (each row repeats the one
    above it with probability one half), a blurred noise posterized to 2 to 4 gray levels, or blurred noise torn
    into horizontal bands shifted against each other."""
    side = int(rng.integers(32, 129))
    kind = rng.integers(3)
    if kind == 0:
        rows = rng.integers(0, 256, (side, side)).astype(np.float64) / 255.0
        for r in range(1, side):
            if rng.integers(2):
                rows[r] = rows[r - 1]
        return rows
    field = smooth_noise(rng, (side, side), rng.uniform(1.5, 4))
    if kind == 1:
        levels = int(rng.integers(2, 5))
        return np.floor(field * levels).clip(0, levels - 1) / (levels - 1)
    cuts = np.sort(rng.integers(1, side, int(rng.integers(3, 9))))
    for band in np.split(np.arange(side), cuts):
        field[band] = np.roll(field[band], int(rng.integers(-side // 3, side // 3)), axis=1)
    return field


def fills(rng: np.random.Generator) -> np.ndarray:
    """A flat fill of one gray level at any aspect ratio, from a square to a strip of 1:10 (8 to 200 pixels a side),
    as a paint program saves an empty canvas."""
    short, ratio = int(rng.integers(8, 64)), rng.uniform(1, 10)
    sides = [short, min(200, int(short * ratio))]
    rng.shuffle(sides)
    return np.full(tuple(sides), rng.uniform(0, 1))


def show_through(rng: np.random.Generator) -> np.ndarray:
    """An empty page whose back shows through (80 to 140 pixels a side): rows of faint, blurred, word-sized blobs, at
    5 to 25% of full contrast."""
    h, w = (int(v) for v in rng.integers(80, 141, 2))
    canvas = Image.new("L", (w, h), 0)
    draw = ImageDraw.Draw(canvas)
    gap = rng.uniform(9, 16)
    for top in np.arange(rng.uniform(4, 12), h - 8, gap):
        x = rng.uniform(4, 14)
        while x < w - 10:
            length = rng.uniform(6, 30)
            draw.rectangle([x, top, min(x + length, w - 4), top + gap * 0.45], fill=255)
            x += length + rng.uniform(3, 8)
    page = np.asarray(canvas.filter(ImageFilter.GaussianBlur(rng.uniform(1.5, 3))), np.float64) / 255.0
    return page * rng.uniform(0.05, 0.25)


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


def solid_bars(rng: np.random.Generator) -> np.ndarray:
    """One to three solid bars of one shade on a ground of another (2% to 100% of full contrast), 40 to 180 pixels a
    side: each a rectangle from a square to a strip of 1:15, some running off the edge, as a title bar, a rule or a
    redaction comes out of a crop. Strips longer than 2.5:1 lie within 20 degrees of level (upright, they are ones)."""
    h, w = (int(v) for v in rng.integers(40, 181, 2))
    ground = rng.uniform(0, 1)
    shade = np.clip(ground + rng.choice([-1, 1]) * rng.uniform(0.02, 1.0), 0, 1)
    canvas = Image.new("L", (w, h), 0)
    draw = ImageDraw.Draw(canvas)
    for _ in range(int(rng.integers(1, 4))):
        long, ratio = rng.uniform(0.2, 1.2) * max(h, w), rng.uniform(1, 15)
        short = max(2.0, long / ratio)
        cx, cy = rng.uniform(0, w), rng.uniform(0, h)
        turn = np.deg2rad(rng.uniform(-20, 20) + (90 * int(rng.integers(2)) if ratio <= 2.5 else 0))
        corners = np.array([[-long, -short], [long, -short], [long, short], [-long, short]]) / 2
        rotation = np.array([[np.cos(turn), -np.sin(turn)], [np.sin(turn), np.cos(turn)]])
        draw.polygon([(cx + x, cy + y) for x, y in corners @ rotation.T], fill=255)
    mask = np.asarray(canvas, np.float64) / 255.0
    return ground + (shade - ground) * mask


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


def _stout(mask: np.ndarray) -> bool:
    """Whether the marked pixels of `mask` (H, W) cover at least 1% of it and are no sliver: the long axis of their
    spread at most 2.5 times the short one."""
    ys, xs = np.nonzero(mask > 127)
    if ys.size < 0.01 * mask.size:
        return False
    spread = np.linalg.eigvalsh(np.cov(np.stack([xs, ys]).astype(np.float64)))
    return bool(spread[1] <= 6.25 * max(float(spread[0]), 1e-9))


def _solid_shape(rng: np.random.Generator, h: int, w: int) -> np.ndarray:
    """One solid shape (255 on 0, h x w): a right triangle filling a corner (legs along two edges, up to 1.6 sides
    long: a folded sheet's lit face), a triangle, quadrilateral or pentagon (some half past an edge), or a wedge (a
    pie slice of 40 to 150 degrees); drawn again until it is stout (`_stout`)."""
    while True:
        canvas = Image.new("L", (w, h), 0)
        draw = ImageDraw.Draw(canvas)
        kind = rng.random()
        if kind < 0.3:
            a, b = rng.uniform(0.3, 1.6) * w, rng.uniform(0.3, 1.6) * h
            corner = np.abs(np.array([w * int(rng.integers(2)), h * int(rng.integers(2))]) - [[0, 0], [a, 0], [0, b]])
            draw.polygon([(float(x), float(y)) for x, y in corner], fill=255)
        elif kind < 0.85:
            centre = rng.uniform(0.15, 0.85, 2) * [w, h]
            if rng.random() < 0.3:  # against an edge, half past it
                axis = int(rng.integers(2))
                centre[axis] = [w, h][axis] * float(rng.choice([rng.uniform(0, 0.05), rng.uniform(0.95, 1)]))
            radius = rng.uniform(0.2, 0.55) * min(h, w) * rng.uniform(0.6, 1.0, int(rng.choice([3, 4, 5])))
            angles = np.sort(rng.uniform(0, 2 * np.pi, radius.size))
            points = centre + radius[:, None] * np.stack([np.cos(angles), np.sin(angles)], axis=1)
            draw.polygon([(float(x), float(y)) for x, y in points], fill=255)
        else:
            r, start = rng.uniform(0.3, 0.7) * min(h, w), rng.uniform(0, 360)
            cx, cy = rng.uniform(0.2, 0.8) * w, rng.uniform(0.2, 0.8) * h
            draw.pieslice([cx - r, cy - r, cx + r, cy + r], start, start + rng.uniform(40, 150), fill=255)
        mask = np.asarray(canvas)
        if _stout(mask):
            return mask


def solid_shapes(rng: np.random.Generator) -> np.ndarray:
    """One or two solid shapes (`_solid_shape`: corner triangles, triangles, quadrilaterals, pentagons, wedges) of one
    shade on a ground of another (5% to 100% of full contrast), 40 to 180 pixels a side, with hard or soft edges and
    mild noise: as a folded sheet's lit face comes out of the preprocessing. No sliver or thin stroke."""
    h, w = (int(v) for v in rng.integers(40, 181, 2))
    ground = rng.uniform(0, 1)
    shade = np.clip(ground + rng.choice([-1, 1]) * rng.uniform(0.05, 1.0), 0, 1)
    mask = np.zeros((h, w), np.uint8)
    for _ in range(int(rng.integers(1, 3))):
        mask = np.maximum(mask, _solid_shape(rng, h, w))
    canvas = Image.fromarray(mask)
    if rng.random() < 0.5:
        canvas = canvas.filter(ImageFilter.GaussianBlur(float(rng.uniform(0.5, 3))))
    cover = np.asarray(canvas, np.float64) / 255.0
    return np.clip(ground + (shade - ground) * cover + rng.normal(0, rng.uniform(0, 0.03), (h, w)), 0, 1)

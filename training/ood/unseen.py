"""The reported test sets' drawn non-digits: strokes, scribbles, textures, noise and pages that no fitting,
validation or confirmation set draws (`training.ood.nondigits.TEST_SETS`).

Each generator is its own kind of image, not a variant of a fitting one: circuit traces (the copper fanning out
from a chip's pins to vias), seams (rows of stitches in fabric: running, blanket or cross stitches), raindrops (drops
on a window, each a lens showing the blurred scene behind), brushed metal (fine scratches along one direction or
round a centre), blind shadows (a blank sheet in the light through a venetian blind) and eraser crumbs
(a page where a pencil mark was rubbed out).
"""

from __future__ import annotations

import numpy as np
from PIL import Image, ImageDraw

from training.ood.shapes import CANVAS, FIELD, smooth_noise


def circuit_traces(rng: np.random.Generator) -> np.ndarray:
    """The copper round a chip on a circuit board, 112 canvas: a row of 4 to 8 pads (its pins, 6 to 9 pixels apart)
    on one side or both, each leaving as a trace 1 to 3 pixels wide that runs out, fans away from the middle by 45
    degrees (the outer ones first, so that none crosses another) and runs out again to a via (a ring); the board
    turned by a quarter turn or none, and by up to 8 degrees more, and fitted into 96 pixels."""
    pins, pitch, width = int(rng.integers(4, 9)), rng.uniform(6, 9), int(rng.integers(1, 4))
    offsets = (np.arange(pins) - (pins - 1) / 2) * pitch
    body, pad, diagonal = rng.uniform(4, 12), rng.uniform(4, 7), rng.uniform(8, 20)  # half the chip, a pad, a fan
    ranks = np.argsort(np.argsort(-np.abs(offsets)))  # the outermost pins turn first
    traces: list[np.ndarray] = []
    pads: list[np.ndarray] = []
    for side in [1, -1] if rng.random() < 0.5 else [1]:
        step = rng.uniform(2, 4)
        for x, rank in zip(offsets, ranks, strict=True):
            out, lean = body + pad + rng.uniform(6, 10) + step * rank, np.sign(x) * diagonal / np.sqrt(2)
            route = [[x, body], [x, out], [x + lean, out + abs(lean)], [x + lean, out + abs(lean) + rng.uniform(4, 12)]]
            traces.append(np.array(route) * [1, side])
            pads.append(np.array([[x - pitch / 4, body], [x + pitch / 4, body + pad]]) * [1, side])
    turn = np.pi / 2 * int(rng.integers(2)) + np.deg2rad(rng.uniform(-8, 8))
    rotation = np.array([[np.cos(turn), -np.sin(turn)], [np.sin(turn), np.cos(turn)]])
    every = np.concatenate(traces) @ rotation.T
    low, high = every.min(axis=0), every.max(axis=0)
    scale = min(1.0, 96 / float((high - low).max()))

    def place(points: np.ndarray) -> np.ndarray:
        return (points @ rotation.T - (low + high) / 2) * scale + CANVAS / 2

    canvas = Image.new("L", (CANVAS, CANVAS), 0)
    draw = ImageDraw.Draw(canvas)
    via = rng.uniform(2, 3.5) * scale
    for path, corners in zip(traces, pads, strict=True):
        draw.line([tuple(q) for q in place(path)], fill=255, width=max(1, round(width * scale)), joint="curve")
        box = place(corners)
        draw.rectangle([*box.min(axis=0), *box.max(axis=0)], fill=255)
        cx, cy = place(path)[-1]
        draw.ellipse([cx - via, cy - via, cx + via, cy + via], outline=255, width=max(1, int(via / 2)))
    return np.asarray(canvas) / 255.0


def seams(rng: np.random.Generator) -> np.ndarray:
    """Stitching on a 112 canvas: one to three seams side by side along a gentle curve (70 to 100 pixels across, its
    chord within 20 degrees of level, bowing by up to 10 pixels), each a row of running stitches (dashes 4 to 9
    pixels long), blanket stitches (a line with a tick every 5 to 8 pixels) or cross stitches (an x every 6 to 9
    pixels), 1 to 3 pixels wide."""
    canvas = Image.new("L", (CANVAS, CANVAS), 0)
    draw = ImageDraw.Draw(canvas)
    kind, width = int(rng.integers(3)), int(rng.integers(1, 4))
    angle, span, bow = rng.uniform(-0.35, 0.35), rng.uniform(70, 100), rng.uniform(-10, 10)
    t = np.linspace(-0.5, 0.5, 400)[:, None]
    along, across = np.array([np.cos(angle), np.sin(angle)]), np.array([-np.sin(angle), np.cos(angle)])
    rows = int(rng.integers(1, 4))
    for k in range(rows):
        shift = (k - (rows - 1) / 2) * rng.uniform(8, 14)
        line = CANVAS / 2 + t * span * along + ((1 - 4 * t * t) * bow + shift) * across
        length = np.concatenate([[0], np.cumsum(np.hypot(*np.diff(line, axis=0).T))])
        step = rng.uniform(*[(6, 13), (5, 8), (6, 9)][kind])
        if kind == 1:
            draw.line([tuple(p) for p in line], fill=255, width=width)
        for start in np.arange(rng.uniform(0, step), length[-1] - 2, step):
            at = line[np.searchsorted(length, start)]
            if kind == 0:
                end = line[np.searchsorted(length, min(start + step * rng.uniform(0.55, 0.75), length[-1]))]
                draw.line([tuple(at), tuple(end)], fill=255, width=width)
            elif kind == 1:
                draw.line([tuple(at), tuple(at + across * rng.uniform(4, 7))], fill=255, width=width)
            else:
                a, b = 2.5 * (along + across), 2.5 * (along - across)
                draw.line([tuple(at - a), tuple(at + a)], fill=255, width=width)
                draw.line([tuple(at - b), tuple(at + b)], fill=255, width=width)
    return np.asarray(canvas) / 255.0


def raindrops(rng: np.random.Generator) -> np.ndarray:
    """Rain on a window, 64 pixels a side: a blurred scene behind (smooth noise), and 25 to 70 drops (1.5 to 6 pixels
    across, some oval), each a lens showing the scene upside down and brighter, with a dark rim below and a glint
    above; one to three have run down, leaving a wavering trail of small beads."""
    y, x = np.mgrid[0:FIELD, 0:FIELD].astype(np.float64)
    scene = 0.15 + 0.6 * smooth_noise(rng, (FIELD, FIELD), rng.uniform(5, 12))
    glass = scene.copy()
    drops = [
        (rng.uniform(0, FIELD, 2), rng.uniform(0.75, 3), rng.uniform(0.7, 1.3)) for _ in range(rng.integers(25, 71))
    ]
    for _ in range(int(rng.integers(1, 4))):
        cx, top = rng.uniform(4, FIELD - 4), rng.uniform(0, FIELD / 2)
        for cy in np.arange(top, FIELD, rng.uniform(2, 4)):
            drops.append((np.array([cx + rng.normal(0, 0.8), cy]), rng.uniform(0.6, 1.2), 1.0))
        drops.append((np.array([cx, top]), rng.uniform(2, 3.5), 1.1))
    for (cx, cy), r, squash in drops:
        inside = ((x - cx) / r) ** 2 + ((y - cy) / (r * squash)) ** 2
        lens = inside <= 1
        flipped = scene[np.clip((2 * cy - y).astype(int), 0, FIELD - 1), x.astype(int)]
        glass[lens] = (0.25 + 0.85 * flipped)[lens]
        rim = (inside > 0.6) & lens & (y > cy)
        glass[rim] *= 0.55
        glint = ((x - cx + 0.35 * r) ** 2 + (y - cy + 0.35 * r) ** 2) < (0.3 * r) ** 2
        glass[glint] = 1.0
    return np.clip(glass, 0, 1)


def _smeared(rng: np.random.Generator, shape: tuple[int, int], length: int) -> np.ndarray:
    """Gaussian noise of `shape` averaged along each row over `length` pixels (wrapping round): scratches."""
    noise = rng.normal(0, 1, shape)
    total = np.cumsum(np.concatenate([noise, noise[:, :length]], axis=1), axis=1)
    return (total[:, length:] - total[:, :-length])[:, : shape[1]] / np.sqrt(length)


def brushed_metal(rng: np.random.Generator) -> np.ndarray:
    """A brushed metal plate photographed, 48 to 128 pixels a side: fine scratches, Gaussian noise smeared along one
    direction (any angle, over 10 to 40 pixels) or along circles round a centre (a spun finish, as on a turned lid,
    over 5 to 15 degrees), at 4% to 10% of full contrast (one standard deviation) on an even gray: no sheen, whose
    bright band would come out of the preprocessing as a bar."""
    h, w = (int(v) for v in rng.integers(48, 129, 2))
    y, x = np.mgrid[0:h, 0:w].astype(np.float64)
    if rng.random() < 0.5:
        side = int(np.ceil(np.hypot(h, w))) + 2
        field = _smeared(rng, (side, side), int(rng.integers(10, 41)))
        turned = Image.fromarray(field.astype(np.float32), "F").rotate(
            float(rng.uniform(0, 180)), Image.Resampling.BILINEAR
        )
        top, left = (side - h) // 2, (side - w) // 2
        scratches = np.asarray(turned, np.float64)[top : top + h, left : left + w]
    else:
        cy, cx = rng.uniform(-0.5, 1.5) * h, rng.uniform(-0.5, 1.5) * w
        radius, angle = np.hypot(y - cy, x - cx), np.arctan2(y - cy, x - cx)
        turns = 720
        field = _smeared(rng, (int(radius.max()) + 2, turns), int(turns * rng.uniform(5, 15) / 360))
        scratches = field[radius.astype(int), ((angle + np.pi) / (2 * np.pi) * turns).astype(int) % turns]
    scratches = scratches / max(float(scratches.std()), 1e-9)
    return np.clip(rng.uniform(0.35, 0.65) + rng.uniform(0.04, 0.1) * scratches, 0, 1)


def blind_shadows(rng: np.random.Generator) -> np.ndarray:
    """A blank sheet in the light through a venetian blind, 40 to 180 pixels wide and 0.6 to 1.6 times as high:
    three to eight soft bands of shadow across it (within 50 degrees of level), each a third to two thirds of its
    period, 2% to 18% of full contrast darker, over a drift of at most 3 of 255 levels. Under the service's contrast
    floor a sheet comes out blank (about three in five), over it as soft stripes."""
    w = int(rng.integers(40, 181))
    h = int(w * rng.uniform(0.6, 1.6))
    y, x = np.mgrid[0:h, 0:w].astype(np.float64)
    angle = rng.uniform(-0.87, 0.87) + np.pi / 2
    across = x * np.cos(angle) + y * np.sin(angle)
    period = (abs(w * np.cos(angle)) + abs(h * np.sin(angle))) / rng.uniform(3, 8)
    phase = (across / period + rng.uniform(0, 1)) % 1
    duty, soft = rng.uniform(1 / 3, 2 / 3), rng.uniform(0.03, 0.12)
    shadow = np.clip(np.minimum(phase, duty - phase) / soft + 0.5, 0, 1)  # 1 inside a band, soft at its edges
    drift = rng.uniform(0, 3 / 255) * (x / w if rng.random() < 0.5 else y / h)
    return np.clip(rng.uniform(0.7, 0.97) - rng.uniform(0.02, 0.18) * shadow + drift, 0, 1)


def eraser_crumbs(rng: np.random.Generator) -> np.ndarray:
    """A page after rubbing out, 60 to 140 pixels a side: 4 to 10 crumbs of eraser (short rolled curls 3 to 9 pixels
    long and 2 or 3 wide, gray with graphite at 12% to 60% of full contrast, at least 11 pixels apart: a heap of them
    would make a shape) scattered over a patch of about a third to two thirds of the page's shorter side each way
    (never a row of them), over the broad smear where the pencil was, at most a twelfth as dark."""
    h, w = (int(v) for v in rng.integers(60, 141, 2))
    patch = np.minimum(rng.uniform(1 / 3, 2 / 3) * min(h, w) * rng.uniform(0.8, 1.25, 2), [w, h])  # about square
    corner = rng.uniform(0, 1, 2) * ([w, h] - patch)
    shade, wanted = rng.uniform(0.15, 0.6), int(rng.integers(4, 11))
    centres: list[np.ndarray] = []
    for _ in range(200):
        centre = corner + rng.uniform(0, 1, 2) * patch
        if all(np.hypot(*(centre - other)) >= 11 for other in centres):
            centres.append(centre)
        if len(centres) == wanted:
            break
    crumbs = Image.new("L", (w, h), 0)
    draw = ImageDraw.Draw(crumbs)
    for centre in centres:
        heading, t = rng.uniform(0, 2 * np.pi), np.linspace(-0.5, 0.5, 8)[:, None] * rng.uniform(3, 9)
        bend = rng.uniform(-0.4, 0.4) * t * t
        curl = centre + t * [np.cos(heading), np.sin(heading)] + bend * [-np.sin(heading), np.cos(heading)]
        draw.line([tuple(p) for p in curl], fill=int(255 * shade * rng.uniform(0.8, 1)), width=int(rng.integers(2, 4)),
                  joint="curve")  # fmt: skip
    y, x = np.mgrid[0:h, 0:w].astype(np.float64)
    middle, spread = corner + patch / 2, patch / 1.5
    smear = np.exp(-(((x - middle[0]) / spread[0]) ** 2 + ((y - middle[1]) / spread[1]) ** 2))
    return np.clip(np.asarray(crumbs, np.float64) / 255.0 + shade * rng.uniform(0, 1 / 12) * smear, 0, 1)

"""Routing explanations as images: the routing map of a class spread over the input, and its PNG overlay.

The model's explanation output is a per-class map over the PrimaryCaps grid (c_ij * |u_hat_j|i| summed
over the capsule types). Grid cell (r, c) sees the input pixels rows r*stride .. r*stride + size - 1
and the same columns (the card's `receptive_field`); `input_heatmap` gives each input pixel the mean
weight of the cells whose receptive fields contain it. Receptive fields overlap (17x17 at stride 2 in
the paper's network), so a plain sum would mostly draw how many cells see a pixel; the mean draws a
uniform grid as a uniform heatmap. Pixels that no cell sees (the last row and column of MNIST's 28x28)
get 0.
"""

from __future__ import annotations

import io

import numpy as np
from PIL import Image

HEAT_COLOUR = np.array([1.0, 0.25, 0.0])  # red-orange, drawn over the grayscale input
HEAT_OPACITY = 0.7  # how much of a pixel the hottest heat covers


def input_heatmap(grid: np.ndarray, size: int, stride: int, image_size: tuple[int, int]) -> np.ndarray:
    """A (rows, columns) grid map -> (height, width) input map: per pixel, the mean weight of the cells that see it."""
    height, width = image_size
    total = np.zeros((height, width), np.float64)
    covering = np.zeros((height, width), np.int64)
    for r in range(grid.shape[0]):
        for c in range(grid.shape[1]):
            window = (slice(r * stride, r * stride + size), slice(c * stride, c * stride + size))
            total[window] += float(grid[r, c])
            covering[window] += 1
    return np.where(covering > 0, total / np.maximum(covering, 1), 0.0)


def overlay_png(image: np.ndarray, heat: np.ndarray, scale: int) -> bytes:
    """The input (H, W) in [0, 1] in gray with `heat` (H, W) in colour, upscaled `scale`x.

    The heat is stretched from its minimum (transparent) to its maximum (HEAT_OPACITY), so what stands
    out is where the class's votes come from more than elsewhere; a flat map draws nothing.
    """
    low, span = (float(heat.min()), float(np.ptp(heat))) if heat.size else (0.0, 0.0)
    alpha = HEAT_OPACITY * ((heat - low) / span if span > 0 else np.zeros_like(heat))[..., None]  # (H, W, 1)
    gray = np.repeat(np.clip(np.nan_to_num(image), 0.0, 1.0)[..., None], 3, axis=2)  # (H, W, 3)
    rgb = (1.0 - alpha) * gray + alpha * HEAT_COLOUR
    pixels = np.round(rgb * 255.0).astype(np.uint8)
    picture = Image.fromarray(pixels, mode="RGB")
    if scale > 1:
        picture = picture.resize((picture.width * scale, picture.height * scale), Image.Resampling.NEAREST)
    buffer = io.BytesIO()
    picture.save(buffer, format="PNG")
    return buffer.getvalue()

"""Routing explanations as images: the routing map of a class spread over the input, and its PNG overlay.

The model's explanation output is a per-class map over the PrimaryCaps grid (c_ij * |u_hat_j|i| summed
over the capsule types). Grid cell (r, c) sees the input pixels rows r*stride .. r*stride + size - 1
and the same columns (the card's `receptive_field`); `input_heatmap` spreads each cell's weight evenly
over those pixels (weight / size^2 per pixel), so the heatmap sums to the same total as the grid.
"""

from __future__ import annotations

import io

import numpy as np
from PIL import Image

HEAT_COLOUR = np.array([1.0, 0.25, 0.0])  # red-orange, drawn over the grayscale input
HEAT_OPACITY = 0.7  # how much of a pixel the hottest heat covers


def input_heatmap(grid: np.ndarray, size: int, stride: int, image_size: tuple[int, int]) -> np.ndarray:
    """A (rows, columns) grid map -> (height, width) input map, each cell's weight spread over its receptive field."""
    height, width = image_size
    heat = np.zeros((height, width), np.float64)
    share = grid.astype(np.float64) / (size * size)
    for r in range(grid.shape[0]):
        for c in range(grid.shape[1]):
            heat[r * stride : r * stride + size, c * stride : c * stride + size] += share[r, c]
    return heat


def overlay_png(image: np.ndarray, heat: np.ndarray, scale: int) -> bytes:
    """The input (H, W) in [0, 1] in gray with `heat` (H, W), scaled to its maximum, in colour; upscaled `scale`x."""
    peak = float(heat.max(initial=0.0))
    alpha = HEAT_OPACITY * (heat / peak if peak > 0 else np.zeros_like(heat))[..., None]  # (H, W, 1)
    gray = np.repeat(np.clip(np.nan_to_num(image), 0.0, 1.0)[..., None], 3, axis=2)  # (H, W, 3)
    rgb = (1.0 - alpha) * gray + alpha * HEAT_COLOUR
    pixels = np.round(rgb * 255.0).astype(np.uint8)
    picture = Image.fromarray(pixels, mode="RGB")
    if scale > 1:
        picture = picture.resize((picture.width * scale, picture.height * scale), Image.Resampling.NEAREST)
    buffer = io.BytesIO()
    picture.save(buffer, format="PNG")
    return buffer.getvalue()

"""Explanation maps as images: occlusion sensitivity, the routing map spread over the input, and a PNG overlay.

Occlusion (the default): each `OCCLUSION_TILE`-pixel tile holding ink is blacked out in a copy of the image, the
copies run as one batch, and a tile's weight is how much the class score falls without it (tiles without ink: 0).

Routing: the model's per-class map over the PrimaryCaps grid (c_ij * |u_hat_j|i| summed over capsule types);
`input_heatmap` gives each input pixel the mean weight of the grid cells whose receptive fields (the card's
`receptive_field`) contain it, so overlapping fields do not draw their overlap. docs/explanations.md has the details.
"""

from __future__ import annotations

import io
from typing import Literal, get_args

import numpy as np
from PIL import Image

from service.runtime.card import ModelCard

Method = Literal["occlusion", "routing"]
METHODS: tuple[str, ...] = get_args(Method)
DEFAULT_METHOD: Method = "occlusion"  # the most faithful by the deletion test (docs/explanations.md)

OCCLUSION_TILE = 4  # pixels on a side of an occluded tile (7x7 tiles on MNIST's 28x28)
HEAT_COLOUR = np.array([1.0, 0.25, 0.0])  # red-orange, drawn over the grayscale input
HEAT_OPACITY = 0.7  # how much of a pixel the hottest heat covers


def explain_methods(card: ModelCard | None) -> list[str]:
    """The methods a model can explain with: occlusion always, the routing map with an explanation output."""
    return [m for m in METHODS if m != "routing" or (card is not None and card.explanation is not None)]


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


def occlusion_tiles(image: np.ndarray, tile: int = OCCLUSION_TILE) -> np.ndarray:
    """The (row, column) indices of the `tile`-pixel tiles of an (H, W) image holding ink (non-zero pixels): (T, 2)."""
    height, width = image.shape
    rows, columns = -(-height // tile), -(-width // tile)
    padded = np.zeros((rows * tile, columns * tile), image.dtype)
    padded[:height, :width] = image
    inked = (padded.reshape(rows, tile, columns, tile) != 0).any(axis=(1, 3))  # (rows, columns)
    return np.argwhere(inked)


def occluded_copies(image: np.ndarray, tiles: np.ndarray, tile: int = OCCLUSION_TILE) -> np.ndarray:
    """An (H, W) image -> (T, H, W): copy t has tile `tiles[t]` set to 0 (black, the background)."""
    copies = np.repeat(image[None], len(tiles), axis=0)
    for t, (r, c) in enumerate(tiles):
        copies[t, r * tile : (r + 1) * tile, c * tile : (c + 1) * tile] = 0
    return copies


def occlusion_grid(base: float, occluded: np.ndarray, tiles: np.ndarray, grid_size: tuple[int, int]) -> np.ndarray:
    """The class score of the intact image and of each occluded copy (T,) -> (rows, columns) score drops (0 where
    no copy was run; negative where blacking a tile out raised the score)."""
    grid = np.zeros(grid_size, np.float64)
    grid[tiles[:, 0], tiles[:, 1]] = base - occluded.astype(np.float64)
    return grid


def occlusion_grid_size(image_size: tuple[int, int], tile: int = OCCLUSION_TILE) -> tuple[int, int]:
    return -(-image_size[0] // tile), -(-image_size[1] // tile)


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

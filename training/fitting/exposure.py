"""Outlier exposure (Hendrycks et al. 2019): the non-digits capsnet-train teaches a CapsNet to see no class in.

`capsnet-train --exposure N` draws a pool of N non-digit images once, before training: the fitting sets of
training/ood/nondigits.py in a random stream of their own (role `exposure`), and training digits turned by 90, 180
or 270 degrees (those that stay digits when turned left out). Every step adds half a batch of them, shifted as the
digits are, to the digits' batch and `--exposure-weight` times the architecture's "no class present" loss to their
loss (`training.fitting.train.ExposureTask`), so that the capsule lengths (EM: the activations) themselves say "not
a digit". The pool depends only on the seed and N: a resumed run draws the same one.
"""

from __future__ import annotations

import numpy as np

from training.data.generators import center_on_canvas
from training.data.mnist import MNISTSplit
from training.ood.nondigits import NONDIGIT_SETS, make_set, rotated_digits

TURNED_SETS = 3  # turned training digits make up as much of the pool as this many fitting sets
SHARE = 0.5  # non-digit images per digit in a step


def pool_sizes(n: int) -> dict[str, int]:
    """How many images of each fitting set, and of turned digits ("turned"), a pool of n holds: equal shares."""
    per_set = n // (len(NONDIGIT_SETS) + TURNED_SETS)
    sizes = dict.fromkeys(NONDIGIT_SETS, per_set)
    sizes["turned"] = n - per_set * len(NONDIGIT_SETS)
    return sizes


def exposure_pool(n: int, seed: int, digits: MNISTSplit) -> np.ndarray:
    """n non-digit images (n, 1, H, W) as uint8 on the digits' canvas: the fitting sets (drawn at 28x28 as an upload
    is, then centred on the canvas) and digits of `digits` turned by a random quarter turn each."""
    canvas = digits.images.shape[-1]
    if canvas < 28:
        raise ValueError(f"outlier exposure needs a canvas of at least 28 pixels, got {canvas}")
    sizes = pool_sizes(n)
    parts = []
    for name, count in sizes.items():
        if name == "turned" or count == 0:
            continue
        pictures = np.rint(make_set(name, count, seed, (1, 28, 28), role="exposure") * 255).astype(np.uint8)
        parts.append(center_on_canvas(pictures, canvas) if canvas != 28 else pictures)
    rng = np.random.default_rng([seed, len(NONDIGIT_SETS)])
    turns = rng.integers(1, 4, size=len(digits))
    turned = np.concatenate(
        [rotated_digits(digits.images[turns == k], digits.labels[turns == k], int(k)) for k in (1, 2, 3)]
    )
    parts.append(turned[rng.permutation(len(turned))[: sizes["turned"]]])
    pool = np.concatenate(parts)
    if len(pool) != n:
        raise ValueError(f"--exposure {n} asks for more turned digits than {len(digits)} training digits give")
    return pool

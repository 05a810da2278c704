"""Outlier exposure (Hendrycks et al. 2019): capsnet-train teaches a CapsNet that non-digits have no class present.

`capsnet-train --exposure N` draws a pool of N non-digit images once, before training: the fitting sets of
training/ood/nondigits.py in a random stream of their own (role `exposure`), and training digits turned by 90, 180
or 270 degrees (those that stay digits when turned left out). Every step adds half a batch of them, shifted as the
digits are, to the digits' batch and `--exposure-weight` times the architecture's "no class present" loss to their
loss, so that the capsule lengths (EM: the activations) themselves say "not a digit". The pool depends only on the
seed and N: a resumed run draws the same one.
"""

from __future__ import annotations

import logging
from typing import Any

import numpy as np
import torch
from torch import nn

from training.data.generators import center_on_canvas
from training.data.mnist import MNISTSplit
from training.fitting.architectures import Architecture
from training.fitting.config import TrainConfig
from training.fitting.loop import Autocast, DistInfo, Step
from training.fitting.train import ClassificationData, ClassificationTask, random_shift, to_float_t
from training.ood.nondigits import NONDIGIT_SETS, make_set, rotated_digits

log = logging.getLogger(__name__)

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


def take(out: Any, n: int, start: int = 0) -> Any:
    """Rows start..start+n of every tensor of a model's output tuple (CapsNetOutput, EMCapsNetOutput)."""
    return type(out)(*(t[start : start + n] for t in out))


class ExposureTask(ClassificationTask):
    """ClassificationTask whose every step also trains half a batch of non-digits to have no class present."""

    def __init__(
        self, cfg: TrainConfig, arch: Architecture, data: ClassificationData, device: torch.device, info: DistInfo
    ) -> None:
        if arch.absent is None:
            raise ValueError(
                f"--exposure needs an architecture whose scores can say that no class is present (dynamic or em), "
                f"not {arch.name!r}"
            )
        if cfg.exposure < 1:
            raise ValueError(f"--exposure must be at least 1 non-digit image, got {cfg.exposure}")
        super().__init__(cfg, arch, data, device, info)
        if info.is_main:
            log.info("drawing %s non-digit images for outlier exposure", f"{cfg.exposure:,}")
        self.pool = torch.from_numpy(exposure_pool(cfg.exposure, cfg.seed, data.train))
        self.draws = torch.Generator()

    def batches(self, epoch: int) -> list[torch.Tensor]:
        self.draws.manual_seed(self.cfg.seed * 100_019 + epoch * 103 + self.info.rank)
        return super().batches(epoch)

    def step(self, model: nn.Module, batch: torch.Tensor, progress: float, autocast: Autocast) -> Step:
        """One forward over the digits and the non-digits together (DDP sees one forward per step); the digits'
        loss from their rows, the non-digits' "no class present" loss from theirs."""
        n = len(batch)
        picks = torch.randint(len(self.pool), (max(1, round(n * SHARE)),), generator=self.draws)
        digits = to_float_t(self.train_images[batch])
        others = to_float_t(self.pool[picks])
        images = random_shift(torch.cat([digits, others]), self.cfg.max_shift, self.shifts).to(self.device)
        labels = self.train_labels[batch].to(self.device)
        decoder_labels = torch.cat([labels, torch.zeros(len(picks), dtype=labels.dtype, device=self.device)])
        with autocast():
            out = self.arch.forward(model, images, decoder_labels)  # the non-digits' reconstructions go unused
        mine = take(out, n)
        loss = self.arch.loss(mine, images[:n], labels, 1.0 if self.warm_start else progress)
        absent = self.arch.absent(take(out, len(picks), n))  # type: ignore[misc]  # checked in __init__
        correct = int((self.arch.scores(mine).argmax(dim=1) == labels).sum())
        parts = {**{k: v.detach() for k, v in loss.parts.items()}, "absent_loss": absent.detach()}
        return Step(loss.total + self.cfg.exposure_weight * absent, parts, n, correct)

    def state_dict(self) -> dict[str, Any]:
        return {**super().state_dict(), "draws": self.draws.get_state()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        super().load_state_dict(state)
        if "draws" in state:
            self.draws.set_state(state["draws"])

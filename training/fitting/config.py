"""The settings of one training run, as the CLI exposes them and checkpoints record them (`train_config`)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True)
class TrainConfig:
    arch: str = "dynamic"
    preset: str = "paper"
    routing: str | None = None  # None: the architecture's default
    routing_iterations: int | None = None
    epochs: int = 30
    batch_size: int = 128
    lr: float = 1e-3
    lr_decay: float = 0.96  # exponential decay per epoch
    max_shift: int = 2  # the paper's only augmentation: shifts of up to 2 px
    canvas: int = 28  # digits centred on canvas x canvas; 40 with max_shift 6 is shifted MNIST on 40x40 (§5.2)
    seed: int = 0
    device: str = "auto"
    amp: bool = False  # bfloat16 autocast of the convolutions: CUDA, or a CPU with native bfloat16
    ema: float = 0.0  # decay per step of an exponential moving average of the weights, evaluated and saved; 0: off
    val_split: int = 0  # hold out this many training images (seeded) for validation; 0: train on all
    train_subset: int | None = None
    epoch_images: int | None = None  # an epoch is this many images of one seeded stream of shuffles; None: the set
    test_subset: int | None = None
    eval_batch_size: int = 500
    eval_every: int = 1  # evaluate after every N-th epoch, the last, and the last before a time-budget stop
    exposure: int = 0  # non-digit images a step may draw from (outlier exposure, training/fitting/exposure.py); 0: off
    exposure_weight: float = 0.5  # the weight of their "no class present" loss beside the digits' loss
    dry_run: bool = False
    model_overrides: dict[str, Any] = field(default_factory=dict)

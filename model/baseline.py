"""The baseline CNN of Sabour, Frosst & Hinton 2017 (§5): three 5x5 convolutions, two FC layers, dropout, softmax.

"The baseline is a standard CNN with three convolutional layers of 256, 256, 128 channels. Each has 5x5
kernels and stride of 1. The last convolutional layers are followed by two fully connected layers of
size 328, 192. The last fully connected layer is connected with dropout to a 10 class softmax layer with
cross entropy loss." The paper gives its size as 35.4M parameters; 'same' padding and no pooling on
28x28 give exactly that (35,445,522: 28·28·128 = 100,352 inputs to the first FC layer), so the defaults
pool nothing. On a 40x40 canvas the same network has 69,704,466 parameters.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any, NamedTuple

import torch
import torch.nn.functional as F
from torch import nn


@dataclass(frozen=True)
class BaselineConfig:
    """The paper's baseline; `pooling[i]` is the max-pool window (and stride) after conv i, 1 for none."""

    in_channels: int = 1
    image_size: int = 28  # 28 (MNIST) or 40 (the affine experiment's canvas); any size works
    conv_channels: tuple[int, ...] = (256, 256, 128)
    conv_kernel: int = 5
    pooling: tuple[int, ...] = (1, 1, 1)
    fc_sizes: tuple[int, ...] = (328, 192)
    dropout: float = 0.5  # before the softmax layer
    num_classes: int = 10

    def __post_init__(self) -> None:
        if len(self.pooling) != len(self.conv_channels):
            raise ValueError(f"pooling needs one entry per conv layer ({len(self.conv_channels)}), got {self.pooling}")
        if self.conv_kernel % 2 != 1:
            raise ValueError(f"conv_kernel must be odd ('same' padding), got {self.conv_kernel}")
        if not 0.0 <= self.dropout < 1.0:
            raise ValueError(f"dropout must be in [0, 1), got {self.dropout}")
        if self.feature_size < 1:
            raise ValueError(f"image_size {self.image_size} is too small for pooling {self.pooling}")

    @property
    def feature_size(self) -> int:
        """Side of the last conv layer's feature map (28 for 28x28 without pooling)."""
        size = self.image_size
        for p in self.pooling:
            size //= p
        return size

    @property
    def flat_features(self) -> int:
        return self.conv_channels[-1] * self.feature_size**2

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        for key in ("conv_channels", "pooling", "fc_sizes"):
            d[key] = list(d[key])
        return d

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> BaselineConfig:
        d = dict(d)
        for key in ("conv_channels", "pooling", "fc_sizes"):
            if key in d:
                d[key] = tuple(d[key])
        return cls(**d)

    @classmethod
    def tiny(cls, **overrides: Any) -> BaselineConfig:
        """A small configuration for fast tests (same topology, far fewer channels and units)."""
        base: dict[str, Any] = dict(conv_channels=(8, 8, 4), fc_sizes=(16, 8))
        base.update(overrides)
        return cls(**base)


BASELINE_PRESETS: dict[str, Any] = {"paper": BaselineConfig, "tiny": BaselineConfig.tiny}


class BaselineOutput(NamedTuple):
    logits: torch.Tensor  # (B, num_classes): pre-softmax scores

    @property
    def probabilities(self) -> torch.Tensor:
        return F.softmax(self.logits, dim=1)


class BaselineCNN(nn.Module):
    """conv5x5-256 -> conv5x5-256 -> conv5x5-128 (ReLU, optional max-pool) -> FC 328 -> FC 192 -> dropout -> FC 10."""

    def __init__(self, cfg: BaselineConfig | None = None) -> None:
        super().__init__()
        self.cfg = cfg or BaselineConfig()
        c = self.cfg
        layers: list[nn.Module] = []
        width = c.in_channels
        for channels, pool in zip(c.conv_channels, c.pooling, strict=True):
            layers += [nn.Conv2d(width, channels, c.conv_kernel, padding=c.conv_kernel // 2), nn.ReLU(inplace=True)]
            if pool > 1:
                layers.append(nn.MaxPool2d(pool))
            width = channels
        self.features = nn.Sequential(*layers)
        fc: list[nn.Module] = []
        width = c.flat_features
        for size in c.fc_sizes:
            fc += [nn.Linear(width, size), nn.ReLU(inplace=True)]
            width = size
        self.fc = nn.Sequential(*fc)
        self.dropout = nn.Dropout(c.dropout)
        self.classifier = nn.Linear(width, c.num_classes)

    def forward(self, x: torch.Tensor) -> BaselineOutput:
        h = self.features(x)  # (B, 128, S, S) with S = feature_size
        h = self.fc(h.flatten(start_dim=1))  # (B, 128·S·S) -> (B, 192)
        return BaselineOutput(self.classifier(self.dropout(h)))  # (B, 10)

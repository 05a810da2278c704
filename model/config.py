"""Frozen configuration dataclasses for the capsule networks."""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any, Literal

RoutingVariant = Literal["sabour", "normalized"]
ROUTING_VARIANTS: tuple[str, ...] = ("sabour", "normalized")


@dataclass(frozen=True)
class CapsNetConfig:
    """CapsNet of Sabour, Frosst & Hinton 2017 (§4, Figure 1 and Figure 2).

    The defaults are the paper's MNIST configuration (8,215,568 parameters).
    """

    in_channels: int = 1
    image_size: int = 28
    conv1_channels: int = 256
    conv1_kernel: int = 9
    primary_types: int = 32  # capsule channels in PrimaryCaps
    primary_dim: int = 8
    primary_kernel: int = 9
    primary_stride: int = 2
    num_classes: int = 10
    digit_dim: int = 16
    routing: RoutingVariant = "sabour"
    routing_iterations: int = 3
    decoder_hidden: tuple[int, ...] = (512, 1024)
    use_decoder: bool = True

    def __post_init__(self) -> None:
        if self.routing not in ROUTING_VARIANTS:
            raise ValueError(f"routing must be one of {ROUTING_VARIANTS}, got {self.routing!r}")
        if self.routing_iterations < 1:
            raise ValueError(f"routing_iterations must be >= 1, got {self.routing_iterations}")
        if self.primary_grid < 1:
            raise ValueError(
                f"image_size {self.image_size} is too small for kernels "
                f"{self.conv1_kernel}/{self.primary_kernel} and stride {self.primary_stride}"
            )

    @property
    def conv1_size(self) -> int:
        return self.image_size - self.conv1_kernel + 1

    @property
    def primary_grid(self) -> int:
        """Side of the PrimaryCaps grid (6 for the paper's 28x28 input)."""
        return (self.conv1_size - self.primary_kernel) // self.primary_stride + 1

    @property
    def num_primary(self) -> int:
        """Number of primary capsules (1152 = 6x6x32 in the paper)."""
        return self.primary_grid**2 * self.primary_types

    @property
    def image_pixels(self) -> int:
        return self.in_channels * self.image_size**2

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["decoder_hidden"] = list(self.decoder_hidden)
        return d

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> CapsNetConfig:
        d = dict(d)
        if "decoder_hidden" in d:
            d["decoder_hidden"] = tuple(d["decoder_hidden"])
        return cls(**d)

    @classmethod
    def tiny(cls, **overrides: Any) -> CapsNetConfig:
        """A small configuration for fast tests (same topology, far fewer channels)."""
        base: dict[str, Any] = dict(
            conv1_channels=16,
            primary_types=4,
            primary_dim=4,
            digit_dim=8,
            decoder_hidden=(32, 64),
        )
        base.update(overrides)
        return cls(**base)


PRESETS: dict[str, Any] = {"paper": CapsNetConfig, "tiny": CapsNetConfig.tiny}


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
    def primary_receptive_field(self) -> tuple[int, int]:
        """(size, stride) in input pixels of a PrimaryCaps grid cell: cell (r, c) sees rows r*stride to
        r*stride + size - 1 and the same columns (17 and 2 in the paper: conv1 9x9 stride 1, then 9x9 stride 2)."""
        return self.conv1_kernel + self.primary_kernel - 1, self.primary_stride

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


@dataclass(frozen=True)
class EMCapsNetConfig:
    """Matrix capsules with EM routing, Hinton, Sabour & Frosst 2018 (§3, Figure 1), for 28x28 inputs.

    The defaults are the paper's A = B = C = D = 32 network. Conv1 is padded by 2 so the grids are the
    paper's 14 -> 6 -> 4 (it pads nothing on 32x32 smallNORB; 28x28 MNIST needs the padding).
    """

    in_channels: int = 1
    image_size: int = 28
    conv1_channels: int = 32  # A
    conv1_kernel: int = 5
    conv1_stride: int = 2
    conv1_padding: int = 2
    primary_types: int = 32  # B: capsule types in PrimaryCaps (1x1 convolution)
    caps1_types: int = 32  # C: ConvCaps1
    caps1_kernel: int = 3
    caps1_stride: int = 2
    caps2_types: int = 32  # D: ConvCaps2
    caps2_kernel: int = 3
    caps2_stride: int = 1
    num_classes: int = 10
    routing_iterations: int = 2  # the paper's 3 learns far more slowly (docs/em-routing.md, "Training")
    coordinate_addition: bool = True
    final_inverse_temperature: float = 3.0  # λ of the last routing iteration (see docs/em-routing.md)
    beta_u_init: float = 2.0  # ≈ -mean log σ at initialisation, so routed capsules start about half active
    variance_floor: float = 1e-4  # added to every σ² so log σ and 1/σ² stay finite
    max_logit: float = 20.0  # bound on the argument of every routed activation's logistic

    def __post_init__(self) -> None:
        if self.routing_iterations < 1:
            raise ValueError(f"routing_iterations must be >= 1, got {self.routing_iterations}")
        if self.variance_floor <= 0 or self.max_logit <= 0 or self.final_inverse_temperature <= 0:
            raise ValueError("variance_floor, max_logit and final_inverse_temperature must be > 0")
        if self.caps2_grid < 1:
            raise ValueError(
                f"image_size {self.image_size} is too small for the Conv1, ConvCaps1 and ConvCaps2 "
                "kernels and strides (each grid must keep at least one position)"
            )

    @property
    def primary_grid(self) -> int:
        """Side of the Conv1 and PrimaryCaps grids (14 for 28x28)."""
        return (self.image_size + 2 * self.conv1_padding - self.conv1_kernel) // self.conv1_stride + 1

    @property
    def caps1_grid(self) -> int:
        """Side of the ConvCaps1 grid (6 for 28x28)."""
        return (self.primary_grid - self.caps1_kernel) // self.caps1_stride + 1

    @property
    def caps2_grid(self) -> int:
        """Side of the ConvCaps2 grid (4 for 28x28)."""
        return (self.caps1_grid - self.caps2_kernel) // self.caps2_stride + 1

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> EMCapsNetConfig:
        return cls(**d)

    @classmethod
    def tiny(cls, **overrides: Any) -> EMCapsNetConfig:
        """A small configuration for fast tests (same topology and grids, far fewer capsule types)."""
        base: dict[str, Any] = dict(conv1_channels=8, primary_types=4, caps1_types=4, caps2_types=4)
        base.update(overrides)
        return cls(**base)

    @classmethod
    def small(cls, **overrides: Any) -> EMCapsNetConfig:
        """The paper's smaller network, A=64, B=8, C=D=16 (§5: 68K parameters), the one public
        implementations train on MNIST; about a fifth of the paper preset's routing work per image."""
        base: dict[str, Any] = dict(conv1_channels=64, primary_types=8, caps1_types=16, caps2_types=16)
        base.update(overrides)
        return cls(**base)


EM_PRESETS: dict[str, Any] = {"paper": EMCapsNetConfig, "small": EMCapsNetConfig.small, "tiny": EMCapsNetConfig.tiny}

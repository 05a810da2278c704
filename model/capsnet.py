"""CapsNet with dynamic routing (Sabour, Frosst & Hinton 2017), written as static tensor code."""

from __future__ import annotations

import contextlib
from typing import NamedTuple

import torch
import torch.nn.functional as F
from torch import nn

from model.config import CapsNetConfig
from model.fused import route_sabour_fused, strided_conv2d

EPS = 1e-8


def float32_region(t: torch.Tensor) -> contextlib.AbstractContextManager[object]:
    """Turn autocast off for the capsule math (squash, routing, lengths, decoder) when it is on.

    Under bfloat16 mixed precision only the two convolutions, nearly all of the FLOPs, run in bfloat16;
    routing and the capsule lengths that the margin loss thresholds at 0.9 / 0.1 stay float32. Without
    autocast (inference, export) this is a no-op and adds nothing to the traced graph.
    """
    if torch.is_autocast_enabled(t.device.type):
        return torch.autocast(device_type=t.device.type, enabled=False)
    return contextlib.nullcontext()


def squash(s: torch.Tensor, dim: int = -1) -> torch.Tensor:
    """Non-linear squashing, Sabour et al. 2017 eq. 1: v = |s|^2/(1+|s|^2) * s/|s|."""
    sq = (s * s).sum(dim=dim, keepdim=True)
    return s * (sq / (1.0 + sq)) / torch.sqrt(sq + EPS)


def capsule_length(v: torch.Tensor, dim: int = -1) -> torch.Tensor:
    """Length of each capsule vector; EPS keeps the gradient finite at zero."""
    return torch.sqrt((v * v).sum(dim=dim) + EPS)


# The two contractions of routing as batched matrix products over (sample, class): PyTorch runs them as
# bmm, forward and backward, instead of broadcast multiply-and-sum over (B, N_out, N_in, D) tensors, which
# took half of a training step; the class-major layout makes every matrix contiguous, so nothing is copied.


def weighted_sum(c: torch.Tensor, u_hat: torch.Tensor) -> torch.Tensor:
    """Σ_i c_ij û_j|i: c (B, N_out, N_in), û (B, N_out, N_in, D) -> (B, N_out, D)."""
    return torch.matmul(c.unsqueeze(2), u_hat).squeeze(2)


def agreement(u_hat: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    """û_j|i · v_j: û (B, N_out, N_in, D), v (B, N_out, D) -> (B, N_out, N_in)."""
    return torch.matmul(u_hat, v.unsqueeze(-1)).squeeze(-1)


def route_sabour(u_hat: torch.Tensor, iterations: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Routing by agreement, Sabour et al. 2017 Procedure 1.

    Args:
        u_hat: prediction vectors û_j|i, class-major: shape (B, N_out, N_in, D), so that each class's
            predictions are contiguous and both weighted sums below are batched matrix products.
        iterations: number of routing iterations r (unrolled, no data-dependent branching).

    Returns:
        v: output capsules (B, N_out, D) and the final coupling coefficients c (B, N_in, N_out).
    """
    b = torch.zeros_like(u_hat[..., 0])  # (B, N_out, N_in): logits b_ij, one set per sample
    c = F.softmax(b, dim=1)  # eq. 3: c_ij = softmax_j(b_ij), over the classes
    v = squash(weighted_sum(c, u_hat))  # eq. 2 and 1: s_j = Σ_i c_ij û_j|i -> (B, N_out, D)
    for _ in range(iterations - 1):
        b = b + agreement(u_hat, v)  # Procedure 1 line 7: b_ij += û_j|i · v_j
        c = F.softmax(b, dim=1)
        v = squash(weighted_sum(c, u_hat))
    return v, c.transpose(1, 2)


def route_normalized(u_hat: torch.Tensor, iterations: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Routing as clustering (the K-means view of routing by agreement).

    v_j starts as the mean of its predictions; each iteration sets c_ij to the softmax over
    classes of the current agreement <û_j|i, v_j/|v_j|> (not accumulated) and v_j = Σ_i c_ij û_j|i.
    Squash is applied to the final output only. `u_hat` is class-major, (B, N_out, N_in, D), as for
    `route_sabour`; c is returned as (B, N_in, N_out).
    """
    v = u_hat.mean(dim=2)  # (B, N_out, D)
    c = torch.full_like(u_hat[..., 0], 1.0 / u_hat.shape[1])  # (B, N_out, N_in)
    for _ in range(iterations):
        direction = v / torch.sqrt((v * v).sum(dim=-1, keepdim=True) + EPS)  # (B, N_out, D)
        c = F.softmax(agreement(u_hat, direction), dim=1)  # (B, N_out, N_in)
        v = weighted_sum(c, u_hat)  # (B, N_out, D)
    return squash(v), c.transpose(1, 2)


class PrimaryCaps(nn.Module):
    """Convolutional capsules: one conv whose channels are grouped into `dim`-D capsules (§4)."""

    def __init__(self, cfg: CapsNetConfig) -> None:
        super().__init__()
        self.cfg = cfg
        self.conv = nn.Conv2d(
            cfg.conv1_channels,
            cfg.primary_types * cfg.primary_dim,
            kernel_size=cfg.primary_kernel,
            stride=cfg.primary_stride,
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        cfg = self.cfg
        u = self._conv(x)  # (B, types*dim, G, G)
        if u.dtype != torch.float32:  # bfloat16 from the autocast convolution: capsules are float32
            u = u.float()
        g = cfg.primary_grid
        u = u.reshape(-1, cfg.primary_types, cfg.primary_dim, g, g)  # (B, types, dim, G, G)
        u = u.permute(0, 1, 3, 4, 2).reshape(-1, cfg.num_primary, cfg.primary_dim)  # (B, N_in, dim)
        return squash(u)

    def _conv(self, x: torch.Tensor) -> torch.Tensor:
        """The convolution; training under CPU bfloat16 autocast takes oneDNN's faster route to its weight gradient."""
        if self.training and x.dtype == torch.bfloat16 and x.device.type == "cpu" and torch.is_grad_enabled():
            conv = self.conv
            bias = conv.bias.to(x.dtype) if conv.bias is not None else None
            return strided_conv2d(x, conv.weight.to(x.dtype), bias, self.cfg.primary_stride)
        return self.conv(x)


class DigitCaps(nn.Module):
    """Fully connected capsule layer: û_j|i = W_ij u_i (eq. 2), one W_ij per (i, j), then routing."""

    def __init__(self, cfg: CapsNetConfig) -> None:
        super().__init__()
        self.cfg = cfg
        # (N_in, N_out, D_out, D_in): a separate 8x16 matrix for every (primary capsule, class) pair
        self.weight = nn.Parameter(0.01 * torch.randn(cfg.num_primary, cfg.num_classes, cfg.digit_dim, cfg.primary_dim))

    def votes(self, u: torch.Tensor) -> torch.Tensor:
        """Primary capsules (B, N_in, D_in) -> prediction vectors û_j|i, class-major (B, N_out, N_in, D_out)."""
        u_hat = torch.einsum("ijdk,bik->bijd", self.weight, u)  # (B, N_in, N_out, D_out)
        # Class-major and contiguous for routing's batched products; measured faster in PyTorch (training, and
        # inference) and in ONNX Runtime than an einsum straight to this layout or a broadcast matmul.
        return u_hat.transpose(1, 2).contiguous()  # (B, N_out, N_in, D_out)

    def route(self, u_hat: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """û (B, N_out, N_in, D_out) -> v (B, N_out, D_out) and the final couplings c (B, N_in, N_out)."""
        if self.cfg.routing == "sabour":
            # Training only: the same routing with a faster backward. Eval mode (evaluation, and export, which
            # traces with gradients on) keeps the plain code, so the exported graphs do not change.
            if self.training and u_hat.requires_grad and torch.is_grad_enabled():
                return route_sabour_fused(u_hat, self.cfg.routing_iterations, squash)
            return route_sabour(u_hat, self.cfg.routing_iterations)
        return route_normalized(u_hat, self.cfg.routing_iterations)

    def forward(self, u: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return self.route(self.votes(u))


def routing_map(c: torch.Tensor, u_hat: torch.Tensor, cfg: CapsNetConfig) -> torch.Tensor:
    """How strongly each PrimaryCaps grid cell voted for each class: (B, N_out, G, G).

    The final coupling coefficient c_ij of every primary capsule i to class j, weighted by the length of
    its prediction vector |û_j|i| (a capsule that routes all its coupling to j but predicts nothing
    contributes nothing), summed over the capsule types at each grid position.

    Args:
        c: final coupling coefficients (B, N_in, N_out), as routing returns them.
        u_hat: prediction vectors û_j|i, class-major (B, N_out, N_in, D).
    """
    g = cfg.primary_grid
    strength = torch.sqrt((u_hat * u_hat).sum(dim=-1))  # (B, N_out, N_in): |û_j|i|
    weighted = c.transpose(1, 2) * strength  # (B, N_out, N_in)
    # N_in is ordered (type, row, column), as PrimaryCaps flattens it
    return weighted.reshape(-1, cfg.num_classes, cfg.primary_types, g, g).sum(dim=2)  # (B, N_out, G, G)


class Decoder(nn.Module):
    """Reconstruction network: masked poses -> FC 512 -> FC 1024 -> FC 784 sigmoid (§4.1, Fig. 2)."""

    def __init__(self, cfg: CapsNetConfig) -> None:
        super().__init__()
        layers: list[nn.Module] = []
        width = cfg.num_classes * cfg.digit_dim
        for hidden in cfg.decoder_hidden:
            layers += [nn.Linear(width, hidden), nn.ReLU(inplace=True)]
            width = hidden
        layers += [nn.Linear(width, cfg.image_pixels), nn.Sigmoid()]
        self.net = nn.Sequential(*layers)

    def forward(self, poses: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        """poses (B, N_out, D) and mask (B, N_out) -> reconstruction (B, pixels)."""
        masked = poses * mask.unsqueeze(-1)  # (B, N_out, D)
        return self.net(masked.flatten(start_dim=1))


class CapsNetOutput(NamedTuple):
    lengths: torch.Tensor  # (B, num_classes): capsule lengths, the per-class presence probability
    poses: torch.Tensor  # (B, num_classes, digit_dim): the DigitCaps instantiation vectors v_j
    reconstruction: torch.Tensor  # (B, pixels); zeros when the config has no decoder


class CapsNet(nn.Module):
    """Conv1 -> PrimaryCaps -> DigitCaps (routing) -> Decoder, Sabour et al. 2017 Figure 1."""

    def __init__(self, cfg: CapsNetConfig | None = None) -> None:
        super().__init__()
        self.cfg = cfg or CapsNetConfig()
        c = self.cfg
        self.conv1 = nn.Conv2d(c.in_channels, c.conv1_channels, kernel_size=c.conv1_kernel)
        self.primary = PrimaryCaps(c)
        self.digit = DigitCaps(c)
        self.decoder = Decoder(c) if c.use_decoder else None

    def encode(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Images (B, C, H, W) -> poses (B, N_out, D) and coupling coefficients (B, N_in, N_out)."""
        poses, c, _ = self._encode_with_votes(x)
        return poses, c

    def _encode_with_votes(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Images -> poses (B, N_out, D), couplings (B, N_in, N_out) and prediction vectors (B, N_out, N_in, D)."""
        h = F.relu(self.conv1(x))  # (B, 256, 20, 20)
        u = self.primary(h)  # (B, 1152, 8)
        with float32_region(u):
            u_hat = self.digit.votes(u)  # (B, 10, 1152, 16)
            poses, c = self.digit.route(u_hat)  # (B, 10, 16), (B, 1152, 10)
        return poses, c, u_hat

    def class_mask(self, classes: torch.Tensor) -> torch.Tensor:
        """Class indices (B,) -> one-hot mask (B, N_out)."""
        return F.one_hot(classes, self.cfg.num_classes).to(torch.float32)

    def decode(self, poses: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        """Reconstruct from caller-supplied poses (B, N_out, D) and a mask (B, N_out)."""
        if self.decoder is None:
            raise RuntimeError("this CapsNet configuration has no decoder")
        return self.decoder(poses, mask.to(poses.dtype))

    def decode_class(self, poses: torch.Tensor, classes: torch.Tensor) -> torch.Tensor:
        """Reconstruct from the capsule of the chosen class (B,)."""
        return self.decode(poses, self.class_mask(classes))

    def forward(self, x: torch.Tensor, labels: torch.Tensor | None = None) -> CapsNetOutput:
        """Mask with `labels` when given (training), else with the longest capsule (inference)."""
        poses, _ = self.encode(x)
        return self._heads(x, poses, labels)

    def explain(self, x: torch.Tensor) -> tuple[CapsNetOutput, torch.Tensor]:
        """Inference outputs and the routing map (B, N_out, G, G) of `routing_map`, from one pass."""
        poses, c, u_hat = self._encode_with_votes(x)
        with float32_region(poses):
            return self._heads(x, poses, None), routing_map(c, u_hat, self.cfg)

    def _heads(self, x: torch.Tensor, poses: torch.Tensor, labels: torch.Tensor | None) -> CapsNetOutput:
        """Capsule lengths and the reconstruction from the poses (B, N_out, D)."""
        with float32_region(poses):
            lengths = capsule_length(poses)  # (B, N_out)
            if self.decoder is None:
                return CapsNetOutput(lengths, poses, poses.new_zeros(x.shape[0], self.cfg.image_pixels))
            classes = labels if labels is not None else lengths.argmax(dim=1)
            return CapsNetOutput(lengths, poses, self.decode_class(poses, classes))


def count_parameters(module: nn.Module) -> int:
    return sum(p.numel() for p in module.parameters())

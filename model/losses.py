"""Losses for capsule networks."""

from __future__ import annotations

import torch
import torch.nn.functional as F


def margin_loss(
    lengths: torch.Tensor,
    labels: torch.Tensor,
    m_plus: float = 0.9,
    m_minus: float = 0.1,
    lam: float = 0.5,
) -> torch.Tensor:
    """Margin loss, Sabour et al. 2017 eq. 4, summed over classes and averaged over the batch.

    L_k = T_k max(0, m+ - |v_k|)^2 + λ (1 - T_k) max(0, |v_k| - m-)^2
    """
    t = F.one_hot(labels, lengths.shape[1]).to(lengths.dtype)  # (B, K)
    present = t * F.relu(m_plus - lengths) ** 2
    absent = lam * (1.0 - t) * F.relu(lengths - m_minus) ** 2
    return (present + absent).sum(dim=1).mean()


def reconstruction_loss(reconstruction: torch.Tensor, images: torch.Tensor) -> torch.Tensor:
    """Sum of squared pixel errors per image, averaged over the batch (§4.1)."""
    target = images.flatten(start_dim=1).to(reconstruction.dtype)
    return ((reconstruction - target) ** 2).sum(dim=1).mean()

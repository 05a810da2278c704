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
    """Margin loss, Sabour et al. 2017 eq. 4, for one class per image (labels (B,))."""
    return margin_loss_multi(lengths, F.one_hot(labels, lengths.shape[1]), m_plus, m_minus, lam)


def margin_loss_multi(
    lengths: torch.Tensor,
    targets: torch.Tensor,
    m_plus: float = 0.9,
    m_minus: float = 0.1,
    lam: float = 0.5,
) -> torch.Tensor:
    """Margin loss, Sabour et al. 2017 eq. 4, with any number of present classes (multi-hot targets (B, K)).

    L_k = T_k max(0, m+ - |v_k|)^2 + λ (1 - T_k) max(0, |v_k| - m-)^2, summed over classes, averaged over the batch.
    """
    t = targets.to(lengths.dtype)  # (B, K)
    present = t * F.relu(m_plus - lengths) ** 2
    absent = lam * (1.0 - t) * F.relu(lengths - m_minus) ** 2
    return (present + absent).sum(dim=1).mean()


def reconstruction_loss(reconstruction: torch.Tensor, images: torch.Tensor) -> torch.Tensor:
    """Sum of squared pixel errors per image, averaged over the batch (§4.1)."""
    target = images.flatten(start_dim=1).to(reconstruction.dtype)
    return ((reconstruction - target) ** 2).sum(dim=1).mean()


def spread_loss(activations: torch.Tensor, labels: torch.Tensor, margin: float) -> torch.Tensor:
    """Spread loss, Hinton et al. 2018 eq. 3, summed over the wrong classes and averaged over the batch.

    L = Σ_{i≠t} max(0, m - (a_t - a_i))^2
    """
    a_t = activations.gather(1, labels.view(-1, 1))  # (B, 1)
    wrong = 1.0 - F.one_hot(labels, activations.shape[1]).to(activations.dtype)  # (B, K)
    return (wrong * F.relu(margin - (a_t - activations)) ** 2).sum(dim=1).mean()


def spread_margin(progress: float, start: float = 0.2, end: float = 0.9, ramp: float = 0.5) -> float:
    """Margin of the spread loss at `progress` in [0, 1] of training (Hinton et al. 2018 §4: 0.2 rising to 0.9).

    Linear from `start` to `end` over the first `ramp` of training, then held at `end`.
    """
    return start + (end - start) * min(max(progress / ramp, 0.0), 1.0)

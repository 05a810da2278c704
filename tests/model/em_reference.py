"""The straightforward EM routing the fast one in model/em.py replaced, kept as the tests' reference.

Hinton et al. 2018 Procedure 1 with a fresh (V - μ)² every iteration, and the E-step's normalisation over
overlapping receptive fields as an explicit sum of exp() into every child. Only for small float64 inputs.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from model.config import EMCapsNetConfig
from model.em_routing import EPS, RoutingGeometry, inverse_temperatures


def normalise(logits: torch.Tensor, geometry: RoutingGeometry, child_positions: int) -> torch.Tensor:
    """R_ij = exp(logit_ij) / Σ over every (position, entry, type) that holds child i; logits (B, P, C, N)."""
    b, p, _, n = logits.shape
    kk = geometry.kernel_entries
    e = logits.exp().sum(dim=2).reshape(b, p * kk, n // kk)  # (B, P*KK, B_in): summed over parent types
    z = torch.zeros(b, child_positions, n // kk, dtype=logits.dtype).index_add_(1, geometry.window_index, e)
    z = z.index_select(1, geometry.window_index).reshape(b, p, 1, n)  # each entry's child's total
    return logits.exp() / z


def em_routing(
    votes: torch.Tensor,
    activations: torch.Tensor,
    beta_u: torch.Tensor,
    beta_a: torch.Tensor,
    geometry: RoutingGeometry,
    cfg: EMCapsNetConfig,
    child_positions: int,
) -> tuple[torch.Tensor, torch.Tensor]:
    """votes (B, P, C, N, H), activations (B, P, N) -> a_j (B, P, C) and μ_j (B, P, C, H)."""
    _, p, c, n, _ = votes.shape
    a_in = activations.unsqueeze(2)  # (B, P, 1, N)
    kk = geometry.kernel_entries
    r = geometry.init_assignment.reshape(1, p, 1, kk, 1).expand(1, p, c, kk, n // kk).reshape(1, p, c, n)
    lambdas = inverse_temperatures(cfg.routing_iterations, cfg.final_inverse_temperature)
    for t, lam in enumerate(lambdas):
        rw = r * a_in
        mass = rw.sum(dim=3, keepdim=True)  # (B, P, C, 1)
        w = (rw / (mass + EPS)).unsqueeze(-1)  # (B, P, C, N, 1)
        mu = (w * votes).sum(dim=3, keepdim=True)  # (B, P, C, 1, H)
        sq = (votes - mu) ** 2
        var = (w * sq).sum(dim=3, keepdim=True) + cfg.variance_floor  # (B, P, C, 1, H)
        cost = (mass / geometry.mass_per_parent) * (beta_u.view(1, 1, -1, 1) + 0.5 * var.log().mean(dim=-1))
        logit = (lam * (beta_a.view(1, 1, -1, 1) - cost)).clamp(-cfg.max_logit, cfg.max_logit)  # (B, P, C, 1)
        if t == len(lambdas) - 1:
            return torch.sigmoid(logit).squeeze(-1), mu.squeeze(3)
        log_p = -(sq / (2 * var)).sum(dim=-1) - 0.5 * var.log().sum(dim=-1)  # (B, P, C, N)
        r = normalise(F.logsigmoid(logit) + log_p, geometry, child_positions)
    raise AssertionError("unreachable: routing_iterations >= 1")

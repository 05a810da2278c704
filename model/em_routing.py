"""EM routing's mathematics (Procedure 1 of Hinton, Sabour & Frosst 2018) as plain tensor code.

The receptive-field geometry, the votes V = M W formed by one matmul, the M-step and E-step as matrix
products against V and V ⊙ V (`VoteProducts`), and `route`, the unrolled iterations. `model/em.py` builds
the network from these and adds the fused training layer; export and inference run this code as it is
(docs/em-routing.md, "Fast routing")."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from model.config import EMCapsNetConfig

POSE = 4  # poses are POSE x POSE matrices
H = POSE * POSE  # pose entries per capsule (h in the paper)
EPS = 1e-6  # keeps the M-step's division by the assigned mass finite when a parent gets none
PAD_LOGIT = -1e30  # log-assignment of the padding slot: exp() of it is 0, yet it stays finite


def logsumexp(x: torch.Tensor, dim: int) -> torch.Tensor:
    """log Σ exp(x) along `dim` with the max subtracted first; finite for any finite x."""
    m = x.amax(dim=dim, keepdim=True).detach()
    return (m + (x - m).exp().sum(dim=dim, keepdim=True).log()).squeeze(dim)


def inverse_temperatures(iterations: int, final: float) -> list[float]:
    """λ for each routing iteration t: final * (1 - 0.95^(t+1)) / (1 - 0.95^T).

    The shape is the schedule the paper's authors gave on OpenReview, λ_t = λ_f (1 - 0.95^(t+1)),
    rescaled so that the last iteration uses exactly `final` (0.35, 0.68, 1.0 of it for T = 3).
    """
    return [final * (1.0 - 0.95 ** (t + 1)) / (1.0 - 0.95**iterations) for t in range(iterations)]


class RoutingGeometry(nn.Module):
    """Which children each parent position sees, and which parent positions each child reaches.

    Buffers (constants, rebuilt from the config, not saved in checkpoints):
        window_index (P_out * KK,): child position of entry k of parent position p, row-major (p, k).
        cover_index (P_in, max_cover): the (p, k) entries that hold child position q; padded with
            P_out * KK, the index of a padding slot.
        init_assignment (P_out, KK): R_ij before the first M-step, 1 / (number of parents of child i).
    """

    window_index: torch.Tensor
    cover_index: torch.Tensor
    init_assignment: torch.Tensor

    def __init__(self, window: torch.Tensor, child_positions: int, child_types: int, parent_types: int) -> None:
        super().__init__()
        p_out, kk = window.shape
        flat = window.flatten()
        covers = [torch.nonzero(flat == q).flatten() for q in range(child_positions)]
        counts = torch.tensor([len(c) for c in covers], dtype=torch.float32)  # (P_in,)
        max_cover = max(1, int(counts.max()))
        cover = torch.full((child_positions, max_cover), p_out * kk, dtype=torch.long)
        for q, c in enumerate(covers):
            cover[q, : len(c)] = c
        self.register_buffer("window_index", flat, persistent=False)
        self.register_buffer("cover_index", cover, persistent=False)
        init = 1.0 / (counts[flat] * parent_types)  # every child in a window is covered at least once
        self.register_buffer("init_assignment", init.reshape(p_out, kk), persistent=False)
        # Mass a parent receives when every child is fully active and routes uniformly: the scale
        # that makes the M-step cost comparable across layers with very different fan-in.
        self.mass_per_parent = float((counts > 0).sum()) * child_types / (p_out * parent_types)
        self.num_positions_out = p_out
        self.kernel_entries = kk

    @classmethod
    def convolution(cls, grid: int, kernel: int, stride: int, child_types: int, parent_types: int) -> RoutingGeometry:
        """A kernel x kernel window with the given stride over a grid x grid child layer (no padding)."""
        out = (grid - kernel) // stride + 1
        rows = (torch.arange(out) * stride).view(out, 1, 1, 1) + torch.arange(kernel).view(1, 1, kernel, 1)
        cols = (torch.arange(out) * stride).view(1, out, 1, 1) + torch.arange(kernel).view(1, 1, 1, kernel)
        window = (rows * grid + cols).reshape(out * out, kernel * kernel)  # (P_out, KK)
        return cls(window, grid * grid, child_types, parent_types)

    @classmethod
    def dense(cls, child_positions: int, child_types: int, parent_types: int) -> RoutingGeometry:
        """One parent position that sees every child position (the class capsules)."""
        window = torch.arange(child_positions).view(1, child_positions)
        return cls(window, child_positions, child_types, parent_types)

    def gather(self, x: torch.Tensor) -> torch.Tensor:
        """Per-position child tensor (B, P_in, ...) -> per-window (B, P_out, KK, ...)."""
        g = x.index_select(1, self.window_index)  # (B, P_out * KK, ...)
        return g.reshape(x.shape[0], self.num_positions_out, self.kernel_entries, *x.shape[2:])

    def normalise(self, logits: torch.Tensor) -> torch.Tensor:
        """Log-domain E-step normalisation: R_ij = exp(logit_ij) / Σ_{parents j' of child i} exp(logit_ij').

        logits (B, P_out, C_out, KK * B_in) -> assignments R of the same shape, summing to 1 per child.
        """
        b, p_out, _, n = logits.shape
        kk = self.kernel_entries
        # logsumexp over the parent types at one position, keeping exp(logit - max) to reuse below
        top = logits.amax(dim=2, keepdim=True).detach()  # (B, P_out, 1, N)
        scaled = (logits - top).exp()  # (B, P_out, C_out, N), each <= 1
        per_entry = (top + scaled.sum(dim=2, keepdim=True).log()).reshape(b, p_out * kk, n // kk)  # (B, P_out*KK, B_in)
        padded = F.pad(per_entry, (0, 0, 0, 1), value=PAD_LOGIT)  # (B, P_out*KK + 1, B_in)
        per_child = logsumexp(padded[:, self.cover_index], dim=2)  # (B, P_in, B_in): over all positions
        log_z = per_child.index_select(1, self.window_index).reshape(b, p_out, 1, n)  # (B, P_out, 1, N)
        return scaled * (top - log_z).exp()  # exp(logit - log_z); log_z >= top, so no factor exceeds 1


def kron_weight(weight: torch.Tensor) -> torch.Tensor:
    """W (C, N, 4, 4) -> I_4 ⊗ W per child n, (N, H, C*H): row (x, y), column (c, x', z) holds δ_xx' W_cn[y, z].

    With it, every vote of a layer is one batched matmul with K = 16 instead of 4 (the same votes, four times
    the multiply-adds, most of them by zero, but a shape the GEMM runs well), and each output row holds
    whole 4x4 votes, so the reorder into the routing's layout moves 16-float blocks.
    """
    c, n = weight.shape[:2]
    eye = torch.eye(POSE, dtype=weight.dtype, device=weight.device)
    return torch.einsum("xa,cnyz->nxycaz", eye, weight).reshape(n, H, c * H)


def child_rows(poses: torch.Tensor) -> torch.Tensor:
    """Child poses per window (B, P, N, H) -> (N, B*P, H), the left operand of the vote matmul."""
    b, p, n, _ = poses.shape
    return poses.permute(2, 0, 1, 3).reshape(n, b * p, H)  # (N, B*P, H)


def votes_plain(poses: torch.Tensor, weight: torch.Tensor, coordinates: torch.Tensor | None) -> torch.Tensor:
    """Votes V_ij = M_i W_ij (B, P, C, N, H) as plain tensor code (what export, tracing and compile run).

    poses (B, P, N, H): child poses per window; weight (C, N, 4, 4); coordinates (N, H) added to every vote.
    """
    b, p, n, _ = poses.shape
    c = weight.shape[0]
    v = (child_rows(poses) @ kron_weight(weight)).reshape(n, b, p, c, H)  # (N, B, P, C, H)
    # The reshape after the transpose keeps ONNX Runtime from fusing the transpose into each MatMul that
    # reads V (FusedMatMul re-reads the untransposed votes every time: 1.4x slower in ORT overall).
    v = v.permute(1, 2, 3, 0, 4).reshape(b * p * c, n, H).reshape(b, p, c, n, H)  # (B, P, C, N, H)
    return v if coordinates is None else v + coordinates


class VoteProducts:
    """The routing's only access to the votes: matrix products against V and V ⊙ V (each (B, P, C, N, H)).

    `moments(w)` = w @ [V, V²] is the M-step's weighted first and second moments; `project(coef, bias)` =
    bias + [V, V²] @ coef the E-step's expanded Gaussian exponent. With `record=True` every product's operand and
    result are kept, so the gradient of V can be assembled afterwards in a single matmul (see
    `FusedEMLayer`). `rows_first` computes the projection as coefᵀ Vᵀ, the form the CPU BLAS runs several
    times faster in eager mode; export keeps V @ coef, which needs no transposed copy of V in the graph.
    """

    def __init__(
        self, votes: torch.Tensor, squares: torch.Tensor, record: bool = False, rows_first: bool = False
    ) -> None:
        self.votes = votes
        self.squares = squares
        self.record = record
        self.rows_first = rows_first
        self.weights: list[tuple[torch.Tensor, torch.Tensor]] = []  # (w (B, P, C, 1, N), w @ [V, V²])
        self.coefs: list[tuple[torch.Tensor, torch.Tensor]] = []  # (coef (B, P, C, 2H, 1), bias + [V, V²] @ coef)

    def moments(self, w: torch.Tensor) -> torch.Tensor:
        """w (B, P, C, 1, N) -> Σ_i w_ij [V_ij, V_ij²]: (B, P, C, 1, 2H)."""
        out = torch.cat([w @ self.votes, w @ self.squares], dim=-1)
        if self.record:
            self.weights.append((w, out))
        return out

    def project(self, coef: torch.Tensor, bias: torch.Tensor) -> torch.Tensor:
        """coef (B, P, C, 2H, 1), bias (B, P, C, 1) -> bias_j + [V_ij, V_ij²] · coef_j: (B, P, C, N).

        The bias is added inside the product (baddbmm) so that no extra vote-count tensor is written; the
        gradient of the result is that of the product alone.
        """
        lin, quad = coef[..., :H, :], coef[..., H:, :]  # (B, P, C, H, 1) each
        if self.rows_first:
            b, p, c, n, _ = self.votes.shape
            votes, squares = (t.view(-1, n, H).mT for t in (self.votes, self.squares))  # (B*P*C, H, N) each
            out = torch.baddbmm(bias.reshape(-1, 1, 1), lin.reshape(-1, H, 1).mT, votes)  # (B*P*C, 1, N)
            out = out.baddbmm_(quad.reshape(-1, H, 1).mT, squares).view(b, p, c, n)
        else:
            out = (self.votes @ lin + self.squares @ quad).squeeze(-1) + bias
        if self.record:
            self.coefs.append((coef, out))
        return out


def m_step(
    r: torch.Tensor,
    a_in: torch.Tensor,
    products: VoteProducts,
    beta_u: torch.Tensor,
    beta_a: torch.Tensor,
    lam: float,
    mass_per_parent: float,
    cfg: EMCapsNetConfig,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """Procedure 1, M-step: fit a Gaussian to each parent's weighted votes and compute its activation.

    r (B|1, P, C, N), a_in (B, P, 1, N), products over V and V² (B, P, C, N, H) -> the activation logit
    (B, P, C, 1), μ, σ² and log σ² (B, P, C, H). Both moments come from one matmul over the votes:
    σ² = Σ_i w_ij V_ij² - μ² (clamped at 0 against rounding, then floored) instead of a fresh (V - μ)².
    """
    rw = r * a_in  # R_ij a_i: (B, P, C, N)
    mass = rw.sum(dim=3, keepdim=True)  # Σ_i R_ij a_i: (B, P, C, 1)
    w = (rw / (mass + EPS)).unsqueeze(3)  # normalised weights (B, P, C, 1, N)
    mu, second = products.moments(w).squeeze(3).split(H, dim=-1)  # Σ_i w_ij V_ij, Σ_i w_ij V_ij²: (B, P, C, H)
    # Σ_i w_ij (V_ij - μ)² expanded; Σ_i w_ij = mass / (mass + EPS) falls just short of 1, hence the (2 - Σw)
    total = mass / (mass + EPS)  # Σ_i w_ij: (B, P, C, 1)
    var = (second - mu * mu * (2.0 - total)).clamp_min(0.0) + cfg.variance_floor  # (σ_j^h)², floored
    log_var = var.log()  # (B, P, C, H)
    # cost^h = (β_u + log σ^h) Σ_i R_ij a_i, with the mass scaled to be ~1 per parent and the cost
    # averaged over h rather than summed (the factor 1/H is absorbed by λ and β_a).
    log_sd = 0.5 * log_var.mean(dim=-1, keepdim=True)  # mean_h log σ_j^h (B, P, C, 1)
    cost = (mass / mass_per_parent) * (beta_u.view(1, 1, -1, 1) + log_sd)
    logit = (lam * (beta_a.view(1, 1, -1, 1) - cost)).clamp(-cfg.max_logit, cfg.max_logit)  # a_j = sigmoid(logit)
    return logit, mu, var, log_var


def e_step(
    logit: torch.Tensor,
    mu: torch.Tensor,
    var: torch.Tensor,
    log_var: torch.Tensor,
    products: VoteProducts,
    geometry: RoutingGeometry,
) -> torch.Tensor:
    """Procedure 1, E-step in the log domain: R_ij ∝ a_j p_j(V_ij), normalised over each child's parents.

    The Gaussian's exponent is expanded, -Σ_h (V - μ)² / 2σ² = [V, V²] · [μ/σ², -1/2σ²] - Σ_h μ²/2σ², so
    it is one product against V and V² (B, P, C, N, H). log p_j drops the constant -H/2 log 2π, which cancels in
    the normalisation. Returns R (B, P, C, N).
    """
    inv = 1.0 / var  # (B, P, C, H)
    coef = torch.cat([mu * inv, -0.5 * inv], dim=-1).unsqueeze(-1)  # (B, P, C, 2H, 1)
    const = -0.5 * (mu * mu * inv + log_var).sum(dim=-1, keepdim=True)  # (B, P, C, 1)
    return geometry.normalise(products.project(coef, F.logsigmoid(logit) + const))  # log a_j + log p_j


def route(
    products: VoteProducts,
    activations: torch.Tensor,
    beta_u: torch.Tensor,
    beta_a: torch.Tensor,
    geometry: RoutingGeometry,
    cfg: EMCapsNetConfig,
) -> tuple[torch.Tensor, torch.Tensor]:
    """The iterations of Procedure 1 over the votes behind `products`; see `em_routing`."""
    a_in = activations.unsqueeze(2)  # (B, P, 1, N)
    p, c, n = products.votes.shape[1:4]
    r = geometry.init_assignment.reshape(1, p, 1, geometry.kernel_entries, 1)
    r = r.expand(1, p, c, geometry.kernel_entries, n // geometry.kernel_entries).reshape(1, p, c, n)
    lambdas = inverse_temperatures(cfg.routing_iterations, cfg.final_inverse_temperature)
    for lam in lambdas[:-1]:
        logit, mu, var, log_var = m_step(r, a_in, products, beta_u, beta_a, lam, geometry.mass_per_parent, cfg)
        r = e_step(logit, mu, var, log_var, products, geometry)
    logit, mu, _, _ = m_step(r, a_in, products, beta_u, beta_a, lambdas[-1], geometry.mass_per_parent, cfg)
    return torch.sigmoid(logit).squeeze(-1), mu

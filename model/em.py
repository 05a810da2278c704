"""Matrix capsules with EM routing (Hinton, Sabour & Frosst 2018), written as static tensor code.

Every capsule has a 4x4 pose matrix M and an activation a. A capsule layer turns the poses of its
children i into votes V_ij = M_i W_ij for every parent j it can reach, then EM routing (Procedure 1)
fits one Gaussian per parent to the votes, weighted by the child activations and the assignments R_ij.

Convolutional layers route exactly: a child inside several overlapping receptive fields splits its
vote among the parents of all those fields (R_ij sums to 1 over every parent the child reaches), not
among the parents of each field separately. Both the gather of children into receptive fields and the
normalisation over overlapping fields are Gather ops with constant indices, so the exported graph has
static shapes apart from the batch and no Loop, If or Scan node.

The routing is memory-bound (ConvCaps1 holds 5.3 M vote floats per image), so the code touches the votes
as few times as Procedure 1 allows: one matmul forms them, every M-step and E-step is a matrix product
against V and V², and in eager training `FusedEMLayer` writes their gradient once, into buffers reused
from step to step (docs/em-routing.md, "Fast routing")."""

from __future__ import annotations

import threading
from typing import NamedTuple

import torch
import torch.nn.functional as F
from torch import nn

from model.config import EMCapsNetConfig
from model.em_routing import (
    POSE,
    H,
    RoutingGeometry,
    VoteProducts,
    child_rows,
    kron_weight,
    route,
    votes_plain,
)


class Workspace:
    """Vote-sized float buffers kept between calls, so each training step reuses the same memory.

    A fresh 40 MB+ tensor costs more in page faults (the kernel zeroing pages on first touch) than the
    arithmetic done on it, and the routing needs several per layer per step. Buffers are keyed by
    shape, dtype and device; at most `keep` idle ones are held (the least recently returned go first).
    """

    def __init__(self, keep: int = 12) -> None:
        self.keep = keep
        self.idle: list[torch.Tensor] = []
        self.lock = threading.Lock()

    def take(self, shape: tuple[int, ...], like: torch.Tensor) -> torch.Tensor:
        """An uninitialised buffer of `shape` with the dtype and device of `like`."""
        shape = tuple(shape)
        inference = torch.is_inference_mode_enabled()  # inference tensors can only be written in inference mode
        with self.lock:
            for k, t in enumerate(self.idle):
                usable = inference or not t.is_inference()
                if usable and t.shape == shape and t.dtype == like.dtype and t.device == like.device:
                    return self.idle.pop(k)
        return torch.empty(shape, dtype=like.dtype, device=like.device)

    def give(self, *buffers: torch.Tensor) -> None:
        """Return buffers taken with `take`; the caller must not use them afterwards."""
        with self.lock:
            self.idle.extend(buffers)
            del self.idle[: max(0, len(self.idle) - self.keep)]


WORKSPACE = Workspace()
INFERENCE_CHUNK_VOTES = 1 << 24  # vote entries per chunk of an eager no-grad forward (64 MB of float32)
ROUTING_CHUNK_VOTES = 1 << 20  # vote entries per chunk of the training routing's small graph (see FusedEMLayer)


def votes_into_workspace(
    rows: torch.Tensor, wk: torch.Tensor, batch: int, coordinates: torch.Tensor | None
) -> tuple[torch.Tensor, torch.Tensor]:
    """V and V ⊙ V (each (B, P, C, N, H)) in workspace buffers, from child_rows (N, B*P, H) and kron_weight.

    The matmul writes (N, B*P, C*H); one copy reorders it to the routing's layout. Give both back after use.
    """
    n, bp, _ = rows.shape
    c = wk.shape[2] // H
    product = WORKSPACE.take((n, bp, c * H), rows)
    torch.bmm(rows, wk, out=product)  # (N, B*P, C*H)
    votes = WORKSPACE.take((batch, bp // batch, c, n, H), rows)
    votes.view(bp, c, n, H).copy_(product.view(n, bp, c, H).permute(1, 2, 0, 3))  # (B*P, C, N, H)
    WORKSPACE.give(product)
    if coordinates is not None:
        votes.add_(coordinates)
    squares = WORKSPACE.take(votes.shape, rows)
    torch.mul(votes, votes, out=squares)
    return votes, squares


def assemble_vote_gradient(products: VoteProducts, result_grads: list[torch.Tensor], grad: torch.Tensor) -> None:
    """dL/dV written into `grad` (the shape of products.votes), from the gradients of every recorded product's result.

    The routing reads V and V² only through linear products (M-step: w_t @ [V, V²], E-step: [V, V²] @ coef_t),
    so dL/d[V, V²] = Σ_t w_tᵀ (dL/dm_t) + Σ_t (dL/dlp_t) coef_tᵀ, one matmul of stacked (N, K) and (K, 2H)
    factors, K = 2T - 1, and dL/dV = G_V + 2 V ⊙ G_V². Overwrites products.squares (the gradient of V²).
    """
    k = len(products.weights)
    left = [w.transpose(-1, -2) for w, _ in products.weights] + [
        g.unsqueeze(-1) for g in result_grads[k:]
    ]  # (B, P, C, N, 1)
    right = result_grads[:k] + [coef.transpose(-1, -2) for coef, _ in products.coefs]  # each (B, P, C, 1, 2H)
    lhs = torch.cat(left, dim=-1).flatten(0, 2)  # (B*P*C, N, K)
    rhs = torch.cat(right, dim=-2).flatten(0, 2)  # (B*P*C, K, 2H)
    votes, squares = products.votes, products.squares
    torch.bmm(lhs, rhs[..., :H], out=grad.view(lhs.shape[0], -1, H))  # G_V
    torch.bmm(lhs, rhs[..., H:], out=squares.view(lhs.shape[0], -1, H))  # G_V², over V², no longer needed
    grad.addcmul_(votes, squares, value=2.0)  # (B, P, C, N, H)


class FusedEMLayer(torch.autograd.Function):
    """A capsule layer's votes and EM routing with hand-assembled vote gradients and reused vote buffers.

    Forward: V = M W as one matmul into a workspace buffer, V² beside it, then the ordinary routing (`route`)
    on them, keeping its small graph (everything but the vote-sized tensors). Backward: differentiate that
    graph for the small inputs and for every vote product's result, assemble dL/dV in one matmul
    (`assemble_vote_gradient`), then push it through the vote matmul to the poses and W. No vote-sized
    tensor is allocated after the first step, and none is written more than once per use.

    The small graph runs in chunks of the batch (ROUTING_CHUNK_VOTES votes each; images route independently):
    its (chunk, P, C, N) temporaries then stay small enough for the allocator to reuse memory instead of
    mapping fresh pages for every one (+25% training speed for the paper preset at batch 32).
    """

    @staticmethod
    def forward(
        ctx: torch.autograd.function.FunctionCtx,
        poses: torch.Tensor,
        weight: torch.Tensor,
        activations: torch.Tensor,
        beta_u: torch.Tensor,
        beta_a: torch.Tensor,
        coordinates: torch.Tensor | None,
        geometry: RoutingGeometry,
        cfg: EMCapsNetConfig,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        a_in, bu, ba = (t.detach().requires_grad_(t.requires_grad) for t in (activations, beta_u, beta_a))
        small = [a_in, bu, ba]
        rows, wk = child_rows(poses.detach()), kron_weight(weight.detach())
        votes, squares = votes_into_workspace(rows, wk, poses.shape[0], coordinates)
        chunks = []  # (products, a_out, mu) per chunk of the batch
        with torch.enable_grad():
            for part in batch_chunks(votes.shape, ROUTING_CHUNK_VOTES):
                products = VoteProducts(votes[part], squares[part], record=True, rows_first=True)
                chunks.append((products, *route(products, a_in[part], bu, ba, geometry, cfg)))
        ctx.graph = (small, votes, squares, chunks, rows, wk, poses.shape)  # type: ignore[attr-defined]
        return torch.cat([c[1] for c in chunks]).detach(), torch.cat([c[2] for c in chunks]).detach()

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(
        ctx: torch.autograd.function.FunctionCtx, grad_a: torch.Tensor, grad_mu: torch.Tensor
    ) -> tuple[torch.Tensor | None, ...]:
        if ctx.graph is None:  # type: ignore[attr-defined]
            raise RuntimeError("FusedEMLayer: backward through the same EM layer call twice is not supported")
        small, votes, squares, chunks, rows, wk, shape = ctx.graph  # type: ignore[attr-defined]
        ctx.graph = None  # type: ignore[attr-defined]
        wanted = [t for t in small if t.requires_grad]
        results = [out for products, _, _ in chunks for _, out in products.weights + products.coefs]
        outputs = [t for _, a_out, mu in chunks for t in (a_out, mu)]
        sizes = [len(a_out) for _, a_out, _ in chunks]
        out_grads = [g for pair in zip(grad_a.split(sizes), grad_mu.split(sizes), strict=True) for g in pair]
        grads = torch.autograd.grad(outputs, wanted + results, out_grads, allow_unused=True)
        small_grads = iter(grads[: len(wanted)])
        result_grads = iter(
            torch.zeros_like(r) if g is None else g for r, g in zip(results, grads[len(wanted) :], strict=True)
        )
        grad_votes = WORKSPACE.take(votes.shape, votes)
        start = 0
        for (products, _, _), size in zip(chunks, sizes, strict=True):
            count = len(products.weights) + len(products.coefs)
            part = [next(result_grads) for _ in range(count)]
            assemble_vote_gradient(products, part, grad_votes[start : start + size])
            start += size
        WORKSPACE.give(votes, squares)
        needed = ctx.needs_input_grad[:2]  # type: ignore[attr-defined]
        grad_poses, grad_weight = vote_matmul_backward(grad_votes, rows, wk, shape, needed)
        out_small = [next(small_grads) if t.requires_grad else None for t in small]
        return (grad_poses, grad_weight, *out_small, None, None, None)


def batch_chunks(shape: torch.Size, votes_per_chunk: int) -> list[slice]:
    """Slices of the batch (the first axis of `shape`), each with at most votes_per_chunk votes (or one image)."""
    per_image = max(1, shape[1:].numel() // H)
    step = max(1, votes_per_chunk // per_image)
    return [slice(s, s + step) for s in range(0, shape[0], step)]


def vote_matmul_backward(
    grad_votes: torch.Tensor, rows: torch.Tensor, wk: torch.Tensor, shape: torch.Size, needed: tuple[bool, ...]
) -> tuple[torch.Tensor | None, torch.Tensor | None]:
    """dL/dV (B, P, C, N, H) (a workspace buffer, given back here) -> dL/dposes (B, P, N, H), dL/dW (C, N, 4, 4)."""
    b, p, c, n, _ = grad_votes.shape
    product = WORKSPACE.take((n, b * p, c * H), grad_votes)
    product.view(n, b * p, c, H).copy_(grad_votes.view(b * p, c, n, H).permute(2, 0, 1, 3))  # (N, B*P, C, H)
    WORKSPACE.give(grad_votes)
    grad_poses = grad_weight = None
    if needed[0]:
        grad_poses = (product @ wk.mT).view(n, b, p, H).permute(1, 2, 0, 3).reshape(shape)  # (B, P, N, H)
    if needed[1]:
        grad_wk = (rows.mT @ product).view(n, POSE, POSE, c, POSE, POSE)  # (N, x, y, C, x', z)
        grad_weight = grad_wk.diagonal(dim1=1, dim2=4).sum(-1).permute(2, 0, 1, 3)  # Σ_x at x' = x: (C, N, y, z)
    WORKSPACE.give(product)
    return grad_poses, grad_weight


def em_routing(
    votes: torch.Tensor,
    activations: torch.Tensor,
    beta_u: torch.Tensor,
    beta_a: torch.Tensor,
    geometry: RoutingGeometry,
    cfg: EMCapsNetConfig,
) -> tuple[torch.Tensor, torch.Tensor]:
    """EM routing, Hinton et al. 2018 Procedure 1, unrolled over cfg.routing_iterations, on given votes.

    Args:
        votes: V_ij (B, P_out, C_out, N, H), N = KK * B_in children per parent position.
        activations: child activations a_i gathered per window, (B, P_out, N).
        beta_u, beta_a: per parent type (C_out,).

    Returns:
        parent activations a_j (B, P_out, C_out) and poses μ_j (B, P_out, C_out, H).
    """
    return route(VoteProducts(votes, votes * votes), activations, beta_u, beta_a, geometry, cfg)


def em_layer(
    poses: torch.Tensor,
    weight: torch.Tensor,
    activations: torch.Tensor,
    beta_u: torch.Tensor,
    beta_a: torch.Tensor,
    coordinates: torch.Tensor | None,
    geometry: RoutingGeometry,
    cfg: EMCapsNetConfig,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Votes V_ij = M_i W_ij (+ coordinates) and EM routing over them: a capsule layer after its gather.

    Args:
        poses: child poses per window (B, P_out, N, H); weight: W (C_out, N, 4, 4).
        activations: child activations per window (B, P_out, N); beta_u, beta_a: (C_out,).
        coordinates: (N, H) added to every vote (Coordinate Addition), or None.

    Returns parent activations a_j (B, P_out, C_out) and poses μ_j (B, P_out, C_out, H). Eager training runs
    `FusedEMLayer`, eager inference the same buffers in chunks of the batch (bounded memory); export, tracing
    and compiling run plain tensor code (`votes_plain`, `em_routing`), the same operations.
    """
    if torch.jit.is_tracing() or torch.onnx.is_in_onnx_export() or torch.compiler.is_compiling():
        return em_routing(votes_plain(poses, weight, coordinates), activations, beta_u, beta_a, geometry, cfg)
    inputs = (poses, weight, activations, beta_u, beta_a)
    if torch.is_grad_enabled() and any(t.requires_grad for t in inputs):
        a_out, mu = FusedEMLayer.apply(*inputs, coordinates, geometry, cfg)
        return a_out, mu
    b, p, n, _ = poses.shape
    wk, outputs = kron_weight(weight), []
    for part in batch_chunks(torch.Size((b, p, weight.shape[0], n, H)), INFERENCE_CHUNK_VOTES):
        votes, squares = votes_into_workspace(child_rows(poses[part]), wk, len(poses[part]), coordinates)
        products = VoteProducts(votes, squares, rows_first=True)
        outputs.append(route(products, activations[part], beta_u, beta_a, geometry, cfg))
        WORKSPACE.give(votes, squares)
    return torch.cat([a for a, _ in outputs]), torch.cat([mu for _, mu in outputs])


class PrimaryCaps(nn.Module):
    """1x1 convolutions: B pose matrices and B logistic activations per position (§3, Figure 1)."""

    def __init__(self, cfg: EMCapsNetConfig) -> None:
        super().__init__()
        self.cfg = cfg
        self.pose = nn.Conv2d(cfg.conv1_channels, cfg.primary_types * H, kernel_size=1)
        self.activation = nn.Conv2d(cfg.conv1_channels, cfg.primary_types, kernel_size=1)

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(B, A, G, G) -> poses (B, G*G, B_types, H) and activations (B, G*G, B_types)."""
        b, types = x.shape[0], self.cfg.primary_types
        pose = self.pose(x).reshape(b, types, H, -1).permute(0, 3, 1, 2)  # (B, G*G, types, H)
        act = torch.sigmoid(self.activation(x)).reshape(b, types, -1).transpose(1, 2)  # (B, G*G, types)
        return pose, act


class ConvCaps(nn.Module):
    """Convolutional capsules: a transformation matrix per (kernel position, child type, parent type)."""

    def __init__(
        self, cfg: EMCapsNetConfig, grid: int, in_types: int, out_types: int, kernel: int, stride: int
    ) -> None:
        super().__init__()
        self.cfg = cfg
        self.geometry = RoutingGeometry.convolution(grid, kernel, stride, in_types, out_types)
        # W (C_out, KK, B_in, 4, 4) ~ N(0, 1): at this scale a quarter to half of all capsules start active
        self.weight = nn.Parameter(torch.randn(out_types, kernel * kernel, in_types, POSE, POSE))
        self.beta_u = nn.Parameter(torch.full((out_types,), cfg.beta_u_init))
        self.beta_a = nn.Parameter(torch.zeros(out_types))

    def forward(self, pose: torch.Tensor, act: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(B, P_in, B_in, H), (B, P_in, B_in) -> poses (B, P_out, C_out, H), activations (B, P_out, C_out)."""
        m = self.geometry.gather(pose).flatten(2, 3)  # (B, P_out, KK*B_in, H)
        a = self.geometry.gather(act).flatten(2)  # (B, P_out, KK*B_in)
        weight = self.weight.flatten(1, 2)  # (C_out, KK*B_in, 4, 4)
        a_out, mu = em_layer(m, weight, a, self.beta_u, self.beta_a, None, self.geometry, self.cfg)
        return mu, a_out


def receptive_field_centres(cfg: EMCapsNetConfig) -> torch.Tensor:
    """Centre of each ConvCaps2 row (or column) in the image, scaled to [0, 1]: (G2,)."""
    c = torch.arange(cfg.caps2_grid, dtype=torch.float32)  # ConvCaps2 index
    c = c * cfg.caps2_stride + (cfg.caps2_kernel - 1) / 2  # -> ConvCaps1 grid
    c = c * cfg.caps1_stride + (cfg.caps1_kernel - 1) / 2  # -> PrimaryCaps / Conv1 grid
    c = c * cfg.conv1_stride - cfg.conv1_padding + (cfg.conv1_kernel - 1) / 2  # -> input pixel index
    return (c + 0.5) / cfg.image_size


class ClassCaps(nn.Module):
    """Class capsules: one matrix per (child type, class) shared over positions, plus Coordinate Addition."""

    coordinates: torch.Tensor

    def __init__(self, cfg: EMCapsNetConfig) -> None:
        super().__init__()
        self.cfg = cfg
        g, d = cfg.caps2_grid, cfg.caps2_types
        self.geometry = RoutingGeometry.dense(g * g, d, cfg.num_classes)
        self.weight = nn.Parameter(torch.randn(cfg.num_classes, 1, d, POSE, POSE))  # (K, 1, D, 4, 4)
        self.beta_u = nn.Parameter(torch.full((cfg.num_classes,), cfg.beta_u_init))
        self.beta_a = nn.Parameter(torch.zeros(cfg.num_classes))
        # §3.1: the scaled (row, column) of each capsule's receptive-field centre is added to the first
        # two entries of the right-hand column of its votes, i.e. to V[0, 3] and V[1, 3].
        centre = receptive_field_centres(cfg)
        coords = torch.zeros(g, g, d, POSE, POSE)
        if cfg.coordinate_addition:
            coords[..., 0, POSE - 1] = centre.view(g, 1, 1)
            coords[..., 1, POSE - 1] = centre.view(1, g, 1)
        self.register_buffer("coordinates", coords.reshape(g * g * d, H), persistent=False)

    def forward(self, pose: torch.Tensor, act: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(B, P_in, D, H), (B, P_in, D) -> class poses (B, K, H) and activations (B, K)."""
        b, p, d, _ = pose.shape
        weight = self.weight.expand(-1, p, -1, -1, -1).flatten(1, 2)  # shared over positions: (K, P_in*D, 4, 4)
        m, a = pose.reshape(b, 1, p * d, H), act.reshape(b, 1, p * d)  # one window over every child
        coords = self.coordinates if self.cfg.coordinate_addition else None
        a_out, mu = em_layer(m, weight, a, self.beta_u, self.beta_a, coords, self.geometry, self.cfg)
        return mu[:, 0], a_out[:, 0]


class EMCapsNetOutput(NamedTuple):
    activations: torch.Tensor  # (B, num_classes): class capsule activations, the class scores
    poses: torch.Tensor  # (B, num_classes, 4, 4): class capsule pose matrices
    parts: torch.Tensor  # (B, cells, D): ConvCaps2 activations, the parts the class capsules were routed from


class EMCapsNet(nn.Module):
    """Conv1 -> PrimaryCaps -> ConvCaps1 -> ConvCaps2 -> ClassCaps, Hinton et al. 2018 Figure 1."""

    def __init__(self, cfg: EMCapsNetConfig | None = None) -> None:
        super().__init__()
        self.cfg = c = cfg or EMCapsNetConfig()
        self.conv1 = nn.Conv2d(
            c.in_channels, c.conv1_channels, kernel_size=c.conv1_kernel, stride=c.conv1_stride, padding=c.conv1_padding
        )
        self.primary = PrimaryCaps(c)
        self.caps1 = ConvCaps(c, c.primary_grid, c.primary_types, c.caps1_types, c.caps1_kernel, c.caps1_stride)
        self.caps2 = ConvCaps(c, c.caps1_grid, c.caps1_types, c.caps2_types, c.caps2_kernel, c.caps2_stride)
        self.classes = ClassCaps(c)

    def forward(self, x: torch.Tensor, labels: torch.Tensor | None = None) -> EMCapsNetOutput:
        """Images (B, C, H, W) -> class activations and poses. `labels` is unused (there is no decoder)."""
        h = F.relu(self.conv1(x))  # (B, A, 14, 14)
        # The capsule layers always run in float32: EM routing's sums and variances are not safe in bfloat16.
        with torch.autocast(device_type=x.device.type, enabled=False):
            pose, act = self.primary(h.float())  # (B, 196, B, 16), (B, 196, B)
            pose, act = self.caps1(pose, act)  # (B, 36, C, 16), (B, 36, C)
            pose, act = self.caps2(pose, act)  # (B, 16, D, 16), (B, 16, D)
            poses, activations = self.classes(pose, act)  # (B, K, 16), (B, K)
        return EMCapsNetOutput(activations, poses.reshape(-1, self.cfg.num_classes, POSE, POSE), act)

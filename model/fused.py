"""Hand-written backward passes for the two hot spots of a CapsNet training step on CPU.

Both compute the same gradients as PyTorch's autograd of the plain code (up to float rounding order)
and are used only while training; inference and export run the plain code, so the exported graphs do
not change.

- `strided_conv2d`: oneDNN's bfloat16 weight gradient of the PrimaryCaps convolution (9x9, stride 2,
  6x6 output) runs at a fraction of its forward speed and took a third of an `--amp` training step.
  The same gradient is a forward convolution of the input with the output gradient as the kernel,
  dilated by the stride, which oneDNN runs several times faster.
- `route_sabour_fused`: autograd of routing by agreement writes one (B, N_out, N_in, D) gradient of
  û per contraction (2r - 1 of them, as rank-1 batched products that MKL runs slowly) and adds them
  up. The gradient of û is Σ_t c_t ⊗ ∂s_t + Σ_t ∂b_t ⊗ v_t: one batched product with inner size
  2r - 1, written once.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
import torch.nn.functional as F


def conv_weight_grad(x: torch.Tensor, grad: torch.Tensor, kernel: int, stride: int) -> torch.Tensor:
    """∂L/∂W of an unpadded, undilated conv2d: x (B, C, H, W), grad (B, O, Ho, Wo) -> (O, C, k, k).

    ∂L/∂W[o, c, p, q] = Σ_b Σ_(y, z) grad[b, o, y, z] x[b, c, stride·y + p, stride·z + q]: a convolution
    over (H, W) of x with channels and batch swapped, whose kernel is the output gradient dilated by
    `stride`. Rows and columns past the last window are cropped (the forward never reads them).
    """
    rows = stride * (grad.shape[2] - 1) + kernel
    cols = stride * (grad.shape[3] - 1) + kernel
    inputs = x[:, :, :rows, :cols].transpose(0, 1)  # (C, B, rows, cols): channels as the batch
    weight = grad.transpose(0, 1)  # (O, B, Ho, Wo): the batch as input channels
    return F.conv2d(inputs, weight, dilation=stride).transpose(0, 1).contiguous()  # (C, O, k, k) -> (O, C, k, k)


class _StridedConv2d(torch.autograd.Function):
    """conv2d (no padding, no dilation, one group) with the weight gradient of `conv_weight_grad`."""

    @staticmethod
    def forward(
        ctx: Any, x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, stride: int
    ) -> torch.Tensor:
        ctx.save_for_backward(x, weight)
        ctx.stride = stride
        return F.conv2d(x, weight, bias, stride=stride)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor | None, ...]:
        x, weight = ctx.saved_tensors
        s = ctx.stride
        grad = grad.contiguous()
        grad_x = grad_w = grad_b = None
        if ctx.needs_input_grad[0]:
            grad_x = torch.ops.aten.convolution_backward(
                grad, x, weight, None, [s, s], [0, 0], [1, 1], False, [0, 0], 1, [True, False, False]
            )[0]
        if ctx.needs_input_grad[1]:
            grad_w = conv_weight_grad(x, grad, weight.shape[-1], s)
        if ctx.needs_input_grad[2]:
            grad_b = grad.sum(dim=(0, 2, 3))
        return grad_x, grad_w, grad_b, None


def strided_conv2d(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, stride: int) -> torch.Tensor:
    """F.conv2d(x, weight, bias, stride=stride) for a square kernel, with a faster weight gradient on CPU."""
    if weight.shape[-1] != weight.shape[-2]:
        raise ValueError(f"strided_conv2d needs a square kernel, got {tuple(weight.shape[-2:])}")
    out: torch.Tensor = _StridedConv2d.apply(x, weight, bias, stride)
    return out


Squash = Callable[[torch.Tensor], torch.Tensor]


def _vjp(fn: Squash, s: torch.Tensor, grad_v: torch.Tensor) -> torch.Tensor:
    """∂L/∂s of fn(s) by autograd on the small (B, N_out, D) tensor: the very formula of the plain path."""
    with torch.enable_grad():
        leaf = s.detach().requires_grad_(True)
        (grad_s,) = torch.autograd.grad(fn(leaf), leaf, grad_v)
    return grad_s


def _softmax_backward(c: torch.Tensor, grad_c: torch.Tensor, dim: int) -> torch.Tensor:
    return torch._softmax_backward_data(grad_c, c, dim, c.dtype)


def _dot(u_hat: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    """û (B, N_out, N_in, D) · v (B, N_out, D) -> (B, N_out, N_in), as the row vector v times û transposed.

    The same products as `agreement`'s matrix-vector form, which MKL runs about three times slower.
    """
    return torch.matmul(v.unsqueeze(-2), u_hat.transpose(-1, -2)).squeeze(-2)


class _RouteSabour(torch.autograd.Function):
    """Routing by agreement on class-major û (B, N_out, N_in, D) -> v (B, N_out, D), c (B, N_out, N_in)."""

    @staticmethod
    def forward(ctx: Any, u_hat: torch.Tensor, iterations: int, squash: Squash) -> tuple[torch.Tensor, torch.Tensor]:
        b = torch.zeros_like(u_hat[..., 0])
        cs: list[torch.Tensor] = []
        ss: list[torch.Tensor] = []
        vs: list[torch.Tensor] = []
        for t in range(iterations):
            if t:
                b = b + _dot(u_hat, vs[-1])  # agreement û · v
            cs.append(F.softmax(b, dim=1))
            ss.append(torch.matmul(cs[-1].unsqueeze(2), u_hat).squeeze(2))  # Σ_i c_ij û_j|i
            vs.append(squash(ss[-1]))
        ctx.save_for_backward(u_hat, *cs, *ss, *vs)
        ctx.iterations = iterations
        ctx.squash = squash
        return vs[-1], cs[-1]

    @staticmethod
    def backward(
        ctx: Any, grad_v: torch.Tensor | None, grad_c: torch.Tensor | None
    ) -> tuple[torch.Tensor | None, None, None]:
        r = ctx.iterations
        u_hat, *saved = ctx.saved_tensors
        cs, ss, vs = saved[:r], saved[r : 2 * r], saved[2 * r :]
        gv = grad_v if grad_v is not None else torch.zeros_like(vs[-1])
        gc = grad_c if grad_c is not None else torch.zeros_like(cs[-1])
        left: list[torch.Tensor] = []  # (B, N_out, N_in) factors of the rank-1 terms of ∂L/∂û
        right: list[torch.Tensor] = []  # (B, N_out, D) factors
        grad_b: torch.Tensor | None = None  # ∂L/∂b_t, b_t = b_(t-1) + û · v_t
        for t in reversed(range(r)):
            if grad_b is not None:  # b_(t+1) = b_t + agreement(û, v_t): to v_t and to û
                gv = torch.matmul(grad_b.unsqueeze(2), u_hat).squeeze(2)
                left.append(grad_b)
                right.append(vs[t])
            gs = _vjp(ctx.squash, ss[t], gv)
            left.append(cs[t])
            right.append(gs)
            if t == 0:  # c_0 = softmax(0) is a constant
                break
            gc_t = _dot(u_hat, gs)  # s_t = Σ_i c_ij û_j|i: to c_t
            if t == r - 1:
                gc_t = gc_t + gc
            g_softmax = _softmax_backward(cs[t], gc_t, 1)
            grad_b = g_softmax if grad_b is None else grad_b + g_softmax
        if not ctx.needs_input_grad[0]:
            return None, None, None
        factors_left = torch.stack(left, dim=-2)  # (B, N_out, 2r - 1, N_in): contiguous rows, a cheap stack
        factors_right = torch.stack(right, dim=-2)  # (B, N_out, 2r - 1, D)
        return torch.matmul(factors_left.transpose(-1, -2), factors_right), None, None


def route_sabour_fused(u_hat: torch.Tensor, iterations: int, squash: Squash) -> tuple[torch.Tensor, torch.Tensor]:
    """`route_sabour` with the squash function `squash`, whose backward writes ∂L/∂û once.

    û class-major (B, N_out, N_in, D) -> v (B, N_out, D) and c (B, N_in, N_out), as `route_sabour`.
    """
    v, c = _RouteSabour.apply(u_hat, iterations, squash)
    return v, c.transpose(1, 2)

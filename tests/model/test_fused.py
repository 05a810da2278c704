"""The hand-written training backward passes equal autograd of the plain code, and only training uses them."""

from __future__ import annotations

from typing import Any

import pytest
import torch
import torch.nn.functional as F

import model.capsnet as capsnet
from model.capsnet import CapsNet, route_sabour, squash
from model.config import CapsNetConfig
from model.fused import conv_weight_grad, route_sabour_fused, strided_conv2d
from model.losses import margin_loss, reconstruction_loss


def _routing_grads(route: Any, u_hat: torch.Tensor, iterations: int) -> tuple[torch.Tensor, ...]:
    """v, c and ∂L/∂û for a loss that reads both outputs."""
    torch.manual_seed(1)
    leaf = u_hat.detach().clone().requires_grad_(True)
    v, c = route(leaf, iterations)
    loss = (v * torch.randn_like(v)).sum() + (c * torch.randn_like(c)).sum()
    (grad,) = torch.autograd.grad(loss, leaf)
    return v.detach(), c.detach(), grad


@pytest.mark.parametrize("iterations", [1, 2, 3, 5])
@pytest.mark.parametrize(("dtype", "tol"), [(torch.float64, 1e-12), (torch.float32, 1e-6)])
def test_fused_routing_equals_autograd_of_route_sabour(iterations: int, dtype: torch.dtype, tol: float) -> None:
    torch.manual_seed(0)
    u_hat = 0.3 * torch.randn(3, 10, 40, 16, dtype=dtype)
    want = _routing_grads(route_sabour, u_hat, iterations)
    got = _routing_grads(lambda u, r: route_sabour_fused(u, r, squash), u_hat, iterations)
    for name, a, b in zip(("v", "c", "grad u_hat"), got, want, strict=True):
        torch.testing.assert_close(a, b, atol=tol, rtol=tol, msg=name)


def test_fused_routing_passes_gradcheck() -> None:
    u_hat = torch.randn(2, 3, 5, 4, dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradcheck(lambda u: route_sabour_fused(u, 3, squash), (u_hat,))


@pytest.mark.parametrize(("size", "kernel", "stride"), [(20, 9, 2), (13, 3, 3), (11, 5, 1), (12, 4, 2)])
@pytest.mark.parametrize("bias", [True, False])
def test_strided_conv2d_equals_conv2d_and_its_gradients(size: int, kernel: int, stride: int, bias: bool) -> None:
    torch.manual_seed(0)
    x = torch.randn(3, 4, size, size, dtype=torch.float64, requires_grad=True)
    w = torch.randn(5, 4, kernel, kernel, dtype=torch.float64, requires_grad=True)
    b = torch.randn(5, dtype=torch.float64, requires_grad=True) if bias else None
    leaves = [t for t in (x, w, b) if t is not None]
    want = F.conv2d(x, w, b, stride=stride)
    got = strided_conv2d(x, w, b, stride)
    torch.testing.assert_close(got, want, atol=1e-12, rtol=1e-12)
    g = torch.randn_like(want)
    for a, e in zip(torch.autograd.grad(got, leaves, g), torch.autograd.grad(want, leaves, g), strict=True):
        torch.testing.assert_close(a, e, atol=1e-12, rtol=1e-12)


def test_strided_conv2d_passes_gradcheck() -> None:
    x = torch.randn(2, 3, 9, 9, dtype=torch.float64, requires_grad=True)
    w = torch.randn(4, 3, 3, 3, dtype=torch.float64, requires_grad=True)
    b = torch.randn(4, dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradcheck(lambda *a: strided_conv2d(*a, 2), (x, w, b))


def test_strided_conv2d_rejects_a_non_square_kernel() -> None:
    with pytest.raises(ValueError, match=r"strided_conv2d needs a square kernel, got \(3, 5\)"):
        strided_conv2d(torch.randn(1, 2, 9, 9), torch.randn(4, 2, 3, 5), None, 2)


def test_bfloat16_weight_gradient_is_as_accurate_as_onednns() -> None:
    """The dilated-convolution weight gradient in bfloat16 errs no more than PyTorch's own bfloat16 backward."""
    torch.manual_seed(0)
    x = torch.rand(16, 32, 20, 20).bfloat16()
    w = (0.05 * torch.randn(24, 32, 9, 9)).bfloat16()
    grad = torch.randn(16, 24, 6, 6).bfloat16()
    exact = conv_weight_grad(x.double(), grad.double(), 9, 2)
    aten = torch.ops.aten.convolution_backward(
        grad, x, w, None, [2, 2], [0, 0], [1, 1], False, [0, 0], 1, [False, True, False]
    )[1]
    ours = conv_weight_grad(x, grad, 9, 2)
    assert ours.dtype == torch.bfloat16 and ours.shape == w.shape
    err_aten = (aten.double() - exact).abs().max().item()
    err_ours = (ours.double() - exact).abs().max().item()
    assert err_ours <= 1.5 * err_aten, (err_ours, err_aten)


def _plain(monkeypatch: pytest.MonkeyPatch) -> None:
    """Route the model through the plain autograd code (the implementation before the fused backward passes)."""
    monkeypatch.setattr(capsnet, "route_sabour_fused", lambda u, r, _squash: route_sabour(u, r))
    monkeypatch.setattr(capsnet.PrimaryCaps, "_conv", lambda self, x: self.conv(x))


def _training_step(net: CapsNet, x: torch.Tensor, y: torch.Tensor, amp: bool) -> dict[str, Any]:
    """Loss and parameter gradients of one training step, and the dtypes the capsule math ran in."""
    net.zero_grad(set_to_none=True)
    with torch.autocast(device_type="cpu", dtype=torch.bfloat16, enabled=amp):
        out = net(x, y)
    margin = margin_loss(out.lengths, y)
    loss = margin + 0.0005 * reconstruction_loss(out.reconstruction, x)
    loss.backward()
    grads = {name: p.grad.clone() for name, p in net.named_parameters() if p.grad is not None}
    dtypes = {"lengths": out.lengths.dtype, "poses": out.poses.dtype, "margin": margin.dtype, "loss": loss.dtype}
    return {"loss": loss.detach(), "grads": grads, "dtypes": dtypes}


@pytest.mark.parametrize(("amp", "tol"), [(False, 1e-5), (True, 2e-2)])
def test_training_step_matches_the_plain_implementation(monkeypatch: pytest.MonkeyPatch, amp: bool, tol: float) -> None:
    """Loss and every parameter gradient of a training step, fused backward passes vs the plain autograd code."""
    torch.manual_seed(0)
    net = CapsNet(CapsNetConfig.tiny()).train()
    x, y = torch.rand(6, 1, 28, 28), torch.randint(0, 10, (6,))
    got = _training_step(net, x, y, amp)
    with monkeypatch.context() as m:
        _plain(m)
        want = _training_step(net, x, y, amp)
    torch.testing.assert_close(got["loss"], want["loss"], atol=tol, rtol=tol)
    assert got["grads"].keys() == want["grads"].keys() == dict(net.named_parameters()).keys()
    for name, grad in got["grads"].items():
        scale = want["grads"][name].abs().max().item()
        torch.testing.assert_close(grad, want["grads"][name], atol=tol * scale, rtol=tol, msg=name)
    assert set(got["dtypes"].values()) == {torch.float32}


def test_amp_training_routes_squashes_and_measures_lengths_in_float32(monkeypatch: pytest.MonkeyPatch) -> None:
    """Under bfloat16 autocast the fused paths run: the convolution in bfloat16, routing on float32 û."""
    seen: dict[str, torch.dtype] = {}
    fused_route, fused_conv = capsnet.route_sabour_fused, capsnet.strided_conv2d

    def route_spy(u: torch.Tensor, r: int, sq: Any) -> tuple[torch.Tensor, torch.Tensor]:
        seen["u_hat"] = u.dtype
        v, c = fused_route(u, r, sq)
        seen["v"], seen["c"] = v.dtype, c.dtype
        return v, c

    def conv_spy(x: torch.Tensor, w: torch.Tensor, b: torch.Tensor | None, stride: int) -> torch.Tensor:
        seen["conv"] = x.dtype
        return fused_conv(x, w, b, stride)

    monkeypatch.setattr(capsnet, "route_sabour_fused", route_spy)
    monkeypatch.setattr(capsnet, "strided_conv2d", conv_spy)
    net = CapsNet(CapsNetConfig.tiny()).train()
    out = _training_step(net, torch.rand(4, 1, 28, 28), torch.randint(0, 10, (4,)), amp=True)
    assert seen == {"conv": torch.bfloat16, "u_hat": torch.float32, "v": torch.float32, "c": torch.float32}
    assert set(out["dtypes"].values()) == {torch.float32}
    assert all(g.dtype == torch.float32 for g in out["grads"].values())


def test_inference_and_float32_convolution_use_the_plain_code(monkeypatch: pytest.MonkeyPatch) -> None:
    """Eval mode or no gradients (inference, evaluation, export): the plain code; float32: the plain convolution."""

    def fail(*args: Any) -> Any:
        raise AssertionError("a fused training path ran")

    net = CapsNet(CapsNetConfig.tiny())
    x = torch.rand(2, 1, 28, 28)
    with monkeypatch.context() as m:
        m.setattr(capsnet, "route_sabour_fused", fail)
        m.setattr(capsnet, "strided_conv2d", fail)
        with torch.no_grad(), torch.autocast(device_type="cpu", dtype=torch.bfloat16):
            net.eval()(x)
        with torch.inference_mode():
            net(x)
        net.eval()(x).lengths.sum().backward()  # eval mode with gradients on, as torch.export traces
    with monkeypatch.context() as m:
        m.setattr(capsnet, "strided_conv2d", fail)
        net.train()(x, torch.tensor([1, 2])).lengths.sum().backward()

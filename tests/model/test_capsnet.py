"""CapsNet (Sabour et al. 2017): sizes, shapes, routing invariants, batch independence, learning."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from model.capsnet import CapsNet, capsule_length, count_parameters, route_normalized, route_sabour, squash
from model.config import CapsNetConfig
from model.losses import margin_loss, reconstruction_loss

VARIANTS = ["sabour", "normalized"]


def test_paper_parameter_counts() -> None:
    net = CapsNet(CapsNetConfig())
    assert net.cfg.num_primary == 1152
    assert count_parameters(net) == 8_215_568
    assert net.decoder is not None
    assert count_parameters(net) - count_parameters(net.decoder) == 6_804_224


@pytest.mark.parametrize("variant", VARIANTS)
@pytest.mark.parametrize("batch", [1, 7])
def test_output_shapes(variant: str, batch: int) -> None:
    cfg = CapsNetConfig.tiny(routing=variant)
    out = CapsNet(cfg).eval()(torch.rand(batch, 1, 28, 28))
    assert out.lengths.shape == (batch, 10)
    assert out.poses.shape == (batch, 10, cfg.digit_dim)
    assert out.reconstruction.shape == (batch, 784)
    assert torch.all((out.lengths >= 0) & (out.lengths < 1))


def test_squash_keeps_direction_and_bounds_length() -> None:
    s = torch.tensor([[3.0, 4.0], [0.0, 0.0], [1e-3, 0.0]])
    v = squash(s)
    assert torch.allclose(capsule_length(v)[0], torch.tensor(25.0 / 26.0 * 1.0), atol=1e-5)  # |s|^2/(1+|s|^2)
    assert torch.allclose(v[0] / v[0].norm(), s[0] / s[0].norm())
    assert torch.isfinite(v).all() and v[1].abs().sum() == 0


@pytest.mark.parametrize("route", [route_sabour, route_normalized])
@pytest.mark.parametrize("iterations", [1, 3])
def test_coupling_coefficients_sum_to_one_over_classes(route, iterations: int) -> None:  # type: ignore[no-untyped-def]
    u_hat = torch.randn(3, 10, 20, 8)  # class-major: (B, N_out, N_in, D)
    v, c = route(u_hat, iterations)
    assert v.shape == (3, 10, 8) and c.shape == (3, 20, 10)
    assert torch.allclose(c.sum(dim=2), torch.ones(3, 20), atol=1e-6)


@pytest.mark.parametrize("iterations", [1, 3])
def test_sabour_routing_matches_procedure_1_written_out(iterations: int) -> None:
    """The batched-matmul routing equals Procedure 1 written with explicit sums over (B, N_in, N_out, D)."""
    torch.manual_seed(1)
    u = torch.randn(2, 30, 10, 16)  # input-major û_j|i, as in the paper's indices
    b = torch.zeros(2, 30, 10)
    for r in range(iterations):
        c = F.softmax(b, dim=2)
        v = squash((c.unsqueeze(-1) * u).sum(dim=1))
        if r < iterations - 1:
            b = b + (u * v.unsqueeze(1)).sum(dim=-1)
    got_v, got_c = route_sabour(u.transpose(1, 2).contiguous(), iterations)
    torch.testing.assert_close(got_v, v, atol=1e-6, rtol=1e-5)
    torch.testing.assert_close(got_c, c, atol=1e-6, rtol=1e-5)


def test_normalized_routing_matches_its_definition_written_out() -> None:
    torch.manual_seed(2)
    u = torch.randn(2, 30, 10, 16)  # input-major û_j|i
    v = u.mean(dim=1)
    for _ in range(3):
        direction = v / v.norm(dim=-1, keepdim=True)
        c = F.softmax((u * direction.unsqueeze(1)).sum(dim=-1), dim=2)  # the current agreement, not accumulated
        v = (c.unsqueeze(-1) * u).sum(dim=1)
    got_v, got_c = route_normalized(u.transpose(1, 2).contiguous(), 3)
    torch.testing.assert_close(got_v, squash(v), atol=1e-6, rtol=1e-5)
    torch.testing.assert_close(got_c, c, atol=1e-6, rtol=1e-5)


def test_sabour_routing_moves_coupling_towards_agreeing_class() -> None:
    torch.manual_seed(0)
    u_hat = 0.01 * torch.randn(1, 3, 50, 4)  # (B, N_out, N_in, D)
    u_hat[:, 1, :, :] = torch.tensor([0.5, 0.0, 0.0, 0.0])  # every input agrees on class 1
    _, c1 = route_sabour(u_hat, 1)
    _, c3 = route_sabour(u_hat, 3)
    assert torch.allclose(c1, torch.full_like(c1, 1 / 3))  # first iteration: uniform
    assert (c3[0, :, 1] > 0.5).all()


@pytest.mark.parametrize("variant", VARIANTS)
def test_sample_outputs_do_not_depend_on_the_rest_of_the_batch(variant: str) -> None:
    torch.manual_seed(0)
    net = CapsNet(CapsNetConfig.tiny(routing=variant)).eval()
    x = torch.rand(5, 1, 28, 28)
    y = x.clone()
    y[1:] = torch.rand(4, 1, 28, 28)  # change every other sample
    with torch.no_grad():
        a, b, single = net(x), net(y), net(x[:1])
    for field in ("lengths", "poses", "reconstruction"):
        assert torch.allclose(getattr(a, field)[0], getattr(b, field)[0], atol=1e-6), field
        assert torch.allclose(getattr(a, field)[0], getattr(single, field)[0], atol=1e-6), field


def test_masking_uses_labels_in_training_and_longest_capsule_at_inference() -> None:
    torch.manual_seed(0)
    net = CapsNet(CapsNetConfig.tiny()).eval()
    with torch.no_grad():
        net.digit.weight.mul_(100)  # random init gives near-zero poses; make them visible to the decoder
    x = torch.rand(4, 1, 28, 28)
    with torch.no_grad():
        out = net(x)
        predicted = out.lengths.argmax(dim=1)
        assert torch.allclose(out.reconstruction, net.decode_class(out.poses, predicted))
        other = (predicted + 1) % 10
        assert torch.allclose(net(x, other).reconstruction, net.decode_class(out.poses, other))
        assert not torch.allclose(net(x, other).reconstruction, out.reconstruction)


def test_decoder_runs_on_caller_supplied_poses() -> None:
    net = CapsNet(CapsNetConfig.tiny()).eval()
    poses = torch.zeros(2, 10, net.cfg.digit_dim)
    mask = torch.zeros(2, 10)
    mask[:, 3] = 1
    with torch.no_grad():
        blank = net.decode(poses, mask)
        poses[:, 3, 0] = 0.25
        edited = net.decode(poses, mask)
    assert blank.shape == (2, 784)
    assert not torch.allclose(blank, edited)


def test_config_validation_and_round_trip() -> None:
    cfg = CapsNetConfig.tiny(routing="normalized", routing_iterations=2)
    assert CapsNetConfig.from_dict(cfg.to_dict()) == cfg
    with pytest.raises(ValueError, match="routing must be one of"):
        CapsNetConfig(routing="bogus")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="routing_iterations"):
        CapsNetConfig(routing_iterations=0)
    with pytest.raises(ValueError, match="too small"):
        CapsNetConfig(image_size=12)


def test_model_without_decoder() -> None:
    net = CapsNet(CapsNetConfig.tiny(use_decoder=False)).eval()
    out = net(torch.rand(2, 1, 28, 28))
    assert out.reconstruction.abs().sum() == 0
    with pytest.raises(RuntimeError, match="no decoder"):
        net.decode(out.poses, torch.ones(2, 10))


def test_margin_loss_matches_equation_4() -> None:
    lengths = torch.tensor([[0.95, 0.05, 0.5], [0.2, 0.3, 0.0]])
    labels = torch.tensor([0, 1])
    # sample 0: present ok (0.95 > 0.9), absent 0.05 ok, absent 0.5 -> 0.5 * 0.4^2 = 0.08
    # sample 1: present 0.3 -> 0.6^2 = 0.36; absent 0.2 -> 0.5 * 0.1^2 = 0.005
    expected = (0.08 + 0.36 + 0.005) / 2
    assert margin_loss(lengths, labels).item() == pytest.approx(expected, rel=1e-6)


def test_reconstruction_loss_is_sum_of_squares_per_image() -> None:
    recon = torch.zeros(2, 4)
    images = torch.ones(2, 1, 2, 2)
    assert reconstruction_loss(recon, images).item() == pytest.approx(4.0)


@pytest.mark.parametrize("variant", VARIANTS)
def test_both_variants_learn(variant: str) -> None:
    from tests.conftest import synthetic_digits

    torch.manual_seed(0)
    images, labels = synthetic_digits(64, seed=3)
    x = torch.from_numpy(images).float().unsqueeze(1) / 255.0
    y = torch.from_numpy(labels).long()
    net = CapsNet(CapsNetConfig.tiny(routing=variant))
    opt = torch.optim.Adam(net.parameters(), lr=3e-3)
    losses = []
    for _ in range(20):
        out = net(x, y)
        loss = margin_loss(out.lengths, y) + 0.0005 * reconstruction_loss(out.reconstruction, x)
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.item())
    assert losses[-1] < 0.6 * losses[0], losses


def test_bfloat16_autocast_runs_the_convolutions_only() -> None:
    """Mixed precision speeds up the convolutions; poses, lengths and reconstructions stay float32 and close."""
    torch.manual_seed(0)
    net = CapsNet(CapsNetConfig.tiny()).eval()
    x = torch.rand(4, 1, 28, 28)
    with torch.no_grad():
        ref = net(x)
        with torch.autocast(device_type="cpu", dtype=torch.bfloat16):
            mixed = net(x)
            h = net.conv1(x)
    assert h.dtype == torch.bfloat16  # the autocast really was on for the convolution
    for name in ("lengths", "poses", "reconstruction"):
        value = getattr(mixed, name)
        assert value.dtype == torch.float32, name
        torch.testing.assert_close(value, getattr(ref, name), atol=0.05, rtol=0.05)

"""The routing map (CapsNet's explanation output) against a straightforward loop over the primary capsules."""

from __future__ import annotations

import torch

from model.capsnet import CapsNet, routing_map
from model.config import CapsNetConfig


def loop_routing_map(c: torch.Tensor, u_hat: torch.Tensor, cfg: CapsNetConfig) -> torch.Tensor:
    """map[b, j, r, col] = Σ_t c[b, i, j] * |u_hat[b, j, i]| with i = (t, r, col) in PrimaryCaps' order."""
    g = cfg.primary_grid
    out = torch.zeros(c.shape[0], cfg.num_classes, g, g, dtype=torch.float64)
    for b in range(c.shape[0]):
        for j in range(cfg.num_classes):
            for t in range(cfg.primary_types):
                for r in range(g):
                    for col in range(g):
                        i = t * g * g + r * g + col
                        out[b, j, r, col] += float(c[b, i, j]) * float(torch.linalg.norm(u_hat[b, j, i]))
    return out


def test_routing_map_matches_a_loop_over_primary_capsules() -> None:
    torch.manual_seed(0)
    cfg = CapsNetConfig.tiny()
    model = CapsNet(cfg).eval()
    x = torch.rand(3, 1, cfg.image_size, cfg.image_size)
    with torch.no_grad():
        _, c, u_hat = model._encode_with_votes(x)
        got = routing_map(c, u_hat, cfg)
    assert got.shape == (3, cfg.num_classes, cfg.primary_grid, cfg.primary_grid)
    torch.testing.assert_close(got.double(), loop_routing_map(c, u_hat, cfg), atol=1e-5, rtol=1e-5)


def test_explain_returns_the_forward_outputs_and_its_map() -> None:
    torch.manual_seed(1)
    cfg = CapsNetConfig.tiny()
    model = CapsNet(cfg).eval()
    x = torch.rand(4, 1, cfg.image_size, cfg.image_size)
    with torch.no_grad():
        plain = model(x)
        out, explanation = model.explain(x)
        _, c, u_hat = model._encode_with_votes(x)
    for a, b in zip(plain, out, strict=True):
        torch.testing.assert_close(a, b)
    torch.testing.assert_close(explanation, routing_map(c, u_hat, cfg))
    # the couplings of each primary capsule sum to 1 over the classes, so the classes share its vote length
    total = explanation.sum(dim=1)  # (B, G, G)
    lengths = torch.sqrt((u_hat * u_hat).sum(-1))  # (B, K, N_in)
    assert torch.all(total > 0) and torch.all(total <= lengths.max(dim=1).values.sum() + 1e-5)


def test_explain_is_batch_independent() -> None:
    torch.manual_seed(2)
    cfg = CapsNetConfig.tiny()
    model = CapsNet(cfg).eval()
    x = torch.rand(5, 1, cfg.image_size, cfg.image_size)
    with torch.no_grad():
        _, batch = model.explain(x)
        _, alone = model.explain(x[2:3])
    torch.testing.assert_close(batch[2:3], alone, atol=1e-6, rtol=1e-5)


def test_receptive_field_follows_the_config() -> None:
    assert CapsNetConfig().primary_receptive_field == (17, 2)
    cfg = CapsNetConfig(conv1_kernel=5, primary_kernel=3, primary_stride=1)
    assert cfg.primary_receptive_field == (7, 1)
    size, stride = CapsNetConfig().primary_receptive_field
    assert (CapsNetConfig().primary_grid - 1) * stride + size == CapsNetConfig().image_size - 1

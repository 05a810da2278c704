"""Matrix capsules with EM routing (Hinton et al. 2018): sizes, routing invariants, stability, loss, export."""

from __future__ import annotations

import math
from pathlib import Path
from unittest import mock

import numpy as np
import onnx
import onnxruntime as ort
import pytest
import torch

import model.em as em_module
from model.capsnet import count_parameters
from model.config import EMCapsNetConfig
from model.em import WORKSPACE, EMCapsNet, Workspace, em_layer, em_routing, receptive_field_centres
from model.em_routing import RoutingGeometry, inverse_temperatures, kron_weight, votes_plain
from model.losses import spread_loss, spread_margin
from training.data.mnist import load_split, to_float
from training.fitting import train
from training.fitting.architectures import get_architecture

from . import em_reference

EDGE_IMAGES = {
    "zeros": torch.zeros(3, 1, 28, 28),
    "saturated": torch.ones(3, 1, 28, 28),
    "noise": torch.rand(3, 1, 28, 28, generator=torch.Generator().manual_seed(0)),
}


def tiny_net(seed: int = 0, **overrides: object) -> EMCapsNet:
    torch.manual_seed(seed)
    return EMCapsNet(EMCapsNetConfig.tiny(**overrides))


def test_paper_config_sizes_and_parameter_count() -> None:
    cfg = EMCapsNetConfig()
    assert (cfg.primary_grid, cfg.caps1_grid, cfg.caps2_grid) == (14, 6, 4)
    # Conv1 832 + PrimaryCaps 16,896 + 1,056 + ConvCaps1/2 147,456 + 64 each + ClassCaps 5,120 + 20
    assert count_parameters(EMCapsNet(cfg)) == 318_964


def test_small_preset_is_the_papers_smaller_network() -> None:
    cfg = EMCapsNetConfig.small()
    assert (cfg.conv1_channels, cfg.primary_types, cfg.caps1_types, cfg.caps2_types) == (64, 8, 16, 16)
    assert count_parameters(EMCapsNet(cfg)) == 68_444  # "68K" in Hinton et al. 2018 §5
    assert get_architecture("em").make_config("small", {}) == cfg.to_dict()
    with pytest.raises(ValueError, match="unknown preset 'small' for arch 'dynamic'"):
        get_architecture("dynamic").make_config("small", {})


def test_training_recipe_defaults() -> None:
    """Two routing iterations and Adam at 0.01: the setting under which the small preset learns MNIST in one epoch."""
    assert EMCapsNetConfig().routing_iterations == EMCapsNetConfig.small().routing_iterations == 2
    assert EMCapsNetConfig.small(routing_iterations=3).routing_iterations == 3  # the paper's count stays available
    assert get_architecture("em").default_lr == 0.01
    assert get_architecture("dynamic").default_lr == get_architecture("baseline").default_lr == 0.001


def test_config_round_trips_and_validates() -> None:
    cfg = EMCapsNetConfig.tiny(routing_iterations=3)
    assert EMCapsNetConfig.from_dict(cfg.to_dict()) == cfg
    with pytest.raises(ValueError, match="routing_iterations"):
        EMCapsNetConfig(routing_iterations=0)
    with pytest.raises(ValueError, match="too small"):
        EMCapsNetConfig(image_size=8)


@pytest.mark.parametrize("batch", [1, 7])
def test_output_shapes_and_ranges(batch: int) -> None:
    out = tiny_net().eval()(torch.rand(batch, 1, 28, 28))
    assert out.activations.shape == (batch, 10)
    assert out.poses.shape == (batch, 10, 4, 4)
    assert torch.all((out.activations > 0) & (out.activations < 1))


def test_one_routing_iteration_is_a_single_m_step() -> None:
    out = tiny_net(routing_iterations=1).eval()(torch.rand(2, 1, 28, 28))
    assert out.activations.shape == (2, 10) and torch.isfinite(out.poses).all()


def test_batch_independence() -> None:
    net = tiny_net().eval()
    x = torch.rand(5, 1, 28, 28)
    y = x.clone()
    y[1:] = torch.rand(4, 1, 28, 28)
    with torch.no_grad():
        a, b, alone = net(x), net(y), net(x[:1])
    for got in (b, alone):  # float32 summation order may differ with the batch size, nothing more
        torch.testing.assert_close(got.activations[0], a.activations[0], atol=1e-5, rtol=1e-4)
        torch.testing.assert_close(got.poses[0], a.poses[0], atol=1e-5, rtol=1e-4)
    assert (b.activations[1:] - a.activations[1:]).abs().max() > 1e-3  # the other samples did change


@pytest.mark.parametrize("name", list(EDGE_IMAGES))
def test_forward_and_backward_are_finite_on_edge_images(name: str) -> None:
    net = tiny_net().train()
    x = EDGE_IMAGES[name].clone().requires_grad_(True)
    out = net(x)
    assert torch.isfinite(out.activations).all() and torch.isfinite(out.poses).all()
    loss = spread_loss(out.activations, torch.tensor([0, 3, 9]), 0.9) + out.poses.square().mean()
    loss.backward()
    assert x.grad is not None and torch.isfinite(x.grad).all()
    for pname, p in net.named_parameters():
        assert p.grad is not None and torch.isfinite(p.grad).all(), pname


def test_extreme_weights_stay_finite() -> None:
    """Huge poses drive σ² and the cost far out of range; the floors and the logit bound keep it finite."""
    net = tiny_net()
    with torch.no_grad():
        net.primary.pose.weight.mul_(1e4)
        net.caps1.beta_a.fill_(1e6)
    out = net(EDGE_IMAGES["noise"])
    out.activations.sum().backward()
    assert torch.isfinite(out.activations).all() and torch.isfinite(out.poses).all()
    assert all(torch.isfinite(p.grad).all() for p in net.parameters() if p.grad is not None)


def test_votes_are_the_matrix_product_of_pose_and_weight() -> None:
    m, w, coords = torch.randn(2, 3, 20, 16), torch.randn(6, 20, 4, 4), torch.randn(20, 16)
    expected = torch.einsum("bpnxy,cnyz->bpcnxz", m.reshape(2, 3, 20, 4, 4), w).reshape(2, 3, 6, 20, 16)
    torch.testing.assert_close(votes_plain(m, w, None), expected)
    torch.testing.assert_close(votes_plain(m, w, coords), expected + coords)
    wk = kron_weight(w).view(20, 4, 4, 6, 4, 4)  # (N, x, y, C, x', z): W where x = x', else 0
    torch.testing.assert_close(wk[:, 1, :, :, 1].permute(2, 0, 1, 3), w)
    assert wk[:, 0, :, :, 1].abs().sum() == 0


def test_convolution_geometry_windows_and_overlaps() -> None:
    geo = RoutingGeometry.convolution(grid=5, kernel=3, stride=2, child_types=2, parent_types=4)
    assert geo.window_index.view(4, 9)[3].tolist() == [12, 13, 14, 17, 18, 19, 22, 23, 24]  # bottom-right window
    # the centre child (2, 2) is in all four windows, a corner child in one: R starts at 1 / (covers * parents)
    init = geo.init_assignment  # (P_out, KK)
    assert init[0, 8].item() == pytest.approx(1 / 16) and init[0, 0].item() == pytest.approx(1 / 4)
    assert geo.mass_per_parent == pytest.approx(25 * 2 / (4 * 4))


@pytest.mark.parametrize("grid,kernel,stride", [(5, 3, 2), (6, 3, 1), (14, 3, 2)])
def test_e_step_assignments_sum_to_one_over_every_parent_of_a_child(grid: int, kernel: int, stride: int) -> None:
    child_types, parent_types = 3, 4
    geo = RoutingGeometry.convolution(grid, kernel, stride, child_types, parent_types)
    p_out, kk = geo.num_positions_out, geo.kernel_entries
    logits = 30 * torch.randn(2, p_out, parent_types, kk * child_types)
    r = geo.normalise(logits)  # (B, P_out, C, KK*B_in)
    per_entry = r.sum(dim=2).reshape(2, p_out * kk, child_types)  # summed over parent types
    per_child = torch.zeros(2, grid * grid, child_types).index_add_(1, geo.window_index, per_entry)
    covered = torch.zeros(grid * grid, dtype=torch.bool)
    covered[geo.window_index] = True
    torch.testing.assert_close(per_child[:, covered], torch.ones(2, int(covered.sum()), child_types))
    # the initial assignment has the same property
    init = geo.init_assignment.reshape(1, p_out * kk, 1).expand(1, -1, child_types) * parent_types
    start = torch.zeros(1, grid * grid, child_types).index_add_(1, geo.window_index, init)
    torch.testing.assert_close(start[:, covered], torch.ones(1, int(covered.sum()), child_types))


def reference_em(
    votes: torch.Tensor, a: torch.Tensor, beta_u: torch.Tensor, beta_a: torch.Tensor, cfg: EMCapsNetConfig
) -> tuple[torch.Tensor, torch.Tensor]:
    """Procedure 1 transcribed directly (one sample, every child sees every parent, probabilities not logs).

    votes (N, C, H), a (N,) -> activations (C,) and means (C, H). Mass normalisation and the mean over h
    as documented in docs/em-routing.md.
    """
    n, c, _ = votes.shape
    r = torch.full((n, c), 1.0 / c, dtype=votes.dtype)
    lambdas = inverse_temperatures(cfg.routing_iterations, cfg.final_inverse_temperature)
    for t, lam in enumerate(lambdas):
        a_out, mus, variances = [], [], []
        for j in range(c):  # M-step, one parent at a time
            rj = r[:, j] * a
            mu = (rj[:, None] * votes[:, j]).sum(0) / (rj.sum() + 1e-6)
            var = (rj[:, None] * (votes[:, j] - mu) ** 2).sum(0) / (rj.sum() + 1e-6) + cfg.variance_floor
            cost = rj.sum() / (n / c) * (beta_u[j] + 0.5 * var.log().mean())
            a_out.append(torch.sigmoid((lam * (beta_a[j] - cost)).clamp(-cfg.max_logit, cfg.max_logit)))
            mus.append(mu)
            variances.append(var)
        if t == len(lambdas) - 1:
            break
        for i in range(n):  # E-step, one child at a time
            p = torch.stack(
                [
                    torch.exp(-((votes[i, j] - mus[j]) ** 2 / (2 * variances[j])).sum())
                    / torch.sqrt(torch.prod(2 * math.pi * variances[j]))
                    for j in range(c)
                ]
            )
            ap = torch.stack(a_out) * p
            r[i] = ap / ap.sum()
    return torch.stack(a_out), torch.stack(mus)


@pytest.mark.parametrize("iterations", [1, 3])
def test_routing_matches_a_direct_transcription_of_procedure_1(iterations: int) -> None:
    torch.manual_seed(0)
    cfg = EMCapsNetConfig.tiny(routing_iterations=iterations, final_inverse_temperature=3.0)
    n, c = 12, 5
    votes = 0.3 * torch.randn(n, c, 16, dtype=torch.float64)
    votes[:6, 2] = votes[0, 2] + 0.01 * torch.randn(6, 16, dtype=torch.float64)  # half the children agree on 2
    a = torch.rand(n, dtype=torch.float64)
    beta_u, beta_a = torch.randn(c, dtype=torch.float64), torch.randn(c, dtype=torch.float64)
    geometry = RoutingGeometry.dense(child_positions=n, child_types=1, parent_types=c)
    v = votes.transpose(0, 1).reshape(1, 1, c, n, 16)
    got_a, got_mu = em_routing(v, a[None, None], beta_u, beta_a, geometry, cfg)
    want_a, want_mu = reference_em(votes, a, beta_u, beta_a, cfg)
    torch.testing.assert_close(got_a[0, 0], want_a)
    torch.testing.assert_close(got_mu[0, 0], want_mu)
    if iterations == 3:
        assert want_a.argmax() == 2


def test_inverse_temperature_grows_to_its_final_value() -> None:
    lambdas = inverse_temperatures(3, 1.0)
    assert lambdas == sorted(lambdas) and lambdas[-1] == pytest.approx(1.0)
    assert lambdas[0] == pytest.approx(0.05 / (1 - 0.95**3))
    assert inverse_temperatures(1, 2.0) == [pytest.approx(2.0)]


def test_receptive_field_centres_of_the_paper_grid() -> None:
    # ConvCaps2 position k sees Conv1 rows centred on input pixel 4k + 6 (28x28, Conv1 padded by 2)
    expected = torch.tensor([(4 * k + 6 + 0.5) / 28 for k in range(4)])
    torch.testing.assert_close(receptive_field_centres(EMCapsNetConfig()), expected)


def test_coordinate_addition_moves_the_right_column_of_class_votes() -> None:
    # With one iteration the routing weights do not depend on the votes, so the class poses (the weighted
    # mean of the votes) differ only where the coordinates were added: V[0, 3] and V[1, 3].
    with_ca, without = (
        tiny_net(seed=1, routing_iterations=1),
        tiny_net(seed=1, routing_iterations=1, coordinate_addition=False),
    )
    x = torch.rand(2, 1, 28, 28)
    with torch.no_grad():
        a, b = with_ca(x), without(x)
    diff = (a.poses - b.poses).abs().amax(dim=(0, 1))  # (4, 4)
    assert diff[0, 3] > 1e-3 and diff[1, 3] > 1e-3
    assert torch.all(diff[2:] == 0) and torch.all(diff[:, :3] == 0)


def test_spread_loss_on_a_hand_computed_example() -> None:
    a = torch.tensor([[0.9, 0.2, 0.85], [0.1, 0.5, 0.3]])
    labels = torch.tensor([0, 2])
    # sample 0: max(0, .2 - .7)^2 + max(0, .2 - .05)^2 = 0.0225; sample 1: max(0, .2 - .2)^2 + (.2 + .2)^2 = 0.16
    assert spread_loss(a, labels, 0.2).item() == pytest.approx((0.0225 + 0.16) / 2)
    assert spread_loss(a, labels, 0.0).item() == pytest.approx(0.04 / 2)  # only a_i > a_t is penalised
    assert spread_loss(torch.full((1, 10), 0.5), torch.tensor([4]), 0.9).item() == pytest.approx(9 * 0.81)


def test_margin_schedule_endpoints_and_shape() -> None:
    assert spread_margin(0.0) == pytest.approx(0.2)
    assert spread_margin(0.25) == pytest.approx(0.55)
    assert spread_margin(0.5) == pytest.approx(0.9) and spread_margin(1.0) == pytest.approx(0.9)
    arch = get_architecture("em")
    out = tiny_net()(torch.rand(2, 1, 28, 28))
    labels = torch.tensor([1, 2])
    start, end = arch.loss(out, torch.zeros(0), labels, 0.0), arch.loss(out, torch.zeros(0), labels, 1.0)
    assert start.parts["spread_margin"].item() == pytest.approx(0.2)
    assert end.parts["spread_margin"].item() == pytest.approx(0.9)
    assert start.total.item() == pytest.approx(spread_loss(out.activations, labels, 0.2).item())


def test_arch_table_entry() -> None:
    arch = get_architecture("em")
    cfg = arch.make_config("tiny", {"routing_iterations": 2, "routing": None})
    assert cfg == EMCapsNetConfig.tiny(routing_iterations=2).to_dict()
    assert arch.make_config("paper", {}) == EMCapsNetConfig().to_dict()
    with pytest.raises(ValueError, match="applies to --arch dynamic only"):
        arch.make_config("tiny", {"routing": "sabour"})
    net = arch.build(cfg)
    assert isinstance(net, EMCapsNet) and net.cfg.routing_iterations == 2


@pytest.mark.slow
def test_loss_falls_on_a_small_synthetic_subset(synthetic_mnist: Path) -> None:
    split = load_split(synthetic_mnist, "train").subset(32)
    images, labels = torch.from_numpy(to_float(split.images)), torch.from_numpy(split.labels)
    arch = get_architecture("em")
    net = tiny_net().train()  # the default routing iterations and learning rate: the training recipe
    opt = torch.optim.Adam(net.parameters(), lr=arch.default_lr)
    losses = []
    for _ in range(20):
        loss = arch.loss(arch.forward(net, images, labels), images, labels, 1.0).total
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.item())
    assert all(math.isfinite(v) for v in losses)
    assert np.mean(losses[-5:]) < 0.8 * losses[0], losses


def test_cli_dry_run(synthetic_mnist: Path, tmp_path: Path) -> None:
    out = tmp_path / "run"
    args = ["--arch", "em", "--preset", "tiny", "--dry-run", "--data-dir", str(synthetic_mnist), "--out", str(out)]
    assert train.main(args) == 0
    assert not out.exists()


def test_cli_rejects_a_routing_variant(synthetic_mnist: Path, capsys: pytest.CaptureFixture[str]) -> None:
    args = ["--arch", "em", "--preset", "tiny", "--dry-run", "--data-dir", str(synthetic_mnist), "--routing", "sabour"]
    assert train.main(args) == 2
    assert "--routing sabour applies to --arch dynamic only" in capsys.readouterr().err


def export_and_compare(tmp_path: Path, dynamo: bool) -> None:
    """Export the tiny model (opset 18, dynamic batch), then compare ONNX Runtime with PyTorch."""
    net = tiny_net().eval()
    path = tmp_path / "em.onnx"
    names = {"input_names": ["image"], "output_names": ["activations", "poses", "parts"], "opset_version": 18}
    if dynamo:
        shapes = {"x": {0: torch.export.Dim("batch")}}
        torch.onnx.export(net, (torch.rand(2, 1, 28, 28),), path, dynamo=True, dynamic_shapes=shapes, **names)
    else:
        axes = {"image": {0: "N"}, "activations": {0: "N"}, "poses": {0: "N"}, "parts": {0: "N"}}
        torch.onnx.export(net, (torch.rand(2, 1, 28, 28),), path, dynamo=False, dynamic_axes=axes, **names)
    proto = onnx.load(str(path))
    onnx.checker.check_model(proto)
    assert not {"Loop", "If", "Scan"} & {node.op_type for node in proto.graph.node}
    assert proto.graph.input[0].type.tensor_type.shape.dim[0].dim_param  # a dynamic batch axis
    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    cases = {"batch_1": torch.rand(1, 1, 28, 28), "batch_7": torch.rand(7, 1, 28, 28), **EDGE_IMAGES}
    for case, x in cases.items():
        activations, poses, parts = session.run(None, {"image": x.numpy()})
        assert np.isfinite(activations).all() and np.isfinite(poses).all() and np.isfinite(parts).all(), case
        with torch.no_grad():
            ref = net(x)
        np.testing.assert_allclose(activations, ref.activations.numpy(), atol=1e-4, rtol=0, err_msg=case)
        np.testing.assert_allclose(poses, ref.poses.numpy(), atol=1e-4, rtol=0, err_msg=case)
        np.testing.assert_allclose(parts, ref.parts.numpy(), atol=1e-4, rtol=0, err_msg=case)


def test_onnx_export_torchscript_exporter_matches_pytorch(tmp_path: Path) -> None:
    export_and_compare(tmp_path, dynamo=False)


@pytest.mark.slow
def test_onnx_export_dynamo_exporter_matches_pytorch(tmp_path: Path) -> None:
    export_and_compare(tmp_path, dynamo=True)


ROUTING_CASES = {  # name: (geometry, child positions, child types, parent types, coordinate addition)
    "conv_stride2": (lambda: RoutingGeometry.convolution(5, 3, 2, 3, 4), 25, 3, 4, False),
    "conv_stride1": (lambda: RoutingGeometry.convolution(4, 3, 1, 2, 3), 16, 2, 3, False),
    "dense": (lambda: RoutingGeometry.dense(6, 2, 5), 6, 2, 5, True),
}


def layer_inputs(case: str, seed: int = 0) -> tuple[RoutingGeometry, int, torch.Tensor | None, list[torch.Tensor]]:
    """Float64 child poses per window, W, activations and β's for a tiny geometry, plus the coordinates."""
    make, positions, child_types, parent_types, coordinate_addition = ROUTING_CASES[case]
    geometry = make()
    g = torch.Generator().manual_seed(seed)
    p, n = geometry.num_positions_out, geometry.kernel_entries * child_types
    poses = 0.7 * torch.randn(2, p, n, 16, generator=g, dtype=torch.float64)
    weight = torch.randn(parent_types, n, 4, 4, generator=g, dtype=torch.float64)
    a = torch.rand(2, p, n, generator=g, dtype=torch.float64)
    betas = [torch.randn(parent_types, generator=g, dtype=torch.float64) for _ in range(2)]
    coords = torch.rand(n, 16, generator=g, dtype=torch.float64) if coordinate_addition else None
    return geometry, positions, coords, [t.requires_grad_(True) for t in (poses, weight, a, *betas)]


def outputs_and_grads(fn: object, inputs: list[torch.Tensor]) -> list[torch.Tensor]:
    """The layer's outputs and the gradients of a loss that uses both outputs, for every input."""
    a_out, mu = fn(*inputs)  # type: ignore[operator]
    loss = (a_out * torch.linspace(-1, 1, a_out.numel(), dtype=a_out.dtype).view_as(a_out)).sum() + mu.sin().sum()
    return [a_out, mu, *torch.autograd.grad(loss, inputs)]


@pytest.mark.parametrize("iterations", [1, 2, 3])
@pytest.mark.parametrize("case", list(ROUTING_CASES))
def test_fast_layer_matches_the_straightforward_reference(case: str, iterations: int) -> None:
    """Outputs and gradients (poses, W, activations, β_u, β_a) of every fast path equal the reference's."""
    cfg = EMCapsNetConfig.tiny(routing_iterations=iterations)
    geometry, positions, coords, inputs = layer_inputs(case)

    def reference(m: torch.Tensor, w: torch.Tensor, a: torch.Tensor, bu: torch.Tensor, ba: torch.Tensor) -> object:
        b, p, n, _ = m.shape
        votes = torch.einsum("bpnxy,cnyz->bpcnxz", m.reshape(b, p, n, 4, 4), w).reshape(b, p, w.shape[0], n, 16)
        votes = votes if coords is None else votes + coords
        return em_reference.em_routing(votes, a, bu, ba, geometry, cfg, positions)

    def fused(m: torch.Tensor, w: torch.Tensor, a: torch.Tensor, bu: torch.Tensor, ba: torch.Tensor) -> object:
        return em_layer(m, w, a, bu, ba, coords, geometry, cfg)  # inputs need a gradient: FusedEMLayer

    def plain(m: torch.Tensor, w: torch.Tensor, a: torch.Tensor, bu: torch.Tensor, ba: torch.Tensor) -> object:
        return em_routing(votes_plain(m, w, coords), a, bu, ba, geometry, cfg)  # what export and compile run

    def fused_per_image(
        m: torch.Tensor, w: torch.Tensor, a: torch.Tensor, bu: torch.Tensor, ba: torch.Tensor
    ) -> object:
        with mock.patch.object(em_module, "ROUTING_CHUNK_VOTES", 1):  # the routing in chunks of one image
            return fused(m, w, a, bu, ba)

    want = outputs_and_grads(reference, inputs)
    names = ["a", "mu", "dposes", "dW", "da", "dbu", "dba"]
    for fn in (fused, fused_per_image, plain):
        for got, expected, name in zip(outputs_and_grads(fn, inputs), want, names, strict=True):
            label = f"{fn.__name__} {name}"
            torch.testing.assert_close(got, expected, rtol=1e-9, atol=1e-10, msg=lambda m, label=label: f"{label}: {m}")
    with torch.no_grad(), mock.patch.object(em_module, "INFERENCE_CHUNK_VOTES", 1):  # eager inference, 1 image a chunk
        a_out, mu = em_layer(*inputs[:2], *inputs[2:], coords, geometry, cfg)
    torch.testing.assert_close(a_out, want[0], rtol=1e-9, atol=1e-10)
    torch.testing.assert_close(mu, want[1], rtol=1e-9, atol=1e-10)


def test_fused_layer_is_used_in_training_and_not_at_inference() -> None:
    geometry, _, _, inputs = layer_inputs("conv_stride2")
    cfg = EMCapsNetConfig.tiny()
    a_out, _ = em_layer(*inputs, None, geometry, cfg)
    assert type(a_out.grad_fn).__name__ == "FusedEMLayerBackward"
    with torch.no_grad():
        assert em_layer(*inputs, None, geometry, cfg)[0].grad_fn is None


def test_fused_layer_survives_interleaved_forwards_and_refuses_a_second_backward() -> None:
    """Vote buffers are lent per call: a second forward before the first backward must not corrupt it."""
    geometry, _, _, inputs = layer_inputs("conv_stride1")
    cfg = EMCapsNetConfig.tiny()
    want = outputs_and_grads(lambda *t: em_layer(*t, None, geometry, cfg), inputs)
    first = em_layer(*inputs, None, geometry, cfg)
    other = [t.detach().mul(1.5).requires_grad_(True) for t in inputs]
    second = em_layer(*other, None, geometry, cfg)
    got = outputs_and_grads(lambda *t: first, inputs)
    for g, w in zip(got, want, strict=True):
        torch.testing.assert_close(g, w, rtol=1e-9, atol=1e-10)
    loss = second[0].sum() + second[1].sum()
    loss.backward(retain_graph=True)
    with pytest.raises(RuntimeError, match="backward through the same EM layer call twice"):
        loss.backward()


def test_workspace_reuses_buffers_and_bounds_what_it_keeps() -> None:
    pool = Workspace(keep=2)
    like = torch.zeros(1)
    a = pool.take((3, 4), like)
    pool.give(a)
    assert pool.take((3, 4), like).data_ptr() == a.data_ptr()  # the same memory again
    assert pool.take((3, 4), like.double()).dtype == torch.float64  # never a buffer of another dtype
    pool.give(*(pool.take((k, 1), like) for k in range(1, 5)))
    assert [t.shape[0] for t in pool.idle] == [3, 4]  # only the last `keep` returned
    with torch.inference_mode():
        made_in_inference = pool.take((5, 5), like)
    pool.give(made_in_inference)
    assert pool.take((5, 5), like).data_ptr() != made_in_inference.data_ptr()  # not writable outside it


def test_training_after_inference_mode_evaluation() -> None:
    """Buffers pooled under torch.inference_mode must not be handed to a training step."""
    net, x = tiny_net(), torch.rand(2, 1, 28, 28)
    with mock.patch.object(em_module, "INFERENCE_CHUNK_VOTES", 1), torch.inference_mode():
        net.eval()(x)  # chunks of one image
    with mock.patch.object(em_module, "ROUTING_CHUNK_VOTES", 1):
        net.train()(x[:1]).activations.sum().backward()  # the same vote shapes as the inference chunks
    assert all(p.grad is not None for p in net.parameters())


def test_a_training_step_returns_every_vote_buffer() -> None:
    net, x = tiny_net().train(), torch.rand(2, 1, 28, 28)
    WORKSPACE.idle.clear()
    for _ in range(2):
        out = net(x)
        (out.activations.sum() + out.poses.sum()).backward()
        kept = {(t.shape, t.data_ptr()) for t in WORKSPACE.idle}
    assert len(kept) >= 6  # votes, squares, gradient and matmul buffers of the three routed layers
    out = net(x)
    (out.activations.sum() + out.poses.sum()).backward()
    assert {(t.shape, t.data_ptr()) for t in WORKSPACE.idle} == kept  # the second step allocated none


def test_network_gradients_match_plain_autograd() -> None:
    """The whole tiny network: gradients through FusedEMLayer equal those of plain autograd."""
    net, x = tiny_net().train(), torch.rand(3, 1, 28, 28)
    labels = torch.tensor([0, 3, 9])

    def grads() -> list[torch.Tensor]:
        out = net(x)
        loss = spread_loss(out.activations, labels, 0.5) + out.poses.square().mean()
        return list(torch.autograd.grad(loss, list(net.parameters())))

    fused = grads()
    with mock.patch.object(em_module.torch.compiler, "is_compiling", return_value=True):  # the plain path
        plain = grads()
    for (name, _), f, p in zip(net.named_parameters(), fused, plain, strict=True):  # float32: summation order differs
        scale = p.abs().max().item()
        torch.testing.assert_close(f, p, rtol=1e-3, atol=1e-3 * scale, msg=lambda m, name=name: f"{name}: {m}")

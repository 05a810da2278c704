"""The paper's baseline CNN: size, shapes at 28 and 40, dropout, its entry in the architecture table, learning."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from model.baseline import BaselineCNN, BaselineConfig
from model.capsnet import count_parameters
from training.fitting.architectures import get_architecture


def meta_parameters(cfg: BaselineConfig) -> int:
    with torch.device("meta"):  # shapes only: no 35M-parameter allocation
        return count_parameters(BaselineCNN(cfg))


def test_paper_parameter_count_is_the_papers_35_4m() -> None:
    assert meta_parameters(BaselineConfig()) == 35_445_522  # Sabour et al. 2017 §5: 35.4M
    assert meta_parameters(BaselineConfig(image_size=40)) == 69_704_466  # first FC layer sees 40·40·128 inputs
    assert meta_parameters(BaselineConfig(pooling=(2, 2, 1))) < 5_000_000  # pooling shrinks only the FC layer


@pytest.mark.parametrize("size", [28, 40])
@pytest.mark.parametrize("batch", [1, 5])
def test_output_shapes(size: int, batch: int) -> None:
    cfg = BaselineConfig.tiny(image_size=size)
    out = BaselineCNN(cfg).eval()(torch.rand(batch, 1, size, size))
    assert out.logits.shape == (batch, 10)
    assert torch.allclose(out.probabilities.sum(dim=1), torch.ones(batch))


def test_feature_size_follows_pooling_and_bad_configs_fail() -> None:
    assert BaselineConfig(image_size=40, pooling=(2, 2, 1)).feature_size == 10
    assert BaselineConfig().flat_features == 28 * 28 * 128
    with pytest.raises(ValueError, match="one entry per conv layer"):
        BaselineConfig(pooling=(2, 2))
    with pytest.raises(ValueError, match="too small"):
        BaselineConfig(image_size=4, pooling=(2, 2, 2))
    with pytest.raises(ValueError, match="odd"):
        BaselineConfig(conv_kernel=4)


def test_config_round_trips_through_a_dict() -> None:
    cfg = BaselineConfig.tiny(image_size=40, pooling=(2, 1, 1))
    assert BaselineConfig.from_dict(cfg.to_dict()) == cfg
    assert cfg.to_dict()["conv_channels"] == [8, 8, 4]


def test_dropout_only_in_training() -> None:
    torch.manual_seed(0)
    net = BaselineCNN(BaselineConfig.tiny(dropout=0.5))
    x = torch.rand(4, 1, 28, 28)
    net.eval()
    assert torch.equal(net(x).logits, net(x).logits)
    net.train()
    assert not torch.equal(net(x).logits, net(x).logits)


def test_architecture_entry() -> None:
    arch = get_architecture("baseline")
    config = arch.make_config("tiny", {"image_size": 40, "routing": None})
    assert config["image_size"] == 40 and config["conv_channels"] == [8, 8, 4]
    assert arch.make_config("paper", {})["conv_channels"] == [256, 256, 128]
    model = arch.build(config)
    x, y = torch.rand(3, 1, 40, 40), torch.tensor([1, 2, 3])
    out = arch.forward(model.eval(), x, None)
    loss = arch.loss(out, x, y, 0.5)
    assert torch.allclose(loss.total, F.cross_entropy(out.logits, y)) and set(loss.parts) == {"cross_entropy"}
    assert torch.allclose(arch.scores(out), out.logits.softmax(dim=1))
    assert arch.export is None
    with pytest.raises(ValueError, match="no routing"):
        arch.make_config("tiny", {"routing": "sabour"})
    with pytest.raises(ValueError, match="unknown preset"):
        arch.make_config("huge", {})


def test_learns_a_fixed_batch() -> None:
    torch.manual_seed(0)
    net = BaselineCNN(BaselineConfig.tiny(dropout=0.0))
    x, y = torch.rand(16, 1, 28, 28), torch.arange(16) % 10
    opt = torch.optim.Adam(net.parameters(), lr=1e-2)
    losses = []
    for _ in range(30):
        loss = F.cross_entropy(net(x).logits, y)
        losses.append(loss.item())
        opt.zero_grad()
        loss.backward()
        opt.step()
    assert losses[-1] < 0.5 * losses[0]

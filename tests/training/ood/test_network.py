"""Fitting the `pattern` network: it learns to tell two clouds apart and writes what the service accepts."""

from __future__ import annotations

import numpy as np
import pytest

from service.runtime.ood_pattern import PatternNetwork
from training.ood.fitted import auroc
from training.ood.network import fit_network


def test_the_network_learns_a_boundary_no_single_feature_draws() -> None:
    rng = np.random.default_rng(0)
    digits = rng.normal(size=(600, 4))
    radius = np.linalg.norm(digits[:, :2], axis=1)
    digits = digits[radius < 1.2]  # digits inside a disc in the first two numbers ...
    angle = rng.uniform(0, 2 * np.pi, 400)
    outliers = np.c_[2.2 * np.cos(angle), 2.2 * np.sin(angle), rng.normal(size=(400, 2))]  # ... outliers on a ring
    entry = fit_network(("scores",), digits, outliers, hidden=16, epochs=300, members=2, seed=1)
    network = PatternNetwork.from_card(entry)
    assert network.inputs == ("scores",) and network.width == 4
    assert auroc(network(outliers), network(digits)) > 0.99
    assert entry["fitted"] == f"{len(digits)} digits against 400 non-digits, 2 members of hidden 16x2, 300 epochs each"
    assert entry["members"][0]["layers"] != entry["members"][1]["layers"]  # seeds 1 and 2
    again = fit_network(("scores",), digits, outliers, hidden=16, epochs=300, members=2, seed=1)
    assert again["members"] == entry["members"]  # seeded: the same card from the same data


def test_the_network_needs_both_sides_of_one_width() -> None:
    with pytest.raises(ValueError, match="needs digits and outliers"):
        fit_network(("scores",), np.zeros((0, 3)), np.ones((5, 3)))
    with pytest.raises(ValueError, match="needs digits and outliers"):
        fit_network(("scores",), np.zeros((5, 3)), np.ones((5, 4)))
    with pytest.raises(ValueError, match="at least one member"):
        fit_network(("scores",), np.zeros((5, 3)), np.ones((5, 3)), members=0)

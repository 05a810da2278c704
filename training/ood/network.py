"""The `pattern` network of the "not a digit" score: a small perceptron fitted by outlier exposure.

It reads `service.runtime.ood_pattern.capsule_vector` (every capsule's length and pose, ink, reconstruction
distance) and learns to tell MNIST digits from the fitting non-digits (Hendrycks et al. 2019), each side weighing
half. The
card stores it as plain numbers (`PatternNetwork.from_card`), so the service runs it in numpy without torch.
"""

from __future__ import annotations

import logging
from typing import Any

import numpy as np
import torch

from service.contract import PatternNetwork
from training.fitting.loop import make_optimizer, optimizer_step

log = logging.getLogger(__name__)

HIDDEN = 128  # units in each of the two hidden layers
MEMBERS = 3  # networks of different seeds whose outputs are averaged
EPOCHS = 60  # passes over digits and outliers
BATCH = 256
LEARNING_RATE = 1e-3
WEIGHT_DECAY = 1e-4


def fit_network(
    inputs: tuple[str, ...],
    digits: np.ndarray,
    outliers: np.ndarray,
    *,
    hidden: int = HIDDEN,
    epochs: int = EPOCHS,
    members: int = MEMBERS,
    seed: int = 0,
) -> dict[str, Any]:
    """The card's `network` entry fitted on (N, D) capsule vectors of digits (0) against outliers (1): `members`
    perceptrons of seeds seed, seed + 1, ..., whose outputs the service averages."""
    if len(digits) == 0 or len(outliers) == 0 or digits.shape[1] != outliers.shape[1]:
        raise ValueError("the pattern network needs digits and outliers with vectors of one length")
    if members < 1:
        raise ValueError("the pattern network needs at least one member")
    mean = digits.mean(axis=0)
    scale = digits.std(axis=0) + 1e-6
    x = torch.tensor((np.concatenate([digits, outliers]) - mean) / scale, dtype=torch.float32)
    y = torch.cat([torch.zeros(len(digits)), torch.ones(len(outliers))])
    weight = torch.cat(
        [torch.full((len(digits),), 0.5 / len(digits)), torch.full((len(outliers),), 0.5 / len(outliers))]
    )
    weight = weight * len(x)  # each side weighs half; the mean weight is one
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # steps this small run about 50x slower on two threads that share a core with other work
    try:
        layers = [_fit_member(x, y, weight, hidden, epochs, seed + m) for m in range(members)]
    finally:
        torch.set_num_threads(threads)
    entry = {
        "inputs": list(inputs),
        "mean": compact(mean),
        "scale": compact(scale),
        "members": [{"layers": member} for member in layers],
        "fitted": f"{len(digits)} digits against {len(outliers)} non-digits, {members} members of hidden "
        f"{hidden}x2, {epochs} epochs each",
    }
    PatternNetwork.from_card(entry)  # the service must accept what is written
    return entry


def _fit_member(
    x: torch.Tensor, y: torch.Tensor, weight: torch.Tensor, hidden: int, epochs: int, seed: int
) -> list[dict[str, Any]]:
    generator = torch.Generator().manual_seed(seed)
    torch.manual_seed(seed)
    net = torch.nn.Sequential(
        torch.nn.Linear(x.shape[1], hidden), torch.nn.ReLU(), torch.nn.Linear(hidden, hidden), torch.nn.ReLU(),
        torch.nn.Linear(hidden, 1),
    )  # fmt: skip
    optimizer = make_optimizer(net, LEARNING_RATE, WEIGHT_DECAY)
    for epoch in range(epochs):
        order = torch.randperm(len(x), generator=generator)
        total = 0.0
        for start in range(0, len(x), BATCH):
            idx = order[start : start + BATCH]
            loss = torch.nn.functional.binary_cross_entropy_with_logits(
                net(x[idx]).squeeze(1), y[idx], reduction="none"
            )
            loss = (loss * weight[idx]).mean()
            optimizer_step(optimizer, loss)
            total += float(loss.detach()) * len(idx)
        if epoch == 0 or epoch + 1 == epochs:
            log.info("pattern network (seed %d): epoch %d of %d, loss %.4f", seed, epoch + 1, epochs, total / len(x))
    return [{"weight": [compact(row) for row in m.weight.detach().numpy()], "bias": compact(m.bias.detach().numpy())}
            for m in net if isinstance(m, torch.nn.Linear)]  # fmt: skip


def compact(values: np.ndarray) -> list[float]:
    """Numbers at float32 precision, each the shortest decimal that reads back as the same float32 (the card
    stays small; the service computes with exactly these)."""
    return [float(str(v)) for v in np.asarray(values, dtype=np.float32)]

"""CapsNet on MultiMNIST (Sabour et al. 2017 §6): two-label margin loss, one reconstruction per digit, top-2 error."""

from __future__ import annotations

import logging
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F

from model.capsnet import CapsNet, capsule_length
from model.config import CapsNetConfig
from model.losses import margin_loss_multi, reconstruction_loss
from training.architectures import RECONSTRUCTION_WEIGHT
from training.checkpoint import check_resumable, load_checkpoint, restore_rng_states, rng_states, save_checkpoint
from training.data import MNISTSplit
from training.generators import MULTIMNIST_CANVAS, MultiDigits, multimnist
from training.train import within_budget

log = logging.getLogger(__name__)


def multi_hot(labels: torch.Tensor, num_classes: int) -> torch.Tensor:
    """labels (B, L) -> (B, K) with a 1 at every label."""
    return F.one_hot(labels, num_classes).amax(dim=1).to(torch.float32)


def reconstruct_each(model: CapsNet, poses: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """One reconstruction per label, each from that class's capsule alone (§6) -> (B, L, pixels)."""
    return torch.stack([model.decode_class(poses, labels[:, k]) for k in range(labels.shape[1])], dim=1)


def top2(lengths: torch.Tensor) -> torch.Tensor:
    """The two longest capsules of each image, sorted by class index -> (B, 2)."""
    return lengths.topk(2, dim=1).indices.sort(dim=1).values


def multimnist_loss(
    model: CapsNet, images: torch.Tensor, labels: torch.Tensor, digits: torch.Tensor
) -> tuple[torch.Tensor, dict[str, float]]:
    """Margin loss with both digits present plus 0.0005 x the reconstruction loss of each digit on its own.

    images (B, 1, S, S), labels (B, 2), digits (B, 2, 1, S, S) in [0, 1].
    """
    poses, _ = model.encode(images)  # (B, K, D)
    lengths = capsule_length(poses)  # (B, K)
    margin = margin_loss_multi(lengths, multi_hot(labels, model.cfg.num_classes))
    recon = reconstruct_each(model, poses, labels)  # (B, 2, pixels)
    rec_loss = torch.stack([reconstruction_loss(recon[:, k], digits[:, k]) for k in range(labels.shape[1])]).sum()
    total = margin + RECONSTRUCTION_WEIGHT * rec_loss
    return total, {"margin_loss": float(margin.detach()), "reconstruction_loss": float(rec_loss.detach())}


@dataclass(frozen=True)
class MultiMNISTConfig:
    preset: str = "paper"  # the CapsNet's size: "paper" or "tiny", on the 36x36 canvas
    epochs: int = 30
    batch_size: int = 128
    lr: float = 1e-3
    lr_decay: float = 0.96
    seed: int = 0
    train_subset: int | None = None
    test_subset: int | None = None
    test_pairs_per_digit: int = 1  # composites per test digit (the paper used 1,000)
    eval_batch_size: int = 500


def build_multimnist_capsnet(preset: str) -> CapsNet:
    if preset == "paper":
        return CapsNet(CapsNetConfig(image_size=MULTIMNIST_CANVAS))
    if preset == "tiny":
        return CapsNet(CapsNetConfig.tiny(image_size=MULTIMNIST_CANVAS))
    raise ValueError(f"unknown preset {preset!r} (choose paper or tiny)")


def _float(images: np.ndarray, device: torch.device) -> torch.Tensor:
    return torch.from_numpy(images).to(device=device, dtype=torch.float32) / 255.0


@dataclass
class MultiEval:
    n: int
    errors: int  # images whose two longest capsules are not exactly the two digits' classes
    predictions: np.ndarray  # (N, 2) sorted

    @property
    def error(self) -> float:
        return self.errors / self.n if self.n else float("nan")


def evaluate_multimnist(model: CapsNet, data: MultiDigits, device: torch.device, batch_size: int = 500) -> MultiEval:
    """Two-digit error: an image counts as correct only when its top-2 capsules are exactly its two classes."""
    model.eval()
    preds = []
    with torch.no_grad():
        for start in range(0, len(data.labels), batch_size):
            poses, _ = model.encode(_float(data.images[start : start + batch_size], device))
            preds.append(top2(capsule_length(poses)).cpu().numpy())
    p = np.concatenate(preds) if preds else np.zeros((0, 2), dtype=np.int64)
    truth = np.sort(data.labels, axis=1)
    errors = int((p != truth).any(axis=1).sum())
    return MultiEval(n=len(truth), errors=errors, predictions=p)


def reconstruction_examples(
    model: CapsNet, data: MultiDigits, device: torch.device, n: int = 8
) -> dict[str, np.ndarray]:
    """Figure-5 material for the first n test composites: the input, both targets, and the reconstructions
    from the true labels and from the predicted (top-2) labels, each digit decoded from its own capsule alone.

    Returns uint8 arrays: inputs (n, S, S), targets (n, 2, S, S), recon_true and recon_pred (n, 2, S, S),
    and int64 labels (n, 2) and predictions (n, 2).
    """
    model.eval()
    size = model.cfg.image_size
    with torch.no_grad():
        images = _float(data.images[:n], device)
        poses, _ = model.encode(images)
        predicted = top2(capsule_length(poses))  # (n, 2)
        truth = torch.from_numpy(data.labels[:n]).to(device)
        recon_true = reconstruct_each(model, poses, truth)
        recon_pred = reconstruct_each(model, poses, predicted)

    def to_u8(t: torch.Tensor) -> np.ndarray:
        return (t.clamp(0, 1) * 255).round().to(torch.uint8).cpu().numpy().reshape(t.shape[0], 2, size, size)

    return {
        "inputs": data.images[:n, 0],
        "targets": data.digits[:n, :, 0],
        "recon_true": to_u8(recon_true),
        "recon_pred": to_u8(recon_pred),
        "labels": data.labels[:n],
        "predictions": predicted.cpu().numpy(),
    }


def _resume_state(checkpoint: Path | None, cfg: MultiMNISTConfig) -> dict[str, Any] | None:
    if checkpoint is None or not checkpoint.is_file():
        return None
    state = load_checkpoint(checkpoint)
    check_resumable(checkpoint, state.get("config", {}), asdict(cfg), len(state["history"]), cfg.epochs)
    return state


def train_multimnist(
    cfg: MultiMNISTConfig,
    train: MNISTSplit,
    test: MNISTSplit,
    device: torch.device,
    checkpoint: Path | None = None,
    deadline: float | None = None,
) -> tuple[CapsNet, list[dict[str, Any]], MultiDigits]:
    """Train a CapsNet on MultiMNIST composites drawn afresh every epoch (one per training digit, seed + epoch).

    The test composites are drawn once (seed 10_000 + cfg.seed); the error after every epoch is on them.
    With `checkpoint`, the state is written there after every epoch and a run continues from it exactly;
    no epoch is started that would end past `deadline` (time.monotonic(), judged by the last epoch), so
    the history may be shorter than cfg.epochs. Returns the model, the per-epoch history and the test
    composites.
    """
    train, test = train.subset(cfg.train_subset), test.subset(cfg.test_subset)
    torch.manual_seed(cfg.seed)
    model = build_multimnist_capsnet(cfg.preset).to(device)
    optimizer = torch.optim.Adam(model.parameters(), lr=cfg.lr)
    scheduler = torch.optim.lr_scheduler.ExponentialLR(optimizer, gamma=cfg.lr_decay)
    test_data = multimnist(test.images, test.labels, 10_000 + cfg.seed, cfg.test_pairs_per_digit)
    order_rng = np.random.default_rng(cfg.seed)
    history: list[dict[str, Any]] = []
    state = _resume_state(checkpoint, cfg)
    if state is not None:
        model.load_state_dict(state["model"])
        optimizer.load_state_dict(state["optimizer"])
        scheduler.load_state_dict(state["scheduler"])
        history = list(state["history"])
        restore_rng_states(state)
        order_rng.bit_generator.state = state["order_rng"]
        log.info("multimnist: continuing from %s at epoch %d", checkpoint, len(history))
    last_seconds: float | None = None  # the first epoch of a call always runs: a resumed run always progresses
    for epoch in range(len(history), cfg.epochs):
        if not within_budget(deadline, last_seconds):
            log.info("multimnist: time budget spent after epoch %d of %d", epoch, cfg.epochs)
            break
        start = time.perf_counter()
        data = multimnist(train.images, train.labels, cfg.seed * 1_000 + epoch)
        order = order_rng.permutation(len(data.labels))
        model.train()
        sums = {"train_loss": 0.0, "margin_loss": 0.0, "reconstruction_loss": 0.0}
        for first in range(0, len(order), cfg.batch_size):
            idx = order[first : first + cfg.batch_size]
            labels = torch.from_numpy(data.labels[idx]).to(device)
            loss, parts = multimnist_loss(
                model, _float(data.images[idx], device), labels, _float(data.digits[idx], device)
            )
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            optimizer.step()
            for key, value in {"train_loss": float(loss.detach()), **parts}.items():
                sums[key] += value * len(idx)
        scheduler.step()
        result = evaluate_multimnist(model, test_data, device, cfg.eval_batch_size)
        row = {
            "epoch": epoch + 1,
            **{k: round(v / max(len(order), 1), 6) for k, v in sums.items()},
            "test_error": result.error,
            "test_n": result.n,
            "seconds": round(time.perf_counter() - start, 2),
        }
        log.info("multimnist epoch %d: %s", epoch + 1, row)
        history.append(row)
        if checkpoint is not None:
            save_checkpoint(checkpoint, {
                "config": asdict(cfg), "model": model.state_dict(), "optimizer": optimizer.state_dict(),
                "scheduler": scheduler.state_dict(), "history": history, **rng_states(),
                "order_rng": order_rng.bit_generator.state,
            })  # fmt: skip
        last_seconds = time.perf_counter() - start
    return model, history, test_data

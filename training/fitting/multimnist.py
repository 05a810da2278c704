"""CapsNet on MultiMNIST (Sabour et al. 2017 §6): two-label margin loss, one reconstruction per digit, top-2 error."""

from __future__ import annotations

import contextlib
import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Any, cast

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from model.capsnet import CapsNet, capsule_length
from model.losses import margin_loss_multi, reconstruction_loss
from training.data.generators import MULTIMNIST_CANVAS, MultiDigits, multimnist
from training.data.mnist import MNISTSplit
from training.fitting.architectures import RECONSTRUCTION_WEIGHT, get_architecture
from training.fitting.checkpoint import CheckpointMismatch
from training.fitting.config import TrainConfig
from training.fitting.loop import Autocast, Step, Trainer
from training.fitting.train import model_config_for

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
    model: CapsNet,
    images: torch.Tensor,
    labels: torch.Tensor,
    digits: torch.Tensor,
    autocast: Autocast = contextlib.nullcontext,
) -> tuple[torch.Tensor, dict[str, float]]:
    """Margin loss with both digits present plus 0.0005 x the reconstruction loss of each digit on its own.

    images (B, 1, S, S), labels (B, 2), digits (B, 2, 1, S, S) in [0, 1]; the encoder runs under `autocast()`.
    """
    with autocast():
        poses, _ = model.encode(images)  # (B, K, D)
    poses = poses.float()
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
    amp: bool = False  # bfloat16 autocast of the convolutions (CUDA, or a CPU with native bfloat16)
    composites_per_epoch: int | None = None  # drawn from that many training digits sampled afresh; None: one per digit
    eval_batch_size: int = 500
    eval_every: int = 1  # test after every N-th epoch (and the last; TrainConfig.eval_every)


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


class MultiMNISTTask:
    """Composites drawn afresh every epoch (one per training digit, seed + epoch; with `composites_per_epoch`, one
    per digit of that many sampled afresh, partners among them) in an order kept across resumes; the two-label
    loss; the two-digit error on composites drawn once (seed 10_000 + cfg.seed)."""

    def __init__(self, cfg: MultiMNISTConfig, train: MNISTSplit, test: MNISTSplit, device: torch.device) -> None:
        self.cfg, self.device = cfg, device
        self.train = train.subset(cfg.train_subset)
        test = test.subset(cfg.test_subset)
        self.test_data = multimnist(test.images, test.labels, 10_000 + cfg.seed, cfg.test_pairs_per_digit)
        self.data_hashes = {**train.sha256, **test.sha256}
        self.order_rng = np.random.default_rng(cfg.seed)
        self.data: MultiDigits | None = None

    def batches(self, epoch: int) -> list[np.ndarray]:
        images, labels, seed = self.train.images, self.train.labels, self.cfg.seed * 1_000 + epoch
        if (n := self.cfg.composites_per_epoch) is not None and n < len(labels):
            pick = np.sort(np.random.default_rng([seed, 1]).choice(len(labels), size=n, replace=False))
            images, labels = images[pick], labels[pick]  # the epoch's digits: bases and partners alike
        self.data = multimnist(images, labels, seed)
        order = self.order_rng.permutation(len(self.data.labels))
        return [order[first : first + self.cfg.batch_size] for first in range(0, len(order), self.cfg.batch_size)]

    def step(self, model: nn.Module, batch: np.ndarray, progress: float, autocast: Autocast) -> Step:
        if self.data is None:
            raise RuntimeError("MultiMNISTTask.step before batches(): the epoch's composites are not drawn yet")
        labels = torch.from_numpy(self.data.labels[batch]).to(self.device)
        images, digits = _float(self.data.images[batch], self.device), _float(self.data.digits[batch], self.device)
        loss, parts = multimnist_loss(cast(CapsNet, model), images, labels, digits, autocast)
        return Step(loss, dict(parts), len(batch))

    def evaluate(self, model: nn.Module, max_batches: int | None) -> dict[str, Any]:
        result = evaluate_multimnist(cast(CapsNet, model), self.test_data, self.device, self.cfg.eval_batch_size)
        return {"test_error": result.error, "test_n": result.n}

    def state_dict(self) -> dict[str, Any]:
        return {"order_rng": self.order_rng.bit_generator.state, "test_pairs_per_digit": self.cfg.test_pairs_per_digit}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        if state.get("test_pairs_per_digit") != self.cfg.test_pairs_per_digit:
            raise CheckpointMismatch("the checkpoint was trained with other settings (test_pairs_per_digit)")
        self.order_rng.bit_generator.state = state["order_rng"]


def train_config(cfg: MultiMNISTConfig, device: torch.device) -> TrainConfig:
    """The loop's settings: the MNIST CapsNet on the 36x36 canvas, no shifts (the composites are shifted already)."""
    return TrainConfig(
        arch="dynamic", preset=cfg.preset, epochs=cfg.epochs, batch_size=cfg.batch_size, lr=cfg.lr,
        lr_decay=cfg.lr_decay, max_shift=0, canvas=MULTIMNIST_CANVAS, seed=cfg.seed, device=str(device),
        train_subset=cfg.train_subset, test_subset=cfg.test_subset, eval_batch_size=cfg.eval_batch_size,
        epoch_images=cfg.composites_per_epoch, amp=cfg.amp, eval_every=cfg.eval_every,
    )  # fmt: skip


def train_multimnist(
    cfg: MultiMNISTConfig,
    train: MNISTSplit,
    test: MNISTSplit,
    device: torch.device,
    out_dir: Path | None = None,
    deadline: float | None = None,
    checkpoint_minutes: float | None = None,
) -> tuple[CapsNet, list[dict[str, Any]], MultiDigits]:
    """Train a CapsNet on MultiMNIST with the one training loop; the error of each evaluated epoch (every
    `cfg.eval_every`-th and the last) is on the test composites.

    With `out_dir`, checkpoints and metrics are written there after every epoch and a run continues from its
    last.pt exactly (refusing one of other settings); no epoch is started that would end past `deadline`
    (time.monotonic(), judged by the last epoch), so the history may be shorter than cfg.epochs; with
    `checkpoint_minutes`, last.pt is also written every that many minutes inside an epoch. Returns
    the model (its evaluated weights: the average, with `ema`), the per-epoch history and the test composites.
    """
    loop_cfg = train_config(cfg, device)
    torch.manual_seed(cfg.seed)
    model_config = model_config_for(loop_cfg)
    model = get_architecture("dynamic").build(model_config).to(device)
    task = MultiMNISTTask(cfg, train, test, device)
    last = out_dir / "last.pt" if out_dir is not None else None
    resume = str(last) if last is not None and last.is_file() else None
    trainer = Trainer(loop_cfg, task, model, model_config, out_dir, resume, strict_resume=True)
    history = trainer.fit(deadline, checkpoint_minutes)
    return cast(CapsNet, trainer.evaluated_model), history, task.test_data

"""The training loop: seeded, resumable, optionally distributed (torchrun / DDP)."""

from __future__ import annotations

import argparse
import json
import logging
import math
import os
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel
from torch.utils.data import DistributedSampler
from tqdm import tqdm

from training.architectures import ARCHITECTURES, get_architecture
from training.checkpoint import (
    check_resumable,
    load_checkpoint,
    restore_rng_states,
    rng_states,
    save_checkpoint,
    training_command,
)
from training.data import IDXError, MNISTSplit, load_split
from training.evaluate import evaluate_torch, resolve_device
from training.generators import pad_split

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class TrainConfig:
    arch: str = "dynamic"
    preset: str = "paper"
    routing: str | None = None  # None: the architecture's default
    routing_iterations: int | None = None
    epochs: int = 30
    batch_size: int = 128
    lr: float = 1e-3
    lr_decay: float = 0.96  # exponential decay per epoch
    max_shift: int = 2  # the paper's only augmentation: shifts of up to 2 px
    canvas: int = 28  # digits centred on canvas x canvas; 40 with max_shift 6 is shifted MNIST on 40x40 (§5.2)
    seed: int = 0
    device: str = "auto"
    amp: bool = False  # bfloat16 autocast of the convolutions: CUDA, or a CPU with native bfloat16
    val_split: int = 0  # hold out this many training images (seeded) for validation; 0: train on all
    train_subset: int | None = None
    test_subset: int | None = None
    eval_batch_size: int = 500
    dry_run: bool = False
    model_overrides: dict[str, Any] = field(default_factory=dict)


def random_shift(images: torch.Tensor, max_shift: int, generator: torch.Generator) -> torch.Tensor:
    """Shift each image independently by up to `max_shift` pixels per axis, zero padded (§5).

    images (B, C, H, W) -> (B, C, H, W). Offsets are drawn on the CPU generator for reproducibility.
    """
    if max_shift == 0:
        return images
    b, c, h, w = images.shape
    dev = images.device
    padded = torch.nn.functional.pad(images, (max_shift,) * 4)  # (B, C, H+2s, W+2s)
    offsets = torch.randint(0, 2 * max_shift + 1, (2, b), generator=generator).to(dev)
    rows = (offsets[0].view(b, 1) + torch.arange(h, device=dev)).view(b, 1, h, 1)
    cols = (offsets[1].view(b, 1) + torch.arange(w, device=dev)).view(b, 1, 1, w)
    batch_idx = torch.arange(b, device=dev).view(b, 1, 1, 1)
    chan_idx = torch.arange(c, device=dev).view(1, c, 1, 1)
    return padded[batch_idx, chan_idx, rows, cols]


@dataclass
class DistInfo:
    rank: int = 0
    world_size: int = 1
    local_rank: int = 0

    @property
    def is_main(self) -> bool:
        return self.rank == 0


def init_distributed(device_name: str) -> DistInfo:
    """Join the process group when launched by torchrun (WORLD_SIZE > 1)."""
    world = int(os.environ.get("WORLD_SIZE", "1"))
    if world <= 1:
        return DistInfo()
    info = DistInfo(int(os.environ["RANK"]), world, int(os.environ.get("LOCAL_RANK", "0")))
    use_cuda = device_name != "cpu" and torch.cuda.is_available()
    if use_cuda:
        torch.cuda.set_device(info.local_rank)
    if not dist.is_initialized():
        dist.init_process_group(backend="nccl" if use_cuda else "gloo")
    return info


def model_config_for(cfg: TrainConfig) -> dict[str, Any]:
    overrides = dict(cfg.model_overrides)
    if cfg.routing is not None:
        overrides["routing"] = cfg.routing
    if cfg.routing_iterations is not None:
        overrides["routing_iterations"] = cfg.routing_iterations
    if cfg.canvas != 28:
        overrides["image_size"] = cfg.canvas
    return get_architecture(cfg.arch).make_config(cfg.preset, overrides)


def epoch_batches(n: int, cfg: TrainConfig, epoch: int, info: DistInfo) -> list[torch.Tensor]:
    """This rank's shuffled index batches for `epoch` (a DistributedSampler, seeded by seed and epoch)."""
    sampler: DistributedSampler[int] = DistributedSampler(
        range(n),  # type: ignore[arg-type]  # any sized sequence works
        num_replicas=info.world_size,
        rank=info.rank,
        shuffle=True,
        seed=cfg.seed,
        drop_last=False,
    )
    sampler.set_epoch(epoch)
    idx = torch.tensor(list(sampler), dtype=torch.long)
    return list(torch.split(idx, cfg.batch_size))


def draw_curve(history: list[dict[str, Any]], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    epochs = [h["epoch"] for h in history]
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(10, 4))
    ax1.plot(epochs, [h["train_loss"] for h in history], marker="o", label="train")
    ax1.plot(epochs, [h["test_loss"] for h in history], marker="o", label="test")
    ax1.set(xlabel="epoch", ylabel="loss", title="loss")
    ax1.legend()
    ax2.plot(epochs, [100 * h["test_error"] for h in history], marker="o", label="test error")
    ax2.plot(epochs, [100 * (1 - h["train_accuracy"]) for h in history], marker="o", label="train error")
    ax2.set(xlabel="epoch", ylabel="error (%)", title="error", yscale="log")
    ax2.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


# Settings that may change between the calls of one resumable run (they do not change the experiment).
RESUMABLE_CHANGES = frozenset({"epochs", "device", "amp", "dry_run"})
EXIT_UNFINISHED = 3  # --max-minutes stopped the run before --epochs; resume it


def within_budget(deadline: float | None, last_epoch_seconds: float | None) -> bool:
    """Whether another epoch fits before `deadline` (time.monotonic()), judged by the last one's duration."""
    if deadline is None or last_epoch_seconds is None:
        return True
    return time.monotonic() + last_epoch_seconds <= deadline


def bf16_supported(device: torch.device) -> bool:
    """Whether bfloat16 autocast is fast here: any CUDA device, or a CPU with AVX512-BF16 or AMX (oneDNN)."""
    if device.type == "cuda":
        return True
    if device.type == "cpu":
        # Native bfloat16 only: AVX512 without the BF16 extension passes oneDNN's check but emulates it, slower.
        return bool(torch.cpu._is_avx512_bf16_supported() or torch.cpu._is_amx_tile_supported())
    return False


def use_amp(requested: bool, device: torch.device) -> bool:
    """`--amp` where it helps; on a CPU without native bfloat16 it would be slower, so warn and stay float32."""
    if requested and not bf16_supported(device):
        log.warning("--amp ignored: this %s has no native bfloat16 support; training in float32", device.type)
        return False
    return requested


class Trainer:
    """Owns the model, optimizer and data for one run; `fit` trains to `cfg.epochs`."""

    def __init__(
        self,
        cfg: TrainConfig,
        data_dir: str | None,
        out_dir: str | os.PathLike[str] | None,
        resume: str | None = None,
        strict_resume: bool = False,
    ) -> None:
        """`strict_resume`: continue `resume` only if it was trained with these settings (bar RESUMABLE_CHANGES)."""
        self.cfg = cfg
        self.out = Path(out_dir) if out_dir is not None else None
        self.info = init_distributed(cfg.device)
        self.device = resolve_device(cfg.device)
        if self.device.type == "cuda" and self.info.world_size > 1:
            self.device = torch.device("cuda", self.info.local_rank)
        self.arch = get_architecture(cfg.arch)
        self.amp = use_amp(cfg.amp, self.device)
        train, test = load_split(data_dir, "train"), load_split(data_dir, "test")
        self.data_hashes = {**train.sha256, **test.sha256}  # of the files read, for the model card
        train, val = hold_out(train, cfg.val_split, cfg.seed)
        self.train_split: MNISTSplit = pad_split(train.subset(cfg.train_subset), cfg.canvas)
        self.val_data: MNISTSplit | None = pad_split(val, cfg.canvas) if val is not None else None
        self.test_split: MNISTSplit = pad_split(test.subset(cfg.test_subset), cfg.canvas)
        torch.manual_seed(cfg.seed)
        self.model_config = model_config_for(cfg)
        self.model: nn.Module = self.arch.build(self.model_config).to(self.device)
        self.optimizer = torch.optim.Adam(self.model.parameters(), lr=cfg.lr)
        self.scheduler = torch.optim.lr_scheduler.ExponentialLR(self.optimizer, gamma=cfg.lr_decay)
        self.epoch = 0
        self.best_test_error = math.inf
        self.best_val_error = math.inf
        self.history: list[dict[str, Any]] = []
        self.command = training_command(sys.argv)
        if resume:
            self._restore(resume, strict_resume)
        self.train_images = torch.from_numpy(self.train_split.images)
        self.train_labels = torch.from_numpy(self.train_split.labels)
        self.ddp: nn.Module = (
            DistributedDataParallel(self.model, device_ids=[self.device.index] if self.device.type == "cuda" else None)
            if self.info.world_size > 1
            else self.model
        )

    def _restore(self, path: str, strict: bool) -> None:
        state = load_checkpoint(path)
        if state["arch"] != self.cfg.arch or state["model_config"] != self.model_config:
            raise ValueError(f"checkpoint {path} was trained with a different architecture or model config")
        if strict:
            wanted = asdict(self.cfg)
            check_resumable(
                path, state["train_config"], wanted, int(state["epoch"]), self.cfg.epochs, RESUMABLE_CHANGES
            )
        self.model.load_state_dict(state["model"])
        self.optimizer.load_state_dict(state["optimizer"])
        self.scheduler.load_state_dict(state["scheduler"])
        self.epoch = int(state["epoch"])
        self.best_test_error = float(state["best_test_error"])
        self.best_val_error = float(state.get("best_val_error", math.inf))
        self.history = list(state["history"])
        restore_rng_states(state)
        log.info("resumed from %s at epoch %d", path, self.epoch)

    def _state(self) -> dict[str, Any]:
        return {
            "arch": self.cfg.arch,
            "model_config": self.model_config,
            "train_config": asdict(self.cfg),
            "model": self.model.state_dict(),
            "optimizer": self.optimizer.state_dict(),
            "scheduler": self.scheduler.state_dict(),
            "epoch": self.epoch,
            "best_test_error": self.best_test_error,
            "best_val_error": self.best_val_error,
            "history": self.history,
            **rng_states(),
            "command": self.command,
            "data_hashes": self.data_hashes,
        }

    def _autocast(self) -> Any:
        return torch.autocast(device_type=self.device.type, dtype=torch.bfloat16, enabled=self.amp)

    def train_epoch(self) -> dict[str, float]:
        cfg, epoch = self.cfg, self.epoch
        gen = torch.Generator().manual_seed(cfg.seed * 100_003 + epoch * 101 + self.info.rank)
        batches = epoch_batches(len(self.train_split), cfg, epoch, self.info)
        if cfg.dry_run:
            batches = batches[:1]
        self.ddp.train()
        sums: dict[str, float] = {}
        correct = seen = 0
        total_steps = max(cfg.epochs * len(batches), 1)
        bar = tqdm(
            batches,
            desc=f"epoch {epoch + 1}/{cfg.epochs}",
            disable=not self.info.is_main,
            mininterval=2.0,
            file=sys.stderr,
        )
        for step, idx in enumerate(bar):
            images = random_shift(to_float_t(self.train_images[idx]), cfg.max_shift, gen).to(self.device)
            labels = self.train_labels[idx].to(self.device)
            with self._autocast():
                out = self.arch.forward(self.ddp, images, labels)
            progress = (epoch * len(batches) + step) / total_steps
            loss = self.arch.loss(out, images, labels, progress)
            self.optimizer.zero_grad(set_to_none=True)
            loss.total.backward()
            self.optimizer.step()
            n = len(idx)
            seen += n
            correct += int((self.arch.scores(out).argmax(dim=1) == labels).sum())
            for key, value in {"train_loss": loss.total, **loss.parts}.items():
                sums[key] = sums.get(key, 0.0) + float(value.detach()) * n
            bar.set_postfix(loss=f"{sums['train_loss'] / seen:.4f}", acc=f"{correct / seen:.4f}")
        self.scheduler.step()
        sums, correct, seen = self._all_ranks(sums, correct, seen)
        return {
            **{k: v / max(seen, 1) for k, v in sums.items()},
            "train_accuracy": correct / max(seen, 1),
            "train_images": seen,
        }

    def _all_ranks(self, sums: dict[str, float], correct: int, seen: int) -> tuple[dict[str, float], int, int]:
        """Sum the epoch's statistics over all processes (identity without DDP)."""
        if self.info.world_size == 1:
            return sums, correct, seen
        keys = sorted(sums)
        t = torch.tensor([sums[k] for k in keys] + [correct, seen], dtype=torch.float64, device=self.device)
        dist.all_reduce(t)
        values = t.tolist()
        return dict(zip(keys, values[: len(keys)], strict=True)), int(values[-2]), int(values[-1])

    @property
    def finished(self) -> bool:
        return self.epoch >= self.cfg.epochs

    def _all_agree(self, flag: bool) -> bool:
        """True only if every process says so (DDP ranks must stop at the same epoch or they hang)."""
        if self.info.world_size == 1:
            return flag
        t = torch.tensor([1 if flag else 0], device=self.device)
        dist.all_reduce(t, op=dist.ReduceOp.MIN)
        return bool(t.item())

    def fit(self, deadline: float | None = None) -> list[dict[str, Any]]:
        """Train to `cfg.epochs`, or until `deadline` (a time.monotonic() value) would be overrun.

        No epoch is started that would end past the deadline, judged by the last epoch's duration; the
        first epoch of a call always runs. Every epoch ends with last.pt written, so a stopped run
        continues with `resume=<out>/last.pt` (`finished` says whether it reached `cfg.epochs`).
        """
        last_seconds: float | None = None
        while self.epoch < self.cfg.epochs:
            if not self._all_agree(within_budget(deadline, last_seconds)):
                log.info("time budget: stopping after epoch %d of %d", self.epoch, self.cfg.epochs)
                break
            lr = self.optimizer.param_groups[0]["lr"]
            start = time.perf_counter()
            stats = self.train_epoch()
            seconds = time.perf_counter() - start
            max_batches = 1 if self.cfg.dry_run else None
            result = evaluate_torch(
                self.model, self.arch, self.test_split, self.device, self.cfg.eval_batch_size, max_batches
            )
            val = self._validate(max_batches)
            self.epoch += 1
            row = {
                "epoch": self.epoch,
                **{k: round(v, 6) for k, v in stats.items() if k != "train_images"},
                "test_loss": round(result.loss, 6),
                "test_error": result.test_error,
                "test_n": result.n,
                **val,
                "lr": lr,
                "seconds": round(seconds, 2),
                "images_per_second": round(stats["train_images"] / seconds, 1),
                "precision": "bfloat16-mixed" if self.amp else "float32",
            }
            last_seconds = time.perf_counter() - start
            log.info("epoch %d: %s", self.epoch, json.dumps(row))
            if self.cfg.dry_run:
                self.history.append(row)
                break
            self._end_epoch(row)
        return self.history

    def _validate(self, max_batches: int | None) -> dict[str, Any]:
        """Loss and error on the held-out training images (`--val-split`); empty without a validation set."""
        if self.val_data is None:
            return {}
        result = evaluate_torch(
            self.model, self.arch, self.val_data, self.device, self.cfg.eval_batch_size, max_batches
        )
        return {"val_loss": round(result.loss, 6), "val_error": result.test_error, "val_n": result.n}

    def save_last(self) -> None:
        """Write <out>/last.pt (main process only; nothing without an output directory)."""
        if self.info.is_main and self.out is not None:
            save_checkpoint(self.out / "last.pt", self._state())

    def _end_epoch(self, row: dict[str, Any]) -> None:
        self.history.append(row)
        if not self.info.is_main or self.out is None:
            return
        self.out.mkdir(parents=True, exist_ok=True)
        with open(self.out / "metrics.jsonl", "a") as f:
            f.write(json.dumps(row) + "\n")
        draw_curve(self.history, self.out / "training_curve.png")
        is_best = row["test_error"] < self.best_test_error
        if is_best:
            self.best_test_error = row["test_error"]
        is_best_val = "val_error" in row and row["val_error"] < self.best_val_error
        if is_best_val:
            self.best_val_error = row["val_error"]
        state = self._state()
        save_checkpoint(self.out / "last.pt", state)
        if is_best:
            save_checkpoint(self.out / "best.pt", state)
        if is_best_val:
            save_checkpoint(self.out / "best_val.pt", state)


def hold_out(split: MNISTSplit, n: int, seed: int) -> tuple[MNISTSplit, MNISTSplit | None]:
    """Split off `n` images chosen by a permutation seeded with `seed` for validation: (train, validation)."""
    if n <= 0:
        return split, None
    if n >= len(split):
        raise ValueError(f"--val-split {n} leaves no training images (the training set has {len(split)})")
    order = np.random.default_rng(seed).permutation(len(split))
    keep, held = np.sort(order[n:]), np.sort(order[:n])
    return (
        MNISTSplit(split.images[keep], split.labels[keep], split.sha256),
        MNISTSplit(split.images[held], split.labels[held]),
    )


def to_float_t(images: torch.Tensor) -> torch.Tensor:
    return images.to(torch.float32) / 255.0


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="capsnet-train", description="Train a capsule network on MNIST.")
    p.add_argument(
        "--data-dir", default=None, help="directory with the MNIST IDX files, .gz or raw (default: $CAPSNET_DATA_DIR)"
    )
    p.add_argument(
        "--out",
        default="runs/capsnet",
        help="output directory for checkpoints, metrics.jsonl and the curve (default: runs/capsnet)",
    )
    p.add_argument(
        "--arch",
        default="dynamic",
        choices=sorted(ARCHITECTURES),
        help="dynamic routing (Sabour 2017), EM routing (Hinton 2018) or the paper's baseline CNN (default: dynamic)",
    )
    p.add_argument(
        "--preset",
        default="paper",
        choices=["paper", "small", "tiny"],
        help="model size: the paper's; small, the EM paper's A=64, B=8, C=D=16 network (--arch em only); "
        "or tiny for smoke tests (default: paper)",
    )
    p.add_argument(
        "--routing", default=None, choices=["sabour", "normalized"], help="dynamic-routing variant (default: sabour)"
    )
    p.add_argument("--routing-iterations", type=int, default=None, help="routing iterations (default: 3)")
    p.add_argument("--epochs", type=int, default=30, help="total epochs to train to (default: 30)")
    p.add_argument("--batch-size", type=int, default=128, help="batch size per process (default: 128)")
    p.add_argument("--lr", type=float, default=1e-3, help="Adam learning rate (default: 0.001)")
    p.add_argument(
        "--lr-decay", type=float, default=0.96, help="exponential learning-rate decay per epoch (default: 0.96)"
    )
    p.add_argument("--max-shift", type=int, default=2, help="random shift augmentation in pixels (default: 2)")
    p.add_argument(
        "--canvas",
        type=int,
        default=28,
        help="centre the 28x28 digits on a canvas this size; 40 with --max-shift 6 places them anywhere on "
        "40x40, the affine experiment's training protocol (default: 28, no padding)",
    )
    p.add_argument("--device", default="auto", choices=["auto", "cpu", "cuda"], help="device (default: auto)")
    p.add_argument(
        "--amp",
        action="store_true",
        help="bfloat16 mixed precision for the convolutions on CUDA or on CPUs with AVX512-BF16/AMX; "
        "capsule math stays float32 (default: off)",
    )
    p.add_argument(
        "--max-minutes",
        type=float,
        default=None,
        help="time budget: start no epoch that would end past it (judged by the last epoch), then exit 3 "
        "with last.pt written; continue with --resume (default: none)",
    )
    p.add_argument("--resume", default=None, metavar="CKPT", help="resume from a checkpoint (default: start fresh)")
    p.add_argument(
        "--val-split",
        type=int,
        default=0,
        metavar="N",
        help="hold out N training images (a permutation seeded by --seed) for validation; each epoch records "
        "val_error and the best one is saved as best_val.pt (default: 0, train on all 60,000)",
    )
    p.add_argument("--train-subset", type=int, default=None, help="train on the first N images only (default: all)")
    p.add_argument(
        "--test-subset", type=int, default=None, help="evaluate on the first N test images only (default: all)"
    )
    p.add_argument(
        "--dry-run", action="store_true", help="run one training and one evaluation batch, write nothing, exit"
    )
    p.add_argument("--seed", type=int, default=0, help="random seed (default: 0)")
    return p


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.max_minutes is not None and not args.max_minutes > 0:
        parser.error(f"--max-minutes must be positive, got {args.max_minutes}")
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    cfg = TrainConfig(
        arch=args.arch, preset=args.preset, routing=args.routing, routing_iterations=args.routing_iterations,
        epochs=args.epochs, batch_size=args.batch_size, lr=args.lr, lr_decay=args.lr_decay, max_shift=args.max_shift,
        canvas=args.canvas,
        seed=args.seed, device=args.device, amp=args.amp, val_split=args.val_split, train_subset=args.train_subset,
        test_subset=args.test_subset, dry_run=args.dry_run,
    )  # fmt: skip
    try:
        deadline = None if args.max_minutes is None else time.monotonic() + 60.0 * args.max_minutes
        trainer = Trainer(cfg, args.data_dir, None if args.dry_run else args.out, args.resume)
        history = trainer.fit(deadline)
    except (IDXError, FileNotFoundError, ValueError) as e:
        print(f"capsnet-train: error: {e}", file=sys.stderr)
        return 2
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()
    if history and trainer.info.is_main:
        print(json.dumps(history[-1]))
    if not args.dry_run and not trainer.finished:
        if trainer.info.is_main:
            print(
                f"capsnet-train: time budget spent at epoch {trainer.epoch} of {cfg.epochs}; continue with "
                f"--resume {Path(args.out) / 'last.pt'}",
                file=sys.stderr,
            )
        return EXIT_UNFINISHED
    return 0


if __name__ == "__main__":
    sys.exit(main())

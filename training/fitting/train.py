"""capsnet-train: MNIST classification (dynamic, EM, baseline) as a Task for the one loop in fitting/loop.py."""

from __future__ import annotations

import argparse
import json
import logging
import os
import shlex
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.distributed as dist
from torch import nn
from torch.utils.data import DistributedSampler

from training.data.generators import pad_split
from training.data.mnist import IDXError, MNISTSplit, load_split
from training.entry import bundled_repository, cli_error, data_dir_option, sibling_command
from training.export.rebuild import warm_start
from training.fitting.architectures import ARCHITECTURES, Architecture, get_architecture
from training.fitting.checkpoint import load_checkpoint
from training.fitting.config import TrainConfig
from training.fitting.device import keep_freed_memory, resolve_device
from training.fitting.evaluate import evaluate_torch
from training.fitting.exposure import SHARE, exposure_pool
from training.fitting.history import evaluated
from training.fitting.loop import EXIT_UNFINISHED, Autocast, DistInfo, Step, Trainer, init_distributed, on_terminal
from training.options import add_data_dir, add_device

log = logging.getLogger(__name__)


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


def model_config_for(cfg: TrainConfig) -> dict[str, Any]:
    overrides = dict(cfg.model_overrides)
    if cfg.routing is not None:
        overrides["routing"] = cfg.routing
    if cfg.routing_iterations is not None:
        overrides["routing_iterations"] = cfg.routing_iterations
    if cfg.canvas != 28:
        overrides["image_size"] = cfg.canvas
    return get_architecture(cfg.arch).make_config(cfg.preset, overrides)


def shuffled(n: int, seed: int, shuffle: int, info: DistInfo) -> torch.Tensor:
    """This rank's share of the `shuffle`-th seeded permutation of range(n) (a DistributedSampler)."""
    sampler: DistributedSampler[int] = DistributedSampler(
        range(n),  # type: ignore[arg-type]  # any sized sequence works
        num_replicas=info.world_size,
        rank=info.rank,
        shuffle=True,
        seed=seed,
        drop_last=False,
    )
    sampler.set_epoch(shuffle)
    return torch.tensor(list(sampler), dtype=torch.long)


def epoch_indices(n: int, cfg: TrainConfig, epoch: int, info: DistInfo) -> torch.Tensor:
    """This rank's training indices for `epoch` (0-based): a pass over one shuffle of the n images, seeded by the
    seed and the epoch; or, with `cfg.epoch_images`, the epoch's consecutive piece of that many images of one
    stream of such shuffles (shuffle k, then k + 1, ...), so shorter epochs still see every image once a pass.
    """
    if cfg.epoch_images is None:
        return shuffled(n, cfg.seed, epoch, info)
    per_rank = -(-cfg.epoch_images // info.world_size)  # ceil: this rank's images per epoch
    share = -(-n // info.world_size)  # this rank's images per shuffle (DistributedSampler pads to an even split)
    start, stop = epoch * per_rank, (epoch + 1) * per_rank
    parts = [shuffled(n, cfg.seed, k, info) for k in range(start // share, (stop - 1) // share + 1)]
    first = (start // share) * share
    return torch.cat(parts)[start - first : stop - first]


def epoch_batches(n: int, cfg: TrainConfig, epoch: int, info: DistInfo) -> list[torch.Tensor]:
    """This rank's shuffled index batches for `epoch` (see `epoch_indices`)."""
    return list(torch.split(epoch_indices(n, cfg, epoch, info), cfg.batch_size))


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


@dataclass
class ClassificationData:
    """The splits a classification run trains and is judged on, padded to the run's canvas."""

    train: MNISTSplit
    test: MNISTSplit
    val: MNISTSplit | None
    hashes: dict[str, str]  # sha256 of the files read, for checkpoints and the model card

    @classmethod
    def load(cls, cfg: TrainConfig, data_dir: str | None) -> ClassificationData:
        """MNIST from `data_dir`: `cfg.val_split` training images held out, subsets taken, centred on the canvas."""
        train, test = load_split(data_dir, "train"), load_split(data_dir, "test")
        hashes = {**train.sha256, **test.sha256}
        train, val = hold_out(train, cfg.val_split, cfg.seed)
        return cls(
            train=pad_split(train.subset(cfg.train_subset), cfg.canvas),
            test=pad_split(test.subset(cfg.test_subset), cfg.canvas),
            val=pad_split(val, cfg.canvas) if val is not None else None,
            hashes=hashes,
        )


class ClassificationTask:
    """Single-label digits: seeded shuffles and random shifts (§5), the architecture's loss, test and val error."""

    def __init__(
        self, cfg: TrainConfig, arch: Architecture, data: ClassificationData, device: torch.device, info: DistInfo
    ) -> None:
        self.cfg, self.arch, self.device, self.info = cfg, arch, device, info
        self.train_split, self.test_split, self.val_data = data.train, data.test, data.val
        self.data_hashes = data.hashes
        self.train_images = torch.from_numpy(data.train.images)
        self.train_labels = torch.from_numpy(data.train.labels)
        self.shifts = torch.Generator()
        self.warm_start = False  # a model trained before: the loss sees training as done (EM's margin stays 0.9)

    def batches(self, epoch: int) -> list[torch.Tensor]:
        self.shifts.manual_seed(self.cfg.seed * 100_003 + epoch * 101 + self.info.rank)
        return epoch_batches(len(self.train_split), self.cfg, epoch, self.info)

    def step(self, model: nn.Module, batch: torch.Tensor, progress: float, autocast: Autocast) -> Step:
        images = random_shift(to_float_t(self.train_images[batch]), self.cfg.max_shift, self.shifts).to(self.device)
        labels = self.train_labels[batch].to(self.device)
        with autocast():
            out = self.arch.forward(model, images, labels)
        loss = self.arch.loss(out, images, labels, self.loss_progress(progress))
        correct = int((self.arch.scores(out).argmax(dim=1) == labels).sum())
        return Step(loss.total, {k: v.detach() for k, v in loss.parts.items()}, len(batch), correct)

    def loss_progress(self, progress: float) -> float:
        """The training progress the loss sees: done (1.0) for a warm start, whose model went through any ramp."""
        return 1.0 if self.warm_start else progress

    def evaluate(self, model: nn.Module, max_batches: int | None) -> dict[str, Any]:
        """Loss and error on the test set, and on the held-out training images where there are some (a progress
        bar on a terminal, a log line elsewhere)."""
        row: dict[str, Any] = {}
        bar = self.info.is_main and on_terminal()
        for prefix, split in (("test", self.test_split), ("val", self.val_data)):
            if split is not None:
                if self.info.is_main and not bar:
                    log.info("evaluating on %s %s images", f"{len(split):,}", prefix)
                result = evaluate_torch(
                    model, self.arch, split, self.device, self.cfg.eval_batch_size, max_batches, progress=bar
                )
                row |= {f"{prefix}_loss": round(result.loss, 6), f"{prefix}_error": result.test_error}
                row[f"{prefix}_n"] = result.n
        return row

    def state_dict(self) -> dict[str, Any]:
        """The shift generator's position (the shuffles and the generator's seed are the epoch's)."""
        return {"shifts": self.shifts.get_state()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Put the shift generator where a checkpoint left it (older checkpoints have no state: nothing to do)."""
        if "shifts" in state:
            self.shifts.set_state(state["shifts"])


def take(out: Any, n: int, start: int = 0) -> Any:
    """Rows start..start+n of every tensor of a model's output tuple (CapsNetOutput, EMCapsNetOutput)."""
    return type(out)(*(t[start : start + n] for t in out))


class ExposureTask(ClassificationTask):
    """ClassificationTask whose every step also trains half a batch of non-digits to have no class present."""

    def __init__(
        self, cfg: TrainConfig, arch: Architecture, data: ClassificationData, device: torch.device, info: DistInfo
    ) -> None:
        if arch.absent is None:
            raise ValueError(
                f"--exposure needs an architecture whose scores can say that no class is present (dynamic or em), "
                f"not {arch.name!r}"
            )
        if cfg.exposure < 1:
            raise ValueError(f"--exposure must be at least 1 non-digit image, got {cfg.exposure}")
        super().__init__(cfg, arch, data, device, info)
        if info.is_main:
            log.info("drawing %s non-digit images for outlier exposure", f"{cfg.exposure:,}")
        self.pool = torch.from_numpy(exposure_pool(cfg.exposure, cfg.seed, data.train))
        self.draws = torch.Generator()

    def batches(self, epoch: int) -> list[torch.Tensor]:
        self.draws.manual_seed(self.cfg.seed * 100_019 + epoch * 103 + self.info.rank)
        return super().batches(epoch)

    def step(self, model: nn.Module, batch: torch.Tensor, progress: float, autocast: Autocast) -> Step:
        """One forward over the digits and the non-digits together (DDP sees one forward per step); the digits'
        loss from their rows, the non-digits' "no class present" loss from theirs."""
        n = len(batch)
        picks = torch.randint(len(self.pool), (max(1, round(n * SHARE)),), generator=self.draws)
        digits = to_float_t(self.train_images[batch])
        others = to_float_t(self.pool[picks])
        images = random_shift(torch.cat([digits, others]), self.cfg.max_shift, self.shifts).to(self.device)
        labels = self.train_labels[batch].to(self.device)
        decoder_labels = torch.cat([labels, torch.zeros(len(picks), dtype=labels.dtype, device=self.device)])
        with autocast():
            out = self.arch.forward(model, images, decoder_labels)  # the non-digits' reconstructions go unused
        mine = take(out, n)
        loss = self.arch.loss(mine, images[:n], labels, self.loss_progress(progress))
        absent = self.arch.absent(take(out, len(picks), n))  # type: ignore[misc]  # checked in __init__
        correct = int((self.arch.scores(mine).argmax(dim=1) == labels).sum())
        parts = {**{k: v.detach() for k, v in loss.parts.items()}, "absent_loss": absent.detach()}
        return Step(loss.total + self.cfg.exposure_weight * absent, parts, n, correct)

    def state_dict(self) -> dict[str, Any]:
        return {**super().state_dict(), "draws": self.draws.get_state()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        super().load_state_dict(state)
        if "draws" in state:
            self.draws.set_state(state["draws"])


TaskFactory = Callable[[TrainConfig, Architecture, ClassificationData, torch.device, DistInfo], ClassificationTask]


def mnist_trainer(
    cfg: TrainConfig,
    data_dir: str | None,
    out_dir: str | os.PathLike[str] | None,
    resume: str | None = None,
    strict_resume: bool = False,
    make_task: TaskFactory = ClassificationTask,
    init_from: str | os.PathLike[str] | None = None,
) -> Trainer[ClassificationTask]:
    """The Trainer of a capsnet-train run: MNIST from `data_dir`, the model `cfg` describes, seeded by `cfg.seed`.

    `make_task` builds the task from the loaded data (default: ClassificationTask; a subclass may judge more; with
    `cfg.exposure`, ExposureTask, which also trains on non-digits).
    `init_from`: a model directory of the same architecture and model config to take the first weights from
    (rebuilt from its graphs and checked against them on the test images); the rest of the run is seeded as
    without it, and the optimizer and schedule start fresh.
    """
    if cfg.exposure:
        if make_task is not ClassificationTask:
            raise ValueError("outlier exposure (--exposure) trains plain MNIST classification only")
        make_task = ExposureTask
    info = init_distributed(cfg.device)
    device = resolve_device(cfg.device)
    if device.type == "cuda" and info.world_size > 1:
        device = torch.device("cuda", info.local_rank)
    arch = get_architecture(cfg.arch)
    data = ClassificationData.load(cfg, data_dir)
    model_config = model_config_for(cfg)
    start = None if init_from is None else warm_start(init_from, cfg.arch, model_config, data.test)
    torch.manual_seed(cfg.seed)
    model = arch.build(model_config).to(device)
    if start is not None:
        model.load_state_dict(start.state_dict)
        log.info("initialised from %s (version %s)", init_from, start.provenance["version"])
    task = make_task(cfg, arch, data, device, info)
    provenance = None if start is None else start.provenance
    trainer = Trainer(cfg, task, model, model_config, out_dir, resume, strict_resume, info, init_from=provenance)
    task.warm_start = trainer.init_from is not None  # a warm start, or a run resumed from one
    return trainer


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="capsnet-train", description="Train a capsule network on MNIST.")
    add_data_dir(p, "directory with the MNIST IDX files, .gz or raw")
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
    p.add_argument(
        "--routing-iterations",
        type=int,
        default=None,
        help="routing iterations (default: 3 for --arch dynamic, 2 for --arch em)",
    )
    p.add_argument("--epochs", type=int, default=30, help="total epochs to train to, at least 1 (default: 30)")
    p.add_argument("--batch-size", type=int, default=128, help="batch size per process (default: 128)")
    p.add_argument(
        "--lr",
        type=float,
        default=None,
        help="Adam learning rate (default: the architecture's, 0.01 for --arch em and 0.001 for the others)",
    )
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
    add_device(p)
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
        help="time budget: start no epoch, and inside one no step, that would end past it (judged by the last "
        "epoch, the recent steps), then exit 3 with last.pt written; continue with --resume (default: none)",
    )
    p.add_argument(
        "--checkpoint-minutes",
        type=float,
        default=10.0,
        metavar="M",
        help="inside an epoch, write last.pt every M minutes too, so a killed run loses at most that; "
        "0: only at the end of epochs and at the time budget (default: 10)",
    )
    p.add_argument("--resume", default=None, metavar="CKPT", help="resume from a checkpoint (default: start fresh)")
    p.add_argument(
        "--init-from",
        default=None,
        metavar="MODEL_DIR",
        help="start a new run from the weights of a model directory (e.g. model/zoo/capsnet-mnist), whose "
        "architecture and model_config must be the ones these options build; the optimizer state, the epoch "
        "counter and the learning-rate schedule start fresh (--lr is the first epoch's); not with --resume "
        "(default: none, random initialisation)",
    )
    p.add_argument(
        "--exposure",
        type=int,
        default=0,
        metavar="N",
        help='outlier exposure: draw N non-digit images (the "not a digit" score\'s fitting sets and turned '
        "training digits, seeded by --seed) and add half a batch of them to every step, trained to have no class "
        'present, so the capsule lengths (EM: activations) say "not a digit"; dynamic and em only '
        "(default: 0, off)",
    )
    p.add_argument(
        "--exposure-weight",
        type=float,
        default=0.5,
        metavar="W",
        help="with --exposure: the weight of the non-digits' \"no class present\" loss beside the digits' "
        "(default: 0.5)",
    )
    p.add_argument(
        "--val-split",
        type=int,
        default=0,
        metavar="N",
        help="hold out N training images (a permutation seeded by --seed) for validation; each epoch records "
        "val_error and the best one is saved as best_val.pt (default: 0, train on all 60,000)",
    )
    p.add_argument(
        "--ema",
        type=float,
        default=None,
        metavar="DECAY",
        help="evaluate, select and save an exponential moving average of the weights, updated after every step; "
        "at update n its decay is min(DECAY, (1 + n) / (10 + n)), which reaches 0.999 after about 9,000 updates "
        "and then averages over about the last 1,000 steps; the trained weights are kept beside it to resume "
        "from. Switched on when resuming, it starts from the resumed weights; 0 switches it off "
        "(default: the resumed checkpoint's setting with --resume, else 0)",
    )
    p.add_argument("--train-subset", type=int, default=None, help="train on the first N images only (default: all)")
    p.add_argument(
        "--epoch-images",
        type=int,
        default=None,
        metavar="N",
        help="an epoch is N training images, consecutive pieces of one stream of seeded shuffles (every image "
        "once per pass); the learning rate still decays by --lr-decay per epoch, so scale it (default: the "
        "whole training set)",
    )
    p.add_argument(
        "--test-subset", type=int, default=None, help="evaluate on the first N test images only (default: all)"
    )
    p.add_argument(
        "--eval-every",
        type=int,
        default=1,
        metavar="N",
        help="evaluate after every N-th epoch, after the last, and after the last one before --max-minutes stops "
        "the run; only evaluated epochs can become best.pt, and the others' rows in metrics.jsonl have no test "
        "columns; a resumed run may change it (default: 1, every epoch)",
    )
    p.add_argument(
        "--dry-run",
        action="store_true",
        help="run one training and one evaluation batch, print the epoch's JSON, write nothing (default: off)",
    )
    p.add_argument("--seed", type=int, default=0, help="random seed (default: 0)")
    return p


def check_arguments(parser: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    """Usage errors (exit 2) for values argparse's types let through."""
    if args.epochs < 1:
        parser.error(f"--epochs must be at least 1, got {args.epochs}")
    if args.batch_size < 1:
        parser.error(f"--batch-size must be at least 1, got {args.batch_size}")
    if args.lr is not None and not args.lr > 0:
        parser.error(f"--lr must be positive, got {args.lr}")
    if args.eval_every < 1:
        parser.error(f"--eval-every must be at least 1, got {args.eval_every}")
    if args.epoch_images is not None and args.epoch_images < 1:
        parser.error(f"--epoch-images must be at least 1, got {args.epoch_images}")
    if args.max_minutes is not None and not args.max_minutes > 0:
        parser.error(f"--max-minutes must be positive, got {args.max_minutes}")
    if args.ema is not None and not 0 <= args.ema < 1:
        parser.error(f"--ema must be at least 0 and below 1, got {args.ema}")
    if not args.checkpoint_minutes >= 0:
        parser.error(f"--checkpoint-minutes must be 0 or more, got {args.checkpoint_minutes}")
    if args.exposure < 0:
        parser.error(f"--exposure must be 0 (off) or a number of non-digit images, got {args.exposure}")
    if args.exposure and get_architecture(args.arch).absent is None:
        parser.error(f"--exposure needs a capsule architecture (dynamic or em), not --arch {args.arch}")
    if not args.exposure_weight > 0:
        parser.error(f"--exposure-weight must be positive, got {args.exposure_weight}")
    if args.init_from is not None and args.resume is not None:
        parser.error(
            "--init-from and --resume cannot be combined: --init-from starts a new run from a model directory's "
            "weights, --resume continues a checkpoint with its own"
        )


def learning_rate(args: argparse.Namespace) -> float:
    """--lr, else the default of the chosen architecture."""
    return float(args.lr) if args.lr is not None else get_architecture(args.arch).default_lr


def closing_lines(out: Path, data_dir: str | None) -> list[str]:
    """What a finished run wrote (with the best epoch) and what to run next: evaluate, export to a new name."""
    written = ("metrics.jsonl", "training_curve.png", "last.pt", "best.pt", "best_val.pt")
    files = [f for f in written if (out / f).exists()]
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines() if line.strip()]
    best = min(evaluated(rows), key=lambda r: (r["test_error"], r["epoch"]))  # the last epoch always is
    name = out.resolve().name.lower()
    zoo = bundled_repository()
    while (zoo / name).exists():  # a new name: never the bundled models' (capsnet-export refuses them anyway)
        name += "-2"
    data = data_dir_option(data_dir)
    checkpoint = shlex.quote(str(out / "best.pt"))
    target = shlex.quote(str(Path("model") / "zoo" / name))
    return [
        f"capsnet-train: wrote {', '.join(files)} to {out}; best.pt is epoch {best['epoch']} "
        f"(test error {best['test_error']:.2%})",
        f"next: evaluate it:  {sibling_command('capsnet-evaluate')} --checkpoint {checkpoint}{data}",
        f"      export it to a model directory of its own:  {sibling_command('capsnet-export')} {checkpoint} "
        f"--out {target}{data}",
    ]


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    check_arguments(parser, args)
    if args.init_from is not None and args.val_split > 0:
        print(
            f"capsnet-train: warning: --val-split {args.val_split} with --init-from: if {args.init_from} was "
            "trained on all 60,000 training images, the held-out ones were seen and val_error is optimistic",
            file=sys.stderr,
        )
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    keep_freed_memory()
    cfg = TrainConfig(
        arch=args.arch, preset=args.preset, routing=args.routing, routing_iterations=args.routing_iterations,
        epochs=args.epochs, batch_size=args.batch_size, lr=learning_rate(args), lr_decay=args.lr_decay,
        max_shift=args.max_shift, canvas=args.canvas, ema=args.ema or 0.0,
        seed=args.seed, device=args.device, amp=args.amp, val_split=args.val_split, train_subset=args.train_subset,
        test_subset=args.test_subset, epoch_images=args.epoch_images, eval_every=args.eval_every, dry_run=args.dry_run,
        exposure=args.exposure, exposure_weight=args.exposure_weight,
    )  # fmt: skip
    try:
        deadline = None if args.max_minutes is None else time.monotonic() + 60.0 * args.max_minutes
        out = None if args.dry_run else args.out
        if args.ema is None and args.resume is not None:  # a resumed run keeps its average unless told otherwise
            cfg = replace(cfg, ema=float(load_checkpoint(args.resume).get("train_config", {}).get("ema", 0.0)))
        trainer = mnist_trainer(cfg, args.data_dir, out, args.resume, init_from=args.init_from)
        history = trainer.fit(deadline, args.checkpoint_minutes or None)
    except (IDXError, FileNotFoundError, ValueError) as e:  # RebuildError (--init-from) is a ValueError
        return cli_error("capsnet-train", e)
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()
    if history and trainer.info.is_main:
        print(json.dumps(history[-1]))
    if not args.dry_run and trainer.finished and trainer.info.is_main:
        print("\n".join(closing_lines(Path(args.out), args.data_dir)), file=sys.stderr)
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

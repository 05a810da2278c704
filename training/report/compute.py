"""What a trained section cost and how far it got: FLOPs per image, shortened epochs, and the progress of a run."""

from __future__ import annotations

import logging
import math
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from training.fitting.architectures import get_architecture
from training.fitting.checkpoint import load_checkpoint

log = logging.getLogger(__name__)

PAPER_LR_DECAY = 0.96  # the learning rate's decay per pass over the training set (this repo's schedule)
CHECKPOINT_MINUTES = 10.0  # a report training writes last.pt this often inside an epoch too


def lr_decay_per_epoch(epoch_images: int | None, train_images: int, per_pass: float = PAPER_LR_DECAY) -> float:
    """The decay per epoch that makes `per_pass` per pass over `train_images` when an epoch is `epoch_images`."""
    if epoch_images is None or epoch_images >= train_images:
        return per_pass
    return float(per_pass ** (epoch_images / train_images))


def count_flops(step: Callable[[], Any]) -> int:
    """Floating-point operations of `step()` (convolutions and matrix products), counted by torch.

    The global random state is left as it was, so counting never changes a training run that goes on after it.
    """
    from torch.utils.flop_counter import FlopCounterMode

    counter = FlopCounterMode(display=False)
    with torch.random.fork_rng(devices=[]), counter:
        step()
    return int(counter.get_total_flops())


def model_costs(arch_name: str, model_config: dict[str, Any], shape: tuple[int, int, int]) -> dict[str, int]:
    """Parameters, and FLOPs per image of a training step (forward, the architecture's loss, backward) and of
    inference.

    Counted on a freshly built model with a batch of two random images (`shape` is one image, (C, H, W)); the
    global random state is left as it was.
    """
    arch = get_architecture(arch_name)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        model = arch.build(model_config)
        images, labels = torch.rand(2, *shape), torch.tensor([0, 1])

    def train_step() -> None:
        model.train()
        arch.loss(arch.forward(model, images, labels), images, labels, 0.0).total.backward()

    def inference() -> None:
        model.eval()
        with torch.no_grad():
            arch.forward(model, images, None)

    return {
        "parameters": sum(p.numel() for p in model.parameters()),
        "train_flops_per_image": count_flops(train_step) // 2,
        "inference_flops_per_image": count_flops(inference) // 2,
    }


def steps_into_epoch(run_dir: Path | None) -> tuple[int, float] | None:
    """A run stopped inside an epoch: the steps of it done and their training seconds (None: between epochs)."""
    last = run_dir / "last.pt" if run_dir is not None else None
    if last is None or not last.is_file():
        return None
    mid = load_checkpoint(last).get("mid_epoch")
    if not mid:
        return None
    return int(mid["step"]), float(sum(rank.get("seconds", 0.0) for rank in mid["ranks"][:1]))


def progress(
    history: list[dict[str, Any]],
    epochs: int,
    epoch_images: int | None,
    train_images: int,
    run: tuple[Path | None, int] | None = None,
) -> dict[str, Any]:
    """How far a trained model got: epochs and training images done and planned, and the training time spent.

    `run` is (its run directory, its batch size): an unfinished run's place inside its next epoch is read there.
    """
    per_epoch = epoch_images if epoch_images is not None else train_images
    done: dict[str, Any] = {
        "epochs_done": len(history),
        "epochs_planned": epochs,
        "images_per_epoch": per_epoch,
        "images_done": len(history) * per_epoch,
        "images_planned": epochs * per_epoch,
        "train_hours": round(sum(float(row.get("seconds", 0.0)) for row in history) / 3600.0, 3),
        "finished": len(history) >= epochs,
    }
    if run is not None and not done["finished"] and (inside := steps_into_epoch(run[0])) is not None:
        steps, seconds = inside
        done["next_epoch"] = {"steps_done": steps, "steps": math.ceil(per_epoch / run[1]), "hours": seconds / 3600}
    return done


def progress_line(name: str, p: dict[str, Any], unit: str = "images") -> str:
    """One sentence: `name`'s epochs and `unit` done of those planned, and its training time."""
    state = "finished" if p["finished"] else "**unfinished**"
    inside = ""
    if nxt := p.get("next_epoch"):
        hours = f" ({nxt['hours']:.2f} h)" if "hours" in nxt else ""
        inside = f", and {nxt['steps_done']} of the {nxt['steps']} steps of epoch {p['epochs_done'] + 1}{hours}"
    return (
        f"{name}: {state}, {p['epochs_done']} of {p['epochs_planned']} epochs of {p['images_per_epoch']:,} {unit} "
        f"({p['images_done']:,} of {p['images_planned']:,} training {unit}) in {p['train_hours']:.2f} h of "
        f"training{inside}."
    )


def continue_note(command: str) -> str:
    """What a section with an unfinished model says about continuing it."""
    return (
        f"**Partial result.** The numbers above are those of the epochs done so far. `{command}` continues every "
        "unfinished model from its last checkpoint under `--runs` (in chunks of `--max-minutes`; exit status 3 "
        "means there is more to do) and rewrites this section."
    )


def further_note(command: str, prog: dict[str, Any], left: str) -> str:
    """What a section whose runs did finish, but short of the paper's training, says is left and how to go on.

    The command is the section's own with `--epochs` doubled: with `--runs`, the runs there continue from their
    last checkpoints (the learning rate goes on decaying per epoch); the time it takes is estimated from the
    epochs done.
    """
    epochs = int(prog["epochs_planned"])
    longer, found = re.subn(r"--epochs[ =]\d+", f"--epochs {2 * epochs}", command)
    if not found:
        longer = f"{command} --epochs {2 * epochs}"
    per_epoch = float(prog["train_hours"]) / max(int(prog["epochs_done"]), 1)
    if "--runs" in command:
        what, hours = f"trains {epochs} more epochs from the last checkpoints under `--runs`", per_epoch * epochs
    else:
        what, hours = (
            f"trains all {2 * epochs} epochs from the start, with no checkpoints to continue",
            per_epoch * 2 * epochs,
        )
    chunks = (
        "; it stops after `--max-minutes` with exit status 3 and is repeated until it exits 0"
        if "--max-minutes" in command
        else ""
    )
    return (
        f"**What is left.** {left} `{longer}` {what} (about {hours:.1f} h more of training on the same "
        f"machine{chunks}) and rewrites the section in the report under its `--out`."
    )


def closing_note(command: str, prog: dict[str, Any] | None, short_of_paper: str | None) -> list[str]:
    """A section's last paragraph about going on: how to continue unfinished runs, or what is left when they
    finished short of the paper (`short_of_paper` says what), or nothing."""
    if prog is None:
        return []
    if not prog["finished"]:
        return [continue_note(command), ""]
    return [further_note(command, prog, short_of_paper), ""] if short_of_paper else []


def evaluated_when(eval_every: int) -> str:
    """How often a run was evaluated, as the compute sentences say it (`TrainConfig.eval_every`)."""
    if eval_every <= 1:
        return "after every epoch"
    return f"every {eval_every} epochs and wherever training stopped"


def compute_sentence(train: dict[str, Any], train_images: int, costs: dict[str, int]) -> str:
    """What one trained model was given: epochs, images per epoch, batch, precision, schedule, evaluation, FLOPs."""
    per_epoch = train.get("epoch_images") or train_images
    passes = train["epochs"] * per_epoch / train_images
    precision = "bfloat16 convolutions (autocast)" if train.get("amp") else "float32"
    evaluation = f"the first {train['test_subset']:,}" if train.get("test_subset") else "all"
    when = evaluated_when(train.get("eval_every", 1))
    return (
        f"{train['epochs']} epochs of {per_epoch:,} images ({passes:.2f} passes over the {train_images:,} "
        f"training digits), batch {train['batch_size']}, {precision}, Adam lr {train['lr']:g} decaying by "
        f"{train['lr_decay']:.5g} per epoch ({PAPER_LR_DECAY:g} per pass); evaluated {when} on "
        f"{evaluation} test digits; {costs['train_flops_per_image'] / 1e9:.2f} GFLOP per training image, "
        f"{costs['inference_flops_per_image'] / 1e9:.2f} GFLOP per inference"
    )


def trained_on(machine: dict[str, Any]) -> str:
    """Where a section's models trained, from its saved machine description: GPU, or CPUs, threads, nice, load."""
    if machine.get("gpu"):
        return f"a {machine['gpu']} GPU"
    cpu = machine.get("cpu_model") or machine.get("processor") or "unknown CPU"
    threads = machine.get("torch_threads")
    parts = [f"{machine.get('cpu_count')} CPUs ({cpu})"]
    if threads:
        parts.append(f"{threads} torch thread{'s' if threads != 1 else ''}")
    if machine.get("nice"):
        parts.append(f"at nice {machine['nice']}")
    load = machine.get("load_average")
    where = ", ".join(parts)
    return f"{where}; load average {load[0]:g} when the result was saved" if load else where

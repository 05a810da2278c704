"""Run (or reuse) every section and write REPORT.md; the command line of `python -m training.report`."""

from __future__ import annotations

import argparse
import json
import logging
import os
import re
import shlex
import sys
import tempfile
import time
from dataclasses import replace
from pathlib import Path

import training.report
from service.contract import portable_command
from training.benchmarks.machine import cpu_busy_percent
from training.data.mnist import DATA_DIR_ENV, IDXError, resolve_data_dir
from training.fitting.device import resolve_device
from training.fitting.loop import EXIT_UNFINISHED
from training.options import add_data_dir, add_device
from training.report import affine, baseline, mnist_models, multimnist, perturbation, service_load, speed
from training.report.common import (
    REPO_ROOT,
    Context,
    NotMeasured,
    Sizes,
    Unfinished,
    git_commit,
    is_partial,
    load_result,
    now_utc,
    save_result,
)

log = logging.getLogger(__name__)

# --- the report -------------------------------------------------------------------------------------------

REPORT_SECTIONS = tuple(
    module.SECTION for module in (mnist_models, baseline, affine, multimnist, perturbation, speed)
)  # in the order of REPORT.md
BY_KEY = {section.key: section for section in REPORT_SECTIONS}
SECTIONS = tuple(BY_KEY)


def plan(ctx: Context, selected: set[str], reuse: bool) -> dict[str, str]:
    """What happens to each section: "run", "reuse" (its saved result), or "missing"."""
    actions = {}
    for key in SECTIONS:
        has_saved = load_result(ctx, key) is not None
        if key in selected and not (reuse and has_saved):
            actions[key] = "run"
        else:
            actions[key] = "reuse" if has_saved else "missing"
    return actions


def section_text(ctx: Context, key: str, action: str) -> str:
    """One section's markdown: run it (saving its result, or the partial result of an unfinished training), or
    render it from its saved result, or say that it is missing."""
    saved, reason = None, None
    if action == "run":
        log.info("running section %s", key)
        busy = cpu_busy_percent()  # before the section's own threads start
        try:
            result, arrays = BY_KEY[key].run(ctx)
            saved = save_result(ctx, key, result, arrays, busy=busy)
        except (NotMeasured, IDXError) as e:
            reason = str(e)
        except Unfinished as e:
            reason = f"In progress. {e}"
            ctx.unfinished.append(key)
            saved = load_result(ctx, key)  # an earlier complete result, if any, stays shown
            if saved is not None and not is_partial(saved):
                text = BY_KEY[key].render(ctx, saved, None).rstrip()
                return f"{text}\n\n> **{reason}** The figures above are from the earlier complete run.\n"
            if e.partial is not None:  # the epochs done so far, rendered as partial
                saved = save_result(ctx, key, *e.partial, busy=busy)
    elif action == "reuse":
        saved = load_result(ctx, key)
    else:
        reason = f"Run `python -m training.report --sections {key}` to produce it."
    return BY_KEY[key].render(ctx, saved, reason)


def splice(report: str, sections: list[str]) -> str:
    """`report` with every section whose heading line (`## …`) starts one of `sections` replaced by it."""
    blocks = re.split(r"(?m)^(?=## )", report)
    headings = [block.splitlines()[0] for block in blocks]
    for text in sections:
        heading = text.splitlines()[0]
        if heading not in headings:
            raise ValueError(f"{heading!r} is not a section of the existing report; write the whole report instead")
        blocks[headings.index(heading)] = text.rstrip() + "\n\n"
    return "".join(blocks).rstrip() + "\n"


def build_report(ctx: Context, selected: set[str], reuse: bool, update: bool = False) -> Path:
    """Run (or reuse) every section, draw the figures and write <out>/REPORT.md.

    With `update`, only the `selected` sections are run (or rendered from saved results) and replace their
    namesakes in the existing REPORT.md; everything else in it stays as it is.
    """
    ctx.figures.mkdir(parents=True, exist_ok=True)
    path = ctx.out / "REPORT.md"
    if update:
        actions = {k: a for k, a in plan(ctx, selected, reuse).items() if k in selected}
        path.write_text(splice(path.read_text(), [section_text(ctx, k, a) for k, a in actions.items()]))
        return path
    parts = [
        "# Evaluation and benchmark report",
        "",
        f"Generated {now_utc()} by `{ctx.command}` at commit {git_commit() or 'unknown'}. Each section names the "
        "command and time that produced its numbers; “not yet measured” marks results that have not been "
        "produced yet. Nothing here is estimated or copied in, apart from the papers' figures, which are labelled.",
        "",
    ]
    if ctx.tiny:
        parts += [
            "> **TINY MODE**: tiny models on tiny synthetic inputs for one epoch. The numbers below test the "
            "pipeline and mean nothing about the models.",
            "",
        ]
    parts += [section_text(ctx, key, action) for key, action in plan(ctx, selected, reuse).items()]
    parts.append(service_load.render_service(ctx))
    ctx.out.mkdir(parents=True, exist_ok=True)
    path.write_text("\n".join(parts).rstrip() + "\n")
    return path


def find_data_dir(given: str | None, reading: list[str]) -> str | None:
    """The MNIST directory (--data-dir, else $CAPSNET_DATA_DIR), or None when no section in `reading` is to run.

    A directory named but not there is an error (IDXError, a ValueError), as is none named when `reading` is not empty.
    """
    if given is not None or os.environ.get(DATA_DIR_ENV):
        return str(resolve_data_dir(given))
    if reading:
        raise IDXError(
            f"no MNIST data directory given: pass --data-dir or set ${DATA_DIR_ENV} (sections {', '.join(reading)} "
            "read MNIST; --sections speed runs without it)"
        )
    return None


def channels(text: str) -> tuple[int, ...]:
    """`--affine-cnn-channels`: three positive integers separated by commas."""
    try:
        values = tuple(int(v) for v in text.split(","))
    except ValueError:
        values = ()
    if len(values) != 3 or min(values) < 1:
        raise argparse.ArgumentTypeError(f"expected three positive channel counts like 64,64,32, got {text!r}")
    return values


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m training.report", description=(training.report.__doc__ or "").splitlines()[0]
    )
    add_data_dir(p)
    p.add_argument("--out", default="docs", help="where REPORT.md and report/ go (default: docs)")
    p.add_argument(
        "--zoo", default=str(REPO_ROOT / "model" / "zoo"), help="bundled model directories (default: model/zoo)"
    )
    p.add_argument(
        "--model",
        default=None,
        help="model directory or checkpoint for Figure 4, model directory for speed "
        "(default: the zoo's first dynamic-routing model)",
    )
    p.add_argument("--tiny", action="store_true", help="tiny models, one epoch, tiny speed runs (default: off)")
    p.add_argument("--reuse", action="store_true", help="reuse saved results instead of running again (default: off)")
    p.add_argument(
        "--sections",
        nargs="+",
        default=["all"],
        choices=[*SECTIONS, "all", "none"],
        help="sections to run; the others are rendered from saved results (default: all)",
    )
    p.add_argument("--epochs", type=int, default=None, help="epochs of every trained model (default: 30; tiny: 1)")
    p.add_argument(
        "--epoch-images",
        type=int,
        default=None,
        metavar="N",
        help="an epoch of every trained model is N training images (consecutive pieces of one stream of seeded "
        "shuffles; MultiMNIST: N composites), the learning rate decaying 0.96 per pass over the training set "
        "(default: the whole set)",
    )
    p.add_argument(
        "--test-images",
        type=int,
        default=None,
        metavar="N",
        help="evaluate trained models on the first N test digits (affine: their transformed twins too; "
        "MultiMNIST: composites of them) (default: all 10,000)",
    )
    p.add_argument(
        "--eval-batch-size",
        type=int,
        default=None,
        metavar="N",
        help="images per evaluation batch of trained models (bounds memory) (default: 500)",
    )
    p.add_argument(
        "--eval-every",
        type=int,
        default=None,
        metavar="N",
        help="evaluate trained models after every N-th epoch, after the last, and before a --max-minutes stop; a "
        "run under --runs may continue with another N (default: 1, every epoch)",
    )
    p.add_argument(
        "--affine-cnn-channels",
        type=channels,
        default=None,
        metavar="C1,C2,C3",
        help="the affine section's CNN: the paper baseline with these conv channels (default: 256,256,128)",
    )
    p.add_argument(
        "--affine-cnn-epochs",
        type=int,
        default=None,
        metavar="N",
        help="the affine section's CNN trains N epochs and CapsNet --epochs, so the CNN can stop once it has the "
        "accuracy the comparison needs; a run under --runs may continue with a larger N (default: --epochs)",
    )
    p.add_argument(
        "--capsnet-curve",
        default=str(REPO_ROOT / "docs" / "training" / "capsnet-mnist" / "from-scratch" / "metrics.jsonl"),
        help="a capsnet-train metrics.jsonl drawn beside the baseline CNN's curve "
        "(default: docs/training/capsnet-mnist/from-scratch/metrics.jsonl, the from-scratch run the bundled model "
        "was annealed from)",
    )
    add_device(p, "training device")
    p.add_argument(
        "--amp",
        action="store_true",
        help="bfloat16 convolutions when training, on CUDA or a CPU with native bfloat16 (default: off)",
    )
    p.add_argument(
        "--runs",
        default=None,
        help="keep checkpoints and metrics of trained models here, and continue from them (default: no)",
    )
    p.add_argument(
        "--max-minutes",
        type=float,
        default=None,
        help="time budget for the training sections (needs --runs): no epoch, and inside one no step, is started "
        "that would overrun it; the section's result so far is saved and shown as partial, the command exits 3 "
        "and the same command continues (default: none)",
    )
    p.add_argument("--seed", type=int, default=0, help="random seed of training and generated data (default: 0)")
    p.add_argument(
        "--update",
        action="store_true",
        help="rewrite only the --sections named (run, or with --reuse rendered from their saved results) inside "
        "the existing REPORT.md, keeping every other part of it as it is (default: off, write the whole report)",
    )
    p.add_argument("--dry-run", action="store_true", help="print what would run or be reused, write nothing")
    return p


def sizes_from(parser: argparse.ArgumentParser, args: argparse.Namespace) -> Sizes:
    """The experiments' sizes: the paper's (or tiny), with what the command line overrides."""
    for name in ("epochs", "epoch_images", "test_images", "eval_batch_size", "eval_every", "affine_cnn_epochs"):
        if (value := getattr(args, name)) is not None and value < 1:
            parser.error(f"--{name.replace('_', '-')} must be at least 1, got {value}")
    sizes = Sizes.tiny() if args.tiny else Sizes()
    overrides = {
        "epochs": args.epochs, "epoch_images": args.epoch_images, "eval_batch_size": args.eval_batch_size,
        "eval_every": args.eval_every, "test_subset": args.test_images, "affine_cnn_channels": args.affine_cnn_channels,
        "affine_cnn_epochs": args.affine_cnn_epochs,
    }  # fmt: skip
    return replace(sizes, **{k: v for k, v in overrides.items() if v is not None})


def check_update(ctx: Context, selected: set[str]) -> None:
    """Raise ValueError unless <out>/REPORT.md exists and has a section of each selected one's heading."""
    path = ctx.out / "REPORT.md"
    if not path.is_file():
        raise ValueError(f"--update rewrites sections of an existing report, and there is no {path}")
    headings = {line for line in path.read_text().splitlines() if line.startswith("## ")}
    for key in sorted(selected):
        heading = BY_KEY[key].render(ctx, None, None).splitlines()[0]
        if heading not in headings:
            raise ValueError(f"{path} has no section {heading!r} to rewrite; write the whole report instead")


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.model and not Path(args.model).exists():
        parser.error(f"--model {args.model}: no such model directory or checkpoint")
    if args.max_minutes is not None and (args.runs is None or not args.max_minutes > 0):
        parser.error("--max-minutes needs a positive number of minutes and --runs (where the progress is kept)")
    deadline = None if args.max_minutes is None else time.monotonic() + 60.0 * args.max_minutes
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    selected = set(SECTIONS) if "all" in args.sections else set(args.sections) - {"none"}
    if args.update and not selected:
        parser.error("--update needs --sections naming the sections to rewrite")
    sizes = sizes_from(parser, args)
    try:
        device = resolve_device(args.device)
    except ValueError as e:
        print(f"{parser.prog}: error: {e}", file=sys.stderr)
        return 2
    command = shlex.join(["python", "-m", "training.report", *portable_command(sys.argv[1:] if argv is None else argv)])
    with tempfile.TemporaryDirectory(prefix="capsnet-report-") as scratch:
        ctx = Context(
            out=Path(args.out), data_dir=None, zoo=Path(args.zoo), model=Path(args.model) if args.model else None,
            sizes=sizes, tiny=args.tiny, device=device, seed=args.seed, command=command,
            scratch=Path(scratch), runs=Path(args.runs) if args.runs else None, amp=args.amp, deadline=deadline,
            capsnet_curve=Path(args.capsnet_curve),
        )  # fmt: skip
        actions = plan(ctx, selected, args.reuse)
        try:
            ctx.data_dir = find_data_dir(
                args.data_dir, [k for k, a in actions.items() if a == "run" and BY_KEY[k].reads_mnist]
            )
            if args.update:
                check_update(ctx, selected)
        except (IDXError, ValueError) as e:
            print(f"{parser.prog}: error: {e}", file=sys.stderr)
            return 2
        if args.dry_run:
            print(json.dumps({"data_dir": ctx.data_dir, "sections": actions}, indent=1))
            return 0
        path = build_report(ctx, selected, args.reuse, args.update)
    print(path)
    if ctx.unfinished:
        print(
            f"training.report: time budget spent; unfinished: {', '.join(ctx.unfinished)}. Run the same command "
            "again to continue.",
            file=sys.stderr,
        )
        return EXIT_UNFINISHED
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

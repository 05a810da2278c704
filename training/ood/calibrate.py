"""`capsnet-ood`: fit, calibrate and evaluate the "not a digit" score of a model directory (docs/not-a-digit.md).

The default, fitted score is `training.ood.fitted`'s; `--method darccc` calibrates the previous score (the
largest surprise of five features, quantiles of the last `--reference` training images, the threshold at a
percentile of their scores) and evaluates it on the fitting non-digit sets. `--write-edges` cuts the test
pairs (`training.ood.edges.edge_pair`).
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from service.contract import (
    FEATURE_TAILS,
    ImageLimits,
    OODCalibration,
    array_to_png,
    decode_image,
    one_blas_thread,
    preprocess,
    read_card,
)
from training.data.mnist import load_split, to_float
from training.ood.edges import write_edges
from training.ood.fitted import (
    ModelOutputs,
    auroc,
    confirm,
    fit_and_evaluate,
    quantile_levels,
    training_split,
    write_ood_calibration,
)  # fmt: skip
from training.ood.network import HIDDEN
from training.ood.nondigits import NONDIGIT_SETS, make_set
from training.options import add_data_dir

log = logging.getLogger(__name__)

RUNS_DIR = Path("runs/ood")  # the report's default folder: outside the tracked docs
DEFAULT_REFERENCE = 5000
DEFAULT_PERCENTILE = 99.6
FITTED_PERCENTILE = 99.3  # of validation digits: 99.0% of test digits or more, with two standard errors to spare
DEFAULT_COMBINER = 4000
DEFAULT_VALIDATION = 3000
DEFAULT_PER_SET = 1000
DEFAULT_NETWORK_DIGITS = 20000
DEFAULT_NETWORK_PER_SET = 3000
DEFAULT_NETWORK_TURNED = 8000


def _share(value: float | None) -> str:
    return "— (none accepted)" if value is None else f"{value:.2%}"


def confirmation_markdown(report: dict[str, Any]) -> str:
    """The confirmation table of one model: each set's AUROC and rejected share at the card's threshold."""
    test = report["mnist_test"]
    lines = [
        f"Model `{report['model']}` (version {report['version']}), the card's threshold {report['threshold']:.3f}: "
        f"MNIST test digits accepted {test['accepted']:.2%} of {test['n']:,}.",
        "",
        "| confirmation set | images | AUROC | rejected |",
        "|---|---:|---:|---:|",
    ]
    lines += [f"| {n} | {r['n']:,} | {r['auroc']:.3f} | {r['rejected']:.1%} |" for n, r in report["sets"].items()]
    return "\n".join(lines)


def _guard(validation: dict[str, Any]) -> str:
    guard = validation.get("accuracy_guard")
    if not guard or guard["met"] is None:
        return ""
    kept = "kept" if guard["met"] else "not kept"
    return f"; the previous score's accuracy on the accepted ({_share(guard['previous_accuracy_accepted'])}) {kept}"


def validation_markdown(report: dict[str, Any]) -> str:
    """The validation figures of every candidate: digits accepted and each validation set's rejected share."""
    candidates = report["validation"]["candidates"]
    names = list(next(iter(candidates.values()))["sets"])
    lines = [
        f"Model `{report['model']}`: validation only, chosen {report['chosen']!r} at the "
        f"{report['validation']['percentile']:g}th percentile{_guard(report['validation'])} (the test sets were not "
        "scored).",
        "",
        "| candidate | digits accepted | accuracy on the accepted | " + " | ".join(names) + " |",
        "|---|---:|---:|" + "---:|" * len(names),
    ]
    rows = list(candidates.items())
    if "previous" in report["validation"]:
        rows.append(("previous score", report["validation"]["previous"]))
    for label, row in rows:
        shares = " | ".join(f"{row['sets'][n]['rejected']:.1%} ({row['sets'][n]['auroc']:.3f})" for n in names)
        digits = row["digits"]
        lines.append(f"| {label} | {digits['accepted']:.2%} | {_share(digits['accuracy_accepted'])} | {shares} |")
    return "\n".join(lines)


def fitted_markdown(report: dict[str, Any]) -> str:
    """The report page's table of one model: each test set's AUROC and rejected share, the previous score's beside."""
    test, old = report["mnist_test"], report.get("previous")
    lines = [
        f"Model `{report['model']}` (version {report['version']}): features {', '.join(report['features'])} "
        f"(chosen on validation: {report['chosen']}); threshold {report['threshold']:.3f} "
        f"({report['threshold_rule']}).",
        "",
        f"MNIST test digits accepted: {test['accepted']:.2%} of {test['n']:,}, accuracy on the accepted "
        f"{_share(test['accuracy_accepted'])} (on all: {test['accuracy_all']:.2%})"
        + (f"; previous score: {old['mnist_test']['accepted']:.2%}, {_share(old['mnist_test']['accuracy_accepted'])}."
           if old else "."),
        "",
        "| test set | images | AUROC | rejected | previous AUROC | previous rejected |",
        "|---|---:|---:|---:|---:|---:|",
    ]  # fmt: skip
    for name, row in report["sets"].items():
        prev = old["sets"][name] if old else None
        tail = f"{prev['auroc']:.3f} | {prev['rejected']:.1%}" if prev else "— | —"
        lines.append(f"| {name} | {row['n']:,} | {row['auroc']:.3f} | {row['rejected']:.1%} | {tail} |")
    return "\n".join(lines)


def calibrate(features: dict[str, np.ndarray], percentile: float, description: str, target: float) -> dict[str, Any]:
    """The card's `ood` object from the reference images' features: quantiles per feature and the threshold."""
    n = len(next(iter(features.values())))
    levels = quantile_levels(n)
    entries = [
        {"name": name, "tail": FEATURE_TAILS[name], "values": [float(v) for v in np.quantile(values, levels)]}
        for name, values in features.items()
    ]
    ood: dict[str, Any] = {
        "method": "DARCCC-style (Frosst, Sabour & Hinton 2018): score = max over features of -log(tail probability "
        "under the reference images' distribution, interpolated between the stored quantiles); an image is in "
        "distribution when score <= threshold",
        "reference": {"images": description, "n": n},
        "threshold_rule": f"the {percentile:g}th percentile of the reference images' scores",
        "target_acceptance": target,
        "levels": [float(v) for v in levels],
        "features": entries,
        "threshold": 0.0,
    }
    ood["threshold"] = float(np.percentile(OODCalibration.from_card(ood).score(features), percentile))
    return ood


def as_uploads(pixels: np.ndarray, shape: tuple[int, ...]) -> np.ndarray:
    """uint8 digits (N, [1,] H, W) as the service sees them uploaded: PNG bytes, decoded and preprocessed as it does."""
    limits = ImageLimits()
    out = np.empty((len(pixels), *shape), np.float32)
    for i, picture in enumerate(pixels):
        image = decode_image(array_to_png(picture.reshape(picture.shape[-2:]) / 255.0), limits)
        out[i] = preprocess(image, (shape[-2], shape[-1])).array.reshape(shape)
    return out


def acceptance(
    model: ModelOutputs, calibration: OODCalibration, images: np.ndarray, labels: np.ndarray
) -> tuple[dict[str, Any], np.ndarray]:
    """Accepted share and accuracy (all, accepted) of labelled digits, and their scores."""
    features, predicted = model.features(images)
    scores = calibration.score(features)
    accepted = scores <= calibration.threshold
    row = {
        "n": len(labels),
        "accepted": float(accepted.mean()),
        "accuracy_all": float((predicted == labels).mean()),
        "accuracy_accepted": float((predicted[accepted] == labels[accepted]).mean()) if accepted.any() else None,
    }
    return row, scores


def evaluate(
    model: ModelOutputs,
    calibration: OODCalibration,
    test_images: np.ndarray,
    test_labels: np.ndarray,
    sets: dict[str, np.ndarray],
    uploads: np.ndarray | None = None,
) -> dict[str, Any]:
    """Accepted share and accuracy on MNIST test digits (fed directly and, given `uploads`, through the
    service's upload path); AUROC and rejected share per non-digit set."""
    test, digit_scores = acceptance(model, calibration, test_images, test_labels)
    result: dict[str, Any] = {"mnist_test": test, "sets": {}}
    if uploads is not None:
        result["mnist_test_uploads"] = acceptance(model, calibration, uploads, test_labels)[0]
    for name, images in sets.items():
        scores = calibration.score(model.features(images)[0])
        result["sets"][name] = {
            "n": len(images),
            "auroc": auroc(scores, digit_scores),
            "rejected": float((scores > calibration.threshold).mean()),
        }
    return result


def markdown(report: dict[str, Any]) -> str:
    """The REPORT.md table of one model's evaluation."""
    test = report["mnist_test"]
    lines = [
        f"Model `{report['model']}` (version {report['version']}); threshold {report['threshold']:.3f} "
        f"({report['threshold_rule']} of {report['reference']}).",
        "",
        f"MNIST test digits accepted: {test['accepted']:.2%} of {test['n']:,}; accuracy on the accepted "
        f"{_share(test['accuracy_accepted'])} (on all: {test['accuracy_all']:.2%}).",
        "",
        "| non-digit set | images | AUROC vs MNIST test | rejected at the threshold |",
        "|---|---:|---:|---:|",
    ]
    for name, row in report["sets"].items():
        lines.append(f"| {name} | {row['n']:,} | {row['auroc']:.3f} | {row['rejected']:.1%} |")
    uploads = report.get("mnist_test_uploads")
    if uploads:
        lines += [
            "",
            f"The same {uploads['n']:,} test digits sent as PNG uploads through the service's decoding and "
            f"preprocessing: {uploads['accepted']:.2%} accepted, accuracy on the accepted "
            f"{_share(uploads['accuracy_accepted'])} (on all: {uploads['accuracy_all']:.2%}).",
        ]
    return "\n".join(lines)


def _reference(data_dir: str | None, count: int) -> tuple[np.ndarray, str]:
    train = load_split(data_dir, "train")
    if not 0 < count <= len(train):
        raise ValueError(f"--reference {count} must be between 1 and {len(train)}")
    first = len(train) - count
    return to_float(train.images[first:]), f"MNIST training images {first}-{len(train) - 1}"


def run(
    model_dir: Path,
    data_dir: str | None,
    *,
    reference: int,
    percentile: float,
    per_set: int,
    seed: int,
    write_card: bool,
    target: float = 0.99,
    progress: Callable[[str], None] = log.info,
) -> dict[str, Any]:
    """Calibrate (optionally writing the card's `ood` object) and evaluate; return the report."""
    model = ModelOutputs(model_dir)
    images, description = _reference(data_dir, reference)
    progress(f"calibrating on {description}")
    ood = calibrate(model.features(images)[0], percentile, description, target)
    test = load_split(data_dir, "test")
    shape = tuple(model.card["input"]["shape"][1:])
    sets = {name: make_set(name, per_set, seed, shape) for name in NONDIGIT_SETS}
    progress(f"evaluating on {len(test):,} test digits and {len(sets)} non-digit sets of {per_set}")
    uploads = as_uploads(test.images, shape)
    report = evaluate(model, OODCalibration.from_card(ood), to_float(test.images), test.labels, sets, uploads)
    ood["evaluation"] = {"mnist_test_accepted": report["mnist_test"]["accepted"]}
    report = {
        "model": model.card["name"],
        "version": model.card["version"],
        "threshold": ood["threshold"],
        "threshold_rule": ood["threshold_rule"],
        "reference": description,
        "seed": seed,
        **report,
    }
    if write_card:
        write_ood_calibration(model_dir, ood)
    return report


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="capsnet-ood",
        description="Fit and calibrate a model directory's 'not a digit' score on MNIST training images and "
        "synthetic non-digits, choose its features on validation sets and report it on held-out test sets.",
    )
    p.add_argument("--model", required=True, help="model directory, e.g. model/zoo/capsnet-mnist (required)")
    add_data_dir(p)
    p.add_argument(
        "--method",
        choices=("fitted", "darccc"),
        default="fitted",
        help="fitted: the logistic combination (default); darccc: the largest surprise of five features",
    )
    p.add_argument(
        "--reference",
        type=int,
        default=DEFAULT_REFERENCE,
        help=f"the last N (trained) training images are the reference (default: {DEFAULT_REFERENCE})",
    )
    p.add_argument(
        "--combiner",
        type=int,
        default=DEFAULT_COMBINER,
        help="MNIST test digits (drawn at random) set aside for fitting: unseen digits for the pattern network, and "
        "the combiner's digits when the model held out no training images (default: %(default)s)",
    )
    p.add_argument(
        "--val-split",
        type=int,
        default=None,
        help="training images the model held out: the combiner's digits, never the reference (default: the card's "
        "training --val-split)",
    )
    p.add_argument(
        "--validation",
        type=int,
        default=DEFAULT_VALIDATION,
        help="MNIST test digits (drawn at random after the --combiner ones) that set the threshold and choose the "
        f"features; the rest are reported (default: {DEFAULT_VALIDATION})",
    )
    p.add_argument(
        "--percentile",
        type=float,
        default=None,
        help="threshold at this percentile of the validation (fitted) or reference (darccc) digits' scores "
        f"(default: {FITTED_PERCENTILE} fitted, {DEFAULT_PERCENTILE} darccc)",
    )
    p.add_argument(
        "--per-set", type=int, default=DEFAULT_PER_SET, help=f"images per non-digit set (default: {DEFAULT_PER_SET})"
    )
    p.add_argument(
        "--network-digits", type=int, default=DEFAULT_NETWORK_DIGITS,
        help=f"training digits (not the reference) the pattern network learns from (default: {DEFAULT_NETWORK_DIGITS})",
    )  # fmt: skip
    p.add_argument(
        "--network-per-set", type=int, default=DEFAULT_NETWORK_PER_SET,
        help=f"images of each fitting non-digit set the network learns from (default: {DEFAULT_NETWORK_PER_SET})",
    )  # fmt: skip
    p.add_argument(
        "--network-hidden", type=int, default=HIDDEN,
        help="units in each of the pattern network's two hidden layers (default: %(default)s)",
    )  # fmt: skip
    p.add_argument(
        "--network-turned", type=int, default=DEFAULT_NETWORK_TURNED,
        help="training digits turned by 90, 180 or 270 degrees among the network's non-digits "
        f"(default: {DEFAULT_NETWORK_TURNED})",
    )  # fmt: skip
    p.add_argument("--seed", type=int, default=0, help="seed of the non-digit sets (default: 0)")
    p.add_argument(
        "--test-seed", type=int, default=None,
        help="seed of the non-digit test sets alone: new test images, the fitted score unchanged (default: --seed)",
    )  # fmt: skip
    p.add_argument("--cache", type=Path, default=None, help="keep the model's outputs per image set in this directory")
    p.add_argument(
        "--previous",
        type=Path,
        default=None,
        help="a model.json whose `ood` is reported beside the new score (default: the model's card before fitting)",
    )
    p.add_argument(
        "--write-card", action="store_true", help="write the calibration into the card's `ood` (default: off)"
    )
    p.add_argument(
        "--json", type=Path, default=None, help=f"report file to write (default: {RUNS_DIR}/<model name>.json)"
    )
    p.add_argument("--dry-run", action="store_true", help="20 images per set and 500 reference images; write nothing")
    p.add_argument(
        "--confirm", action="store_true",
        help="score the card's calibration as it is on the confirmation sets (fonts no other role uses) and the "
        "reported test digits; fit nothing, change no card (report: runs/ood/<model>-confirmation.json)",
    )  # fmt: skip
    p.add_argument(
        "--validation-only", action="store_true",
        help="fit and choose, print every candidate's validation figures, and stop before the test sets; write nothing",
    )  # fmt: skip
    p.add_argument(
        "--write-edges",
        type=Path,
        default=None,
        help="only write two images just below and above the card's threshold into this JSON file (for the tests)",
    )
    return p


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    one_blas_thread()
    try:
        if args.write_edges is not None:
            pair = write_edges(Path(args.model), args.write_edges)
            print(f"{args.model}: {pair['digit']} into {pair['letter']}: scores {pair['below']['ood_score']:.4f} and "
                  f"{pair['above']['ood_score']:.4f} around the threshold {pair['threshold']:.4f}")  # fmt: skip
            return 0
        if args.confirm:
            report = confirm(
                Path(args.model), args.data_dir, combiner=args.combiner, validation=args.validation,
                per_set=20 if args.dry_run else args.per_set, seed=args.seed, cache=args.cache,
            )  # fmt: skip
            text = confirmation_markdown(report)
        elif args.method == "darccc":
            report = run(
                Path(args.model), args.data_dir,
                reference=500 if args.dry_run else args.reference,
                percentile=DEFAULT_PERCENTILE if args.percentile is None else args.percentile,
                per_set=20 if args.dry_run else args.per_set, seed=args.seed,
                write_card=args.write_card and not args.dry_run,
            )  # fmt: skip
            text = markdown(report)
        else:
            card = read_card(Path(args.model))
            val_split, train_seed = training_split(card)
            previous = json.loads(args.previous.read_text()).get("ood") if args.previous else card.get("ood")
            report = fit_and_evaluate(
                Path(args.model), args.data_dir,
                reference=500 if args.dry_run else args.reference,
                combiner=100 if args.dry_run else args.combiner,
                val_split=val_split if args.val_split is None else args.val_split, train_seed=train_seed,
                validation=100 if args.dry_run else args.validation,
                percentile=FITTED_PERCENTILE if args.percentile is None else args.percentile,
                per_set=20 if args.dry_run else args.per_set, seed=args.seed, previous=previous,
                cache=args.cache, write_card=args.write_card and not (args.dry_run or args.validation_only),
                network_digits=200 if args.dry_run else args.network_digits,
                network_per_set=20 if args.dry_run else args.network_per_set,
                network_turned=60 if args.dry_run else args.network_turned, test_seed=args.test_seed,
                network_hidden=args.network_hidden,
                validation_only=args.validation_only,
            )  # fmt: skip
            text = validation_markdown(report) if args.validation_only else fitted_markdown(report)
    except (ValueError, FileNotFoundError, OSError) as e:
        print(f"capsnet-ood: error: {e}", file=sys.stderr)
        return 2
    if not (args.dry_run or args.validation_only):
        name = f"{Path(args.model).name}-confirmation" if args.confirm else Path(args.model).name
        path = args.json if args.json is not None else RUNS_DIR / f"{name}.json"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(report, indent=2) + "\n")
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())

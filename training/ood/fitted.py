"""The fitted "not a digit" score (docs/not-a-digit.md): Gaussians, combiner, feature choice, edge pairs.

`fit_and_evaluate` fits each candidate feature set (quantiles and class Gaussians on the reference training
images, the logistic combiner on MNIST test digits against the fitting non-digits), chooses on the
validation digits and non-digits, and reports the choice once on the test sets beside the previous score.
`edge_pair` cuts two images just either side of a card's threshold for the tests. Also the helpers both
scores use: the model's outputs (`ModelOutputs`, cached), quantile levels, AUROC and the card writer.
`training.ood.calibrate` is the CLI.
"""

from __future__ import annotations

import json
import logging
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from service.contract import (
    CARD_FILE,
    FEATURE_TAILS,
    GAUSSIAN_FEATURES,
    GRAPH_FILE,
    ClassGaussian,
    OODCalibration,
    array_from_pixels,
    create_session,
    image_features,
    load_model_dir,
    preprocess,
    read_card,
    write_card,
)
from training.data.mnist import load_split, to_float
from training.ood.nondigits import ROLES, make_set, rotated_digits

log = logging.getLogger(__name__)

TAIL_LEVELS = 40  # quantile levels spaced geometrically in each tail
MIDDLE_LEVELS = 99  # quantile levels spaced evenly between the tails
BATCH = 250


def quantile_levels(n_reference: int) -> np.ndarray:
    """Cumulative probabilities at which the card stores each feature: dense in both tails, down to 1/n."""
    smallest = 1.0 / n_reference
    tail = np.geomspace(smallest, 0.01, TAIL_LEVELS, endpoint=False)
    middle = np.linspace(0.01, 0.99, MIDDLE_LEVELS)
    return np.unique(np.concatenate([[0.0], tail, middle, 1.0 - tail[::-1], [1.0]]))


class ModelOutputs:
    """Runs a model directory's capsnet.onnx and keeps what the score needs: scores, poses, reconstruction and
    routing map; with a `cache` directory, each named image set's outputs are kept there between runs."""

    def __init__(self, model_dir: Path, cache: Path | None = None) -> None:
        self.card = load_model_dir(model_dir).raw_card
        self.session = create_session(model_dir / GRAPH_FILE, "cpu")
        roles = {o["role"]: o["name"] for o in self.card["outputs"]}
        self.scores_name = self.card["scores"]["output"]
        self.reconstruction_name = roles.get("reconstruction")
        self.names = {"scores": self.scores_name, **{r: roles[r] for r in ("poses", "reconstruction", "explanation")
                                                      if r in roles}}  # fmt: skip
        self.cache = cache
        self.batch = int((self.card.get("serving") or {}).get("max_batch_size") or BATCH)

    def run(self, images: np.ndarray, key: str | None = None) -> dict[str, np.ndarray]:
        """Every output the score can use, by role (scores, poses, reconstruction, explanation)."""
        file = None if self.cache is None or key is None else self.cache / f"{self.card['name']}-{key}.npz"
        if file is not None and file.is_file():
            with np.load(file) as saved:
                return {k: saved[k] for k in saved.files}
        parts: dict[str, list[np.ndarray]] = {r: [] for r in self.names}
        for start in range(0, len(images), self.batch):
            got = self.session.run(
                list(self.names.values()), {self.card["input"]["name"]: images[start : start + self.batch]}
            )
            for role, array in zip(self.names, got, strict=True):
                parts[role].append(array)
        out = {r: np.concatenate(p) for r, p in parts.items()}
        if file is not None:
            file.parent.mkdir(parents=True, exist_ok=True)
            np.savez(file, **out)  # type: ignore[arg-type]
        return out

    def __call__(self, images: np.ndarray) -> tuple[np.ndarray, np.ndarray | None]:
        out = self.run(images)
        return out["scores"], out.get("reconstruction")

    def features(self, images: np.ndarray) -> tuple[dict[str, np.ndarray], np.ndarray]:
        scores, reconstruction = self(images)
        return image_features(images, scores, reconstruction), scores.argmax(axis=1)


def auroc(positive: np.ndarray, negative: np.ndarray) -> float:
    """P(score of a positive > score of a negative), ties counted half (the Mann-Whitney U statistic)."""
    ordered = np.sort(negative)
    below = np.searchsorted(ordered, positive, side="left")
    not_above = np.searchsorted(ordered, positive, side="right")
    return float((below + 0.5 * (not_above - below)).sum() / (len(positive) * len(negative)))


def _share(value: float | None) -> str:
    return "— (none accepted)" if value is None else f"{value:.2%}"


def write_ood_calibration(model_dir: Path, ood: dict[str, Any]) -> None:
    """Add the `ood` object to model.json, validated (not hashed: the files the card lists are unchanged)."""
    write_card(model_dir, {**read_card(model_dir), "ood": ood})
    log.info("wrote the ood calibration to %s", model_dir / CARD_FILE)


DYNAMIC_FEATURES = ("distance", "relative_distance", "winning_score", "margin", "ink", "pose_distance",
                    "scores_distance", "routing_share")  # fmt: skip
SHRINKAGE = 1e-3  # the shared covariance plus this share of its mean variance on the diagonal
L2 = 1e-3  # the combiner's weight penalty per fitting image


def gaussian_entry(vectors: np.ndarray, labels: np.ndarray, k: int, output: str) -> dict[str, Any]:
    """The card's entry for class Gaussians with a shared, slightly shrunk covariance fitted to (N, D) vectors."""
    vectors = vectors.reshape(len(vectors), -1).astype(np.float64)
    absent = sorted(set(range(k)) - set(labels.tolist()))
    if absent:
        raise ValueError(f"the reference images hold no digit of class {absent}; give a larger --reference")
    means = np.stack([vectors[labels == c].mean(axis=0) for c in range(k)])
    centred = vectors - means[labels]
    covariance = centred.T @ centred / len(vectors)
    covariance += SHRINKAGE * np.trace(covariance) / len(covariance) * np.eye(len(covariance))
    whitening = np.linalg.inv(np.linalg.cholesky(covariance))  # W with W^T W = covariance^-1
    return {"output": output, "means": means.tolist(), "whitening": whitening.tolist()}


def measure(outputs: dict[str, np.ndarray], images: np.ndarray, gaussians: dict[str, Any]) -> dict[str, np.ndarray]:
    """Every feature (N,) the model's outputs give, with the Gaussians' distances (card entries by feature)."""
    features = image_features(images, outputs["scores"], outputs.get("reconstruction"), outputs.get("explanation"))
    for name, entry in gaussians.items():
        gaussian = ClassGaussian.from_card(entry, len(entry["means"]))
        features[name] = gaussian.distance(outputs["scores"], outputs.get("poses"))
    return features


def fit_logistic(
    digits: np.ndarray, outliers: np.ndarray, l2: float = L2, steps: int = 200
) -> tuple[float, np.ndarray]:
    """(bias, weights >= 0) of a logistic regression of outlier (1) against digit (0) on (N, F) surprises, each
    class weighing half; weights kept non-negative (a surprise never speaks for a digit), by projected Newton."""
    x = np.concatenate([digits, outliers]).astype(np.float64)
    y = np.concatenate([np.zeros(len(digits)), np.ones(len(outliers))])
    share = np.concatenate([np.full(len(digits), 0.5 / len(digits)), np.full(len(outliers), 0.5 / len(outliers))])
    a = np.concatenate([np.ones((len(x), 1)), x], axis=1)
    theta = np.zeros(a.shape[1])
    penalty = np.r_[0.0, np.full(x.shape[1], l2)]
    for _ in range(steps):
        p = 1.0 / (1.0 + np.exp(-np.clip(a @ theta, -50, 50)))
        gradient = a.T @ (share * (p - y)) + penalty * theta
        free = np.r_[True, (theta[1:] > 0) | (gradient[1:] < 0)]
        hessian = (a[:, free].T * (share * p * (1 - p))) @ a[:, free] + np.diag(penalty[free] + 1e-9)
        step = np.zeros_like(theta)
        step[free] = np.linalg.solve(hessian, gradient[free])
        new = theta - step
        new[1:] = np.maximum(new[1:], 0.0)
        if np.abs(new - theta).max() < 1e-9:
            theta = new
            break
        theta = new
    return float(theta[0]), theta[1:]


def fit_detector(
    reference: tuple[dict[str, np.ndarray], np.ndarray, np.ndarray, str],
    combiner_digits: tuple[dict[str, np.ndarray], np.ndarray],
    outliers: list[tuple[dict[str, np.ndarray], np.ndarray]],
    names: tuple[str, ...],
) -> dict[str, Any]:
    """The card's `ood` object without its threshold: quantiles and Gaussians from the reference (outputs,
    images, labels, description), the combiner from other digits (outputs, images) against the outliers."""
    ref_outputs, ref_images, labels, description = reference
    k = ref_outputs["scores"].shape[1]
    gaussians = {
        name: gaussian_entry(ref_outputs[output], labels, k, output) if output == "scores" else gaussian_entry(
            ref_outputs["poses"].reshape(len(labels), k, -1)[np.arange(len(labels)), labels], labels, k, output)
        for name, output in GAUSSIAN_FEATURES.items() if name in names and output in ref_outputs
    }  # fmt: skip
    features = {n: v for n, v in measure(ref_outputs, ref_images, gaussians).items() if n in names}
    levels = quantile_levels(len(labels))
    ood: dict[str, Any] = {
        "method": "logistic regression on the surprise of each feature: -log of the share of reference digits at "
        "least as extreme (interpolated between the stored quantiles); pose_distance and scores_distance are "
        "Mahalanobis distances to the predicted class's mean under a shared covariance (Lee et al. 2018); an image "
        "is in distribution when score <= threshold",
        "reference": {"images": description, "n": len(labels)},
        "levels": [float(v) for v in levels],
        "features": [
            {"name": n, "tail": FEATURE_TAILS[n], "values": [float(v) for v in np.quantile(features[n], levels)]}
            for n in names if n in features
        ],
        "gaussians": gaussians,
        "threshold": 0.0,
    }  # fmt: skip
    plain = OODCalibration.from_card(ood)
    order = [f.name for f in plain.features]

    def surprises(outputs: dict[str, np.ndarray], images: np.ndarray) -> np.ndarray:
        got = plain.surprises(measure(outputs, images, gaussians))
        return np.stack([got[n] for n in order], axis=1)

    bias, weights = fit_logistic(surprises(*combiner_digits), np.concatenate([surprises(o, i) for o, i in outliers]))
    ood["combiner"] = {"kind": "logistic", "bias": bias, "weights": dict(zip(order, weights.tolist(), strict=True))}
    return ood


def scores_of(calibration: OODCalibration, outputs: dict[str, np.ndarray], images: np.ndarray) -> np.ndarray:
    return calibration.score(
        calibration.measure(images, outputs["scores"], outputs.get("reconstruction"), outputs.get("poses"),
                            outputs.get("explanation"))
    )  # fmt: skip


def evaluate_sets(
    calibration: OODCalibration,
    digits: tuple[dict[str, np.ndarray], np.ndarray, np.ndarray],
    sets: dict[str, tuple[dict[str, np.ndarray], np.ndarray]],
) -> dict[str, Any]:
    """Accepted share and accuracy of labelled digits (outputs, images, labels); AUROC and rejected share per set."""
    outputs, images, labels = digits
    digit_scores = scores_of(calibration, outputs, images)
    accepted = digit_scores <= calibration.threshold
    predicted = outputs["scores"].argmax(axis=1)
    result: dict[str, Any] = {
        "digits": {
            "n": len(labels),
            "accepted": float(accepted.mean()),
            "accuracy_all": float((predicted == labels).mean()),
            "accuracy_accepted": float((predicted[accepted] == labels[accepted]).mean()) if accepted.any() else None,
        },
        "sets": {},
    }
    for name, (set_outputs, set_images) in sets.items():
        scores = scores_of(calibration, set_outputs, set_images)
        result["sets"][name] = {
            "n": len(set_images),
            "auroc": auroc(scores, digit_scores),
            "rejected": float((scores > calibration.threshold).mean()),
        }
    return result


CANDIDATES = {  # feature sets the validation sets choose between (those the model's outputs give)
    "all": DYNAMIC_FEATURES,
    "without routing": tuple(n for n in DYNAMIC_FEATURES if n != "routing_share"),
    "DARCCC features and pose": ("distance", "relative_distance", "winning_score", "margin", "ink", "pose_distance"),
    "DARCCC features": ("distance", "relative_distance", "winning_score", "margin", "ink"),
}


def held_out(n: int, val_split: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """(trained, held out) training-set indices as `capsnet-train --val-split` chose them (`hold_out`)."""
    order = np.random.default_rng(seed).permutation(n)
    return np.sort(order[val_split:]), np.sort(order[:val_split])


def available(names: tuple[str, ...], outputs: dict[str, np.ndarray]) -> tuple[str, ...]:
    needs = {"distance": "reconstruction", "relative_distance": "reconstruction", "routing_share": "explanation",
             "pose_distance": "poses"}  # fmt: skip
    return tuple(n for n in names if needs.get(n, "scores") in outputs)


def fit_and_evaluate(
    model_dir: Path,
    data_dir: str | None,
    *,
    reference: int,
    combiner: int,
    val_split: int,
    train_seed: int,
    validation: int,
    percentile: float,
    per_set: int,
    seed: int,
    previous: dict[str, Any] | None,
    cache: Path | None = None,
    write_card: bool = False,
    progress: Callable[[str], None] = log.info,
) -> dict[str, Any]:
    """Fit each candidate, choose on the validation sets, report the chosen one (and `previous`, a card's `ood`
    object, beside it) on the test sets; optionally write it into the card."""
    model = ModelOutputs(model_dir, cache)
    shape = tuple(model.card["input"]["shape"][1:])
    train, test = load_split(data_dir, "train"), load_split(data_dir, "test")
    trained, _ = held_out(len(train), val_split, train_seed)
    if not 0 < reference <= len(trained) or not 0 <= val_split < len(train):
        raise ValueError(f"--reference {reference} must be between 1 and the {len(trained)} trained images")
    if combiner < 1 or validation < 1 or combiner + validation >= len(test):
        raise ValueError(
            f"--combiner {combiner} + --validation {validation} must be positive and leave some of the "
            f"{len(test)} test digits to report"
        )
    order = np.random.default_rng(seed).permutation(len(test))
    comb_idx, val_idx = np.sort(order[:combiner]), np.sort(order[combiner : combiner + validation])
    test_idx = np.sort(order[combiner + validation :])
    ref_idx = trained[len(trained) - reference :]

    def digits(split: Any, idx: np.ndarray, key: str) -> tuple[dict[str, np.ndarray], np.ndarray, np.ndarray]:
        images = to_float(split.images[idx])
        return model.run(images, key), images, split.labels[idx]

    all_test = digits(test, np.arange(len(test)), "test")

    def test_part(idx: np.ndarray) -> tuple[dict[str, np.ndarray], np.ndarray, np.ndarray]:
        return {k: v[idx] for k, v in all_test[0].items()}, all_test[1][idx], all_test[2][idx]

    def nondigits(role: str, n: int) -> dict[str, tuple[dict[str, np.ndarray], np.ndarray]]:
        out = {}
        for name in ROLES[role][0]:
            images = make_set(name, n, seed, shape, role)
            out[name] = (model.run(images, f"{role}-{name}-{n}-{seed}"), images)
        return out

    def turned(split: Any, idx: np.ndarray, key: str) -> dict[str, tuple[dict[str, np.ndarray], np.ndarray]]:
        out = {}
        for turns in (1, 2):
            images = to_float(rotated_digits(split.images[idx], split.labels[idx], turns))[:per_set]
            out[f"digits_turned_{90 * turns}"] = (model.run(images, f"{key}-turned{turns}-{per_set}"), images)
        return out

    progress(f"model outputs: {reference} reference training images, fitting non-digits")
    ref = digits(train, ref_idx, f"train-ref-{reference}-{val_split}-{train_seed}")
    ref_description = f"{reference} MNIST training images the model trained on"
    comb = test_part(comb_idx)
    fit_sets = nondigits("fit", per_set)
    progress(f"model outputs: the validation non-digits and {validation} validation test digits, turned")
    val = test_part(val_idx)
    val_sets = {**nondigits("validation", per_set), **turned(test, val_idx, f"test-{validation}-validation")}
    val_description = f"{validation} MNIST test digits drawn at random (seed {seed}) as the validation"

    chosen: tuple[str, dict[str, Any], tuple[float, float]] | None = None
    candidates: dict[str, Any] = {}
    for label, names in CANDIDATES.items():
        names = available(names, ref[0])
        ood = fit_detector((*ref, ref_description), (comb[0], comb[1]), list(fit_sets.values()), names)
        ood["threshold"] = float(np.percentile(scores_of(OODCalibration.from_card(ood), val[0], val[1]), percentile))
        result = evaluate_sets(OODCalibration.from_card(ood), val, val_sets)
        shares = [r["rejected"] for r in result["sets"].values()]
        rank = (round(min(shares), 3), round(float(np.mean(shares)), 4))  # the worst set first, then the mean
        candidates[label] = {"features": list(names), "worst_rejected": rank[0], "mean_rejected": rank[1], **result}
        progress(f"candidate {label!r}: validation non-digits rejected {rank[0]:.1%} (worst set), {rank[1]:.1%} (mean)")
        if chosen is None or rank > chosen[2]:
            chosen = (label, ood, rank)
    assert chosen is not None
    label, ood, _ = chosen
    ood["threshold_rule"] = f"the {percentile:g}th percentile of the scores of {val_description}"
    ood["target_acceptance"] = 0.99
    calibration = OODCalibration.from_card(ood)

    progress(f"chose {label!r}; scoring the test sets once")
    test_digits = test_part(test_idx)
    test_sets = {**nondigits("test", per_set), **turned(test, test_idx, f"test-{validation}-test")}
    result = evaluate_sets(calibration, test_digits, test_sets)
    ood["evaluation"] = {"mnist_test_accepted": result["digits"]["accepted"]}
    report: dict[str, Any] = {
        "model": model.card["name"],
        "version": model.card["version"],
        "method": ood["method"],
        "chosen": label,
        "features": [f["name"] for f in ood["features"]],
        "combiner": ood["combiner"],
        "threshold": ood["threshold"],
        "threshold_rule": ood["threshold_rule"],
        "reference": ref_description,
        "mnist_test_digits": f"{len(test_idx)} MNIST test digits: those not drawn (seed {seed}) for the combiner "
        f"({combiner}) or the validation ({validation})",
        "seed": seed,
        "per_set": per_set,
        "validation": {"candidates": candidates},
        "mnist_test": result["digits"],
        "sets": result["sets"],
    }
    if previous is not None:
        old = evaluate_sets(OODCalibration.from_card(previous), test_digits, test_sets)
        report["previous"] = {
            "method": previous.get("method"), "threshold": previous["threshold"],
            "threshold_rule": previous.get("threshold_rule"), "mnist_test": old["digits"], "sets": old["sets"],
        }  # fmt: skip
    if write_card:
        write_ood_calibration(model_dir, ood)
    return report


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


EDGE_DIGITS = "4712309568"  # typeset digits tried, in turn, as the in-distribution end of an edge pair
EDGE_OTHERS = "HAKXTPE"  # and letters as the other end
EDGE_STEPS = 40
EDGE_NEAR = 0.02  # a pair whose scores both lie this close to the threshold (relatively) ends the search


def typeset(char: str) -> np.ndarray:
    """A DejaVu Sans character as the service prepares an upload of it: uint8 (28, 28), white on black."""
    from PIL import Image, ImageDraw, ImageFont

    from training.ood.nondigits import CANVAS, font_paths

    canvas = Image.new("L", (CANVAS, CANVAS), 0)
    font = ImageFont.truetype(str(font_paths()[0]), 80)
    ImageDraw.Draw(canvas).text((CANVAS // 2, CANVAS // 2), char, fill=255, font=font, anchor="mm")
    return np.round(preprocess(canvas, (28, 28)).array.reshape(28, 28) * 255).astype(np.uint8)


def edge_pair(model_dir: Path) -> dict[str, Any]:
    """Two images on either side of the card's threshold, as close to it as uint8 pixels allow: a typeset digit
    blended into a letter (bisection on the blend), the first pair within EDGE_NEAR of it or else the closest.
    For tests that pin the served flag."""
    model = ModelOutputs(model_dir)
    calibration = OODCalibration.from_card(model.card["ood"])

    def blend(digit: np.ndarray, other: np.ndarray, t: float) -> np.ndarray:
        return np.round((1 - t) * digit.astype(np.float64) + t * other).astype(np.uint8)

    def score(pixels: np.ndarray) -> tuple[float, dict[str, np.ndarray]]:
        images = array_from_pixels(pixels.tolist(), (28, 28)).astype(np.float32).reshape(1, 1, 28, 28)  # as served
        out = model.run(images)
        args = (out["scores"], out.get("reconstruction"), out.get("poses"), out.get("explanation"))
        features = calibration.measure(images, *args)
        return float(calibration.score(features)[0]), features

    best: tuple[float, dict[str, Any]] | None = None
    for d in EDGE_DIGITS:
        digit = typeset(d)
        if score(digit)[0] > calibration.threshold:
            continue
        for o in EDGE_OTHERS:
            other = typeset(o)
            if score(other)[0] <= calibration.threshold:
                continue
            low, high = 0.0, 1.0
            for _ in range(EDGE_STEPS):
                middle = (low + high) / 2
                low, high = (middle, high) if score(blend(digit, other, middle))[0] <= calibration.threshold else (
                    low, middle)  # fmt: skip
            pair: dict[str, Any] = {"digit": d, "letter": o, "threshold": calibration.threshold}
            for side, pixels in (("below", blend(digit, other, low)), ("above", blend(digit, other, high))):
                value, features = score(pixels)
                parts = calibration.parts(features)[0]
                pair[side] = {
                    "pixels": pixels.tolist(), "ood_score": value,
                    "parts": {part.name: part.contribution for part in parts},
                }  # fmt: skip
            gap = max(abs(pair[side]["ood_score"] - calibration.threshold) for side in ("below", "above"))
            if best is None or gap < best[0]:
                best = (gap, pair)
            if gap < EDGE_NEAR * abs(calibration.threshold):
                return pair
    if best is not None:
        return best[1]
    raise ValueError(f"no typeset digit of {EDGE_DIGITS} is accepted and letter of {EDGE_OTHERS} rejected")


def write_edges(model_dir: Path, file: Path) -> dict[str, Any]:
    """Add (or replace) the model's edge pair in a JSON file of edge pairs by model name."""
    pairs = json.loads(file.read_text()) if file.is_file() else {}
    name = read_card(model_dir)["name"]
    pairs[name] = edge_pair(model_dir)
    file.parent.mkdir(parents=True, exist_ok=True)
    file.write_text(json.dumps(dict(sorted(pairs.items()))) + "\n")
    return pairs[name]


def training_split(card: dict[str, Any]) -> tuple[int, int]:
    """(--val-split, --seed) of the card's training command: which training images the model held out."""
    training = card.get("training") or {}
    found = re.search(r"--val-split[ =](\d+)", str(training.get("command", "")))
    return (int(found.group(1)) if found else 0), int(training.get("seed") or 0)

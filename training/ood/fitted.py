"""The fitted "not a digit" score (docs/not-a-digit.md): network, Gaussians, combiner, feature choice.

`fit_and_evaluate` fits the `pattern` network (`training.ood.network`) on training digits against the fitting
non-digits and turned training digits, then each candidate feature set (quantiles and class Gaussians on the
reference training images, the logistic combiner on MNIST test digits against the same non-digits), chooses on the
validation digits and non-digits, and reports the choice once on the test sets beside the previous score.
`training.ood.edges` cuts two images just either side of a card's threshold for the tests. Also the helpers both
scores use: the model's outputs (`ModelOutputs`, cached), quantile levels, AUROC and the card writer.
`training.ood.calibrate` is the CLI.
"""

from __future__ import annotations

import hashlib
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
    VECTOR_INPUTS,
    ClassGaussian,
    OODCalibration,
    PatternNetwork,
    capsule_vector,
    create_session,
    image_features,
    load_model_dir,
    read_card,
    write_card,
)
from training.data.mnist import load_split, to_float
from training.ood.choice import (
    TARGET_ACCEPTANCE,
    TIGHTER,
    VETO_LIFT,
    VETO_SHARES,
    choose_guarded,
    margins,
    threshold_with_veto,
    veto_cut,
    veto_label,
)
from training.ood.network import HIDDEN, fit_network
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
        self.names = {"scores": self.scores_name, **{r: roles[r] for r in ("poses", "reconstruction", "explanation",
                                                                           "parts") if r in roles}}  # fmt: skip
        self.cache = cache
        graph = (model_dir / GRAPH_FILE).read_bytes() if cache is not None else b""
        self.graph_digest = hashlib.sha1(graph)  # cached outputs of another model of the same name are not reused
        self.batch = int((self.card.get("serving") or {}).get("max_batch_size") or BATCH)

    def run(self, images: np.ndarray, key: str | None = None) -> dict[str, np.ndarray]:
        """Every output the score can use, by role (scores, poses, reconstruction, explanation, parts). Cached
        outputs are found by `key` and a digest of the graph and the images, so a changed model or image set is
        never answered from an old file."""
        file = None
        if self.cache is not None and key is not None:
            digest = self.graph_digest.copy()
            digest.update(np.ascontiguousarray(images).tobytes())
            file = self.cache / f"{self.card['name']}-{key}-{digest.hexdigest()[:12]}.npz"
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


def measure(
    outputs: dict[str, np.ndarray], images: np.ndarray, gaussians: dict[str, Any], network: dict[str, Any] | None = None
) -> dict[str, np.ndarray]:
    """Every feature (N,) the model's outputs give, with the Gaussians' distances (card entries by feature) and
    the pattern network's output (its card entry)."""
    features = image_features(images, outputs["scores"], outputs.get("reconstruction"), outputs.get("explanation"))
    for name, entry in gaussians.items():
        gaussian = ClassGaussian.from_card(entry, len(entry["means"]))
        features[name] = gaussian.distance(outputs["scores"], outputs.get("poses"))
    if network is not None:
        features["pattern"] = PatternNetwork.from_card(network).pattern(
            images, outputs["scores"], outputs.get("poses"), outputs.get("reconstruction"), outputs.get("explanation"),
            outputs.get("parts"),
        )  # fmt: skip
    return features


def network_inputs(outputs: dict[str, np.ndarray]) -> tuple[str, ...]:
    """What the pattern network reads of a model with these outputs: all of `VECTOR_INPUTS` it gives."""
    needs = {"poses": "poses", "distance": "reconstruction", "explanation": "explanation", "parts": "parts"}
    return tuple(n for n in VECTOR_INPUTS if needs.get(n, "scores") in outputs)


def vectors(outputs: dict[str, np.ndarray], images: np.ndarray, inputs: tuple[str, ...]) -> np.ndarray:
    return capsule_vector(inputs, images, outputs["scores"], outputs.get("poses"), outputs.get("reconstruction"),
                          outputs.get("explanation"), outputs.get("parts"))  # fmt: skip


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
    network: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """The card's `ood` object without its threshold: quantiles and Gaussians from the reference (outputs,
    images, labels, description), the combiner from other digits (outputs, images) against the outliers; the
    fitted pattern `network` goes in when `names` holds `pattern`."""
    ref_outputs, ref_images, labels, description = reference
    k = ref_outputs["scores"].shape[1]
    gaussians = {
        name: gaussian_entry(ref_outputs[output], labels, k, output) if output == "scores" else gaussian_entry(
            ref_outputs["poses"].reshape(len(labels), k, -1)[np.arange(len(labels)), labels], labels, k, output)
        for name, output in GAUSSIAN_FEATURES.items() if name in names and output in ref_outputs
    }  # fmt: skip
    network = network if "pattern" in names else None
    if "pattern" in names and network is None:
        raise ValueError("the pattern feature needs a fitted network")
    features = {n: v for n, v in measure(ref_outputs, ref_images, gaussians, network).items() if n in names}
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
    if network is not None:
        ood["network"] = network
        ood["method"] += (
            "; pattern is the mean output of small two-layer perceptrons over every capsule's length and pose and "
            "what routing saw (the reconstruction distance and routing map, or the part capsules' activations), "
            "fitted on digits against synthetic non-digits (outlier exposure, Hendrycks et al. 2019)"
        )
    plain = OODCalibration.from_card(ood)
    order = [f.name for f in plain.features]

    def surprises(outputs: dict[str, np.ndarray], images: np.ndarray) -> np.ndarray:
        got = plain.surprises(measure(outputs, images, gaussians, network))
        return np.stack([got[n] for n in order], axis=1)

    bias, weights = fit_logistic(surprises(*combiner_digits), np.concatenate([surprises(o, i) for o, i in outliers]))
    ood["combiner"] = {"kind": "logistic", "bias": bias, "weights": dict(zip(order, weights.tolist(), strict=True))}
    return ood


def scores_of(calibration: OODCalibration, outputs: dict[str, np.ndarray], images: np.ndarray) -> np.ndarray:
    return calibration.score(
        calibration.measure(images, outputs["scores"], outputs.get("reconstruction"), outputs.get("poses"),
                            outputs.get("explanation"), outputs.get("parts"))
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
    "pattern": ("pattern",),
    "all and pattern": (*DYNAMIC_FEATURES, "pattern"),
    "all": DYNAMIC_FEATURES,
    "without routing": tuple(n for n in DYNAMIC_FEATURES if n != "routing_share"),
    "DARCCC features and pose": ("distance", "relative_distance", "winning_score", "margin", "ink", "pose_distance"),
    "DARCCC features": ("distance", "relative_distance", "winning_score", "margin", "ink"),
}


def held_out(n: int, val_split: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """(trained, held out) training-set indices as `capsnet-train --val-split` chose them (`hold_out`)."""
    order = np.random.default_rng(seed).permutation(n)
    return np.sort(order[val_split:]), np.sort(order[:val_split])


def test_split(n: int, combiner: int, validation: int, seed: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(combiner, validation, reported) indices of the n MNIST test digits, drawn at random with `seed`."""
    if combiner < 1 or validation < 1 or combiner + validation >= n:
        raise ValueError(
            f"--combiner {combiner} + --validation {validation} must be positive and leave some of the "
            f"{n} test digits to report"
        )
    order = np.random.default_rng(seed).permutation(n)
    return (
        np.sort(order[:combiner]),
        np.sort(order[combiner : combiner + validation]),
        np.sort(order[combiner + validation :]),
    )


def available(names: tuple[str, ...], outputs: dict[str, np.ndarray]) -> tuple[str, ...]:
    needs = {"distance": "reconstruction", "relative_distance": "reconstruction", "routing_share": "explanation",
             "pose_distance": "poses", "pattern": "poses"}  # fmt: skip
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
    network_digits: int = 20000,
    network_per_set: int = 3000,
    network_turned: int = 8000,
    network_hidden: int = HIDDEN,
    test_seed: int | None = None,
    validation_only: bool = False,
    cache: Path | None = None,
    write_card: bool = False,
    progress: Callable[[str], None] = log.info,
) -> dict[str, Any]:
    """Fit the pattern network and each candidate, choose on the validation sets, report the chosen one (and
    `previous`, a card's `ood` object, beside it) on the test sets; optionally write it into the card. The network
    learns from `network_digits` training images (not the reference) against `network_per_set` images of each
    fitting set and `network_turned` training digits turned by 90, 180 or 270 degrees. `test_seed` (default: `seed`)
    draws the non-digit test sets afresh without changing anything fitted; `validation_only` stops before the test
    sets and returns only the chosen candidate and the validation figures (nothing written)."""
    model = ModelOutputs(model_dir, cache)
    shape = tuple(model.card["input"]["shape"][1:])
    train, test = load_split(data_dir, "train"), load_split(data_dir, "test")
    trained, held = held_out(len(train), val_split, train_seed)
    if not 0 < reference <= len(trained) or not 0 <= val_split < len(train):
        raise ValueError(f"--reference {reference} must be between 1 and the {len(trained)} trained images")
    comb_idx, val_idx, test_idx = test_split(len(test), combiner, validation, seed)
    ref_idx = trained[len(trained) - reference :]
    rest = trained[: len(trained) - reference]
    if network_digits < 1 or network_per_set < 1 or network_turned < 3 or network_hidden < 1 or len(rest) == 0:
        raise ValueError(
            f"the pattern network needs training digits besides the {reference} reference images (there are "
            f"{len(rest)}), --network-digits, --network-per-set and --network-hidden of 1 or more and "
            "--network-turned of 3 or more"
        )
    net_idx = np.sort(np.random.default_rng([seed, 1]).choice(rest, min(network_digits, len(rest)), replace=False))

    def digits(split: Any, idx: np.ndarray, key: str) -> tuple[dict[str, np.ndarray], np.ndarray, np.ndarray]:
        images = to_float(split.images[idx])
        return model.run(images, key), images, split.labels[idx]

    all_test = digits(test, np.arange(len(test)), "test")

    def test_part(idx: np.ndarray) -> tuple[dict[str, np.ndarray], np.ndarray, np.ndarray]:
        return {k: v[idx] for k, v in all_test[0].items()}, all_test[1][idx], all_test[2][idx]

    def nondigits(role: str, n: int, set_seed: int = seed) -> dict[str, tuple[dict[str, np.ndarray], np.ndarray]]:
        out = {}
        for name in ROLES[role][0]:
            images = make_set(name, n, set_seed, shape, role)
            out[name] = (model.run(images, f"{role}-{name}-{n}-{set_seed}"), images)
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
    comb = test_part(comb_idx)  # unseen digits for the network
    # The combiner learns from images the network never saw: the digits the model's training held out (the
    # combiner's test digits when it held out none), other non-digits, other turned training digits.
    if len(held):
        held_digits = digits(train, held, f"train-held-{val_split}-{train_seed}")
        combiner_digits = (held_digits[0], held_digits[1])
        combiner_description = f"the {len(held)} MNIST training images the model held out (--val-split)"
    else:
        combiner_digits = (comb[0], comb[1])
        combiner_description = f"the {combiner} MNIST test digits the network also learned from (no hold-out)"

    def turned_training(idx: np.ndarray, key: str, into: dict[str, Any]) -> None:
        """Adds `turned_training_digits` to `into`: the digits of `idx` turned by 90, 180 or 270 degrees (none when
        every one stays a digit when turned, as 0, 1 and 8 do)."""
        images = np.concatenate([
            to_float(rotated_digits(train.images[idx[k::3]], train.labels[idx[k::3]], turns))
            for k, turns in enumerate((1, 2, 3))
        ])  # fmt: skip
        if len(images) == 0:
            log.warning("no turned training digits for the %s: each of the %d drawn stays a digit when turned", key,
                        len(idx))  # fmt: skip
            return
        run_key = f"train-turned-{len(idx)}-{key}-{val_split}-{train_seed}-{seed}"
        into["turned_training_digits"] = model.run(images, run_key), images

    fit_sets = nondigits("fit", per_set)
    turned_training(np.setdiff1d(rest, net_idx)[: per_set * 3 // 2], "combiner", fit_sets)
    progress(f"model outputs: {len(net_idx)} training digits and {network_turned} turned ones for the network")
    net_digits = digits(train, net_idx, f"train-net-{len(net_idx)}-{val_split}-{train_seed}-{seed}")
    net_sets = nondigits("network", network_per_set)
    turned_training(net_idx[:network_turned], "network", net_sets)
    inputs = network_inputs(ref[0])
    progress(f"fitting the pattern network on {', '.join(inputs)}")
    network = fit_network(
        inputs,
        np.concatenate([vectors(net_digits[0], net_digits[1], inputs), vectors(comb[0], comb[1], inputs)]),
        np.concatenate([vectors(o, i, inputs) for o, i in net_sets.values()]),
        hidden=network_hidden,
        seed=seed,
    )
    progress(f"model outputs: the validation non-digits and {validation} validation test digits, turned")
    val = test_part(val_idx)
    val_sets = {**nondigits("validation", per_set), **turned(test, val_idx, f"test-{validation}-validation")}
    val_description = f"{validation} MNIST test digits drawn at random (seed {seed}) as the validation"

    def at_percentile(ood: dict[str, Any], q: float, val_scores: np.ndarray) -> dict[str, Any] | None:
        """The validation figures at the q-th percentile (None when a veto alone refuses more digits)."""
        if "veto" not in ood:
            ood = {**ood, "threshold": float(np.percentile(val_scores, q))}
        elif (threshold := threshold_with_veto(val_scores, val_margins <= ood["veto"]["at_most"], q)) is not None:
            ood = {**ood, "threshold": threshold, "veto": {**ood["veto"], "score": threshold + VETO_LIFT}}
        else:
            return None
        result = evaluate_sets(OODCalibration.from_card(ood), val, val_sets)
        shares = [r["rejected"] for r in result["sets"].values()]
        veto = {"veto": ood["veto"]} if "veto" in ood else {}
        return {"worst_rejected": round(min(shares), 3), "mean_rejected": round(float(np.mean(shares)), 4),
                "threshold": ood["threshold"], **veto, **result}  # fmt: skip

    old_val = evaluate_sets(OODCalibration.from_card(previous), val, val_sets) if previous is not None else None
    tighter = [round(percentile - step, 6) for step in TIGHTER if percentile - step > 100 * TARGET_ACCEPTANCE]
    fitted: dict[str, dict[str, Any]] = {}
    candidates: dict[str, Any] = {}
    val_margins = margins(val[0]["scores"])
    vetoes = {s: {"feature": "margin", "at_most": veto_cut(comb[0]["scores"], s), "score": None,
                  "rule": f"the {s:.1%} quantile of the margins of the {combiner} MNIST test digits drawn for the "
                  "network (other writers than the training digits')"} for s in VETO_SHARES}  # fmt: skip
    for label, names in CANDIDATES.items():
        names = available(names, ref[0])
        plain = fit_detector((*ref, ref_description), combiner_digits, list(fit_sets.values()), names, network)
        val_scores = scores_of(OODCalibration.from_card(plain), val[0], val[1])
        vetoed = [(veto_label(label, s), {**plain, "veto": v}) for s, v in vetoes.items()] if "margin" in names else []
        for name, ood in [(label, plain), *vetoed]:
            if (row := at_percentile(ood, percentile, val_scores)) is None:
                continue
            rows = {f"{q:g}": at_percentile(ood, q, val_scores) for q in tighter}
            candidates[name] = {"features": list(names), "percentile": percentile, **row,
                                "tighter": {q: r for q, r in rows.items() if r is not None}}  # fmt: skip
            fitted[name] = ood
            progress(f"candidate {name!r}: validation non-digits rejected {row['worst_rejected']:.1%} (worst set), "
                     f"{row['mean_rejected']:.1%} (mean); accepted digits read right "
                     f"{row['digits']['accuracy_accepted'] or 0.0:.2%}")  # fmt: skip
    guard = old_val["digits"]["accuracy_accepted"] if old_val is not None else None
    label, chosen_percentile = choose_guarded(candidates, guard)
    ood = fitted[label]
    chosen_row = candidates[label]
    if chosen_percentile != percentile:
        chosen_row = chosen_row["tighter"][f"{chosen_percentile:g}"]
    ood["threshold"] = chosen_row["threshold"]
    if "veto" in chosen_row:
        ood["veto"] = chosen_row["veto"]
    ood["threshold_rule"] = f"the {chosen_percentile:g}th percentile of the scores of {val_description}"
    validation_report: dict[str, Any] = {"candidates": candidates, "percentile": chosen_percentile}
    if old_val is not None:
        validation_report["previous"] = old_val
        met = None if guard is None else (chosen_row["digits"]["accuracy_accepted"] or 0.0) >= guard
        validation_report["accuracy_guard"] = {"previous_accuracy_accepted": guard, "met": met}
    ood["target_acceptance"] = TARGET_ACCEPTANCE
    ood["digit_split"] = {"seed": seed, "combiner": combiner, "validation": validation}
    calibration = OODCalibration.from_card(ood)

    if validation_only:
        return {"model": model.card["name"], "chosen": label, "validation": validation_report}
    progress(f"chose {label!r}; scoring the test sets once")
    test_digits = test_part(test_idx)
    test_seed = seed if test_seed is None else test_seed
    test_sets = {**nondigits("test", per_set, test_seed), **turned(test, test_idx, f"test-{validation}-test")}
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
        "veto": ood.get("veto"),
        "reference": ref_description,
        "mnist_test_digits": f"{len(test_idx)} MNIST test digits: those not drawn (seed {seed}) for the network "
        f"({combiner}) or the validation ({validation})",
        "seed": seed,
        "test_seed": test_seed,
        "per_set": per_set,
        "fitting": {
            "network": network["fitted"],
            "network_digits": f"{len(net_idx)} MNIST training images the model trained on (not the reference), "
            f"and {combiner} MNIST test digits drawn at random (seed {seed})",
            "combiner_digits": combiner_description,
            "network_non_digits": {name: len(images) for name, (_, images) in net_sets.items()},
            "non_digits": {name: len(images) for name, (_, images) in fit_sets.items()},
        },
        "validation": validation_report,
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


def confirm(
    model_dir: Path,
    data_dir: str | None,
    *,
    combiner: int,
    validation: int,
    per_set: int,
    seed: int,
    cache: Path | None = None,
) -> dict[str, Any]:
    """The card's calibration as served, scored on the confirmation sets (fonts no other role uses) beside the
    same reported test digits as `fit_and_evaluate` (those neither the combiner nor the validation drew: the card's
    `digit_split` when it has one, else `combiner`, `validation` and `seed`)."""
    model = ModelOutputs(model_dir, cache)
    if model.card.get("ood") is None:
        raise ValueError(f"{model_dir} has no 'not a digit' calibration to confirm; run capsnet-ood --write-card first")
    shape = tuple(model.card["input"]["shape"][1:])
    test = load_split(data_dir, "test")
    split = model.card["ood"].get("digit_split") or {"seed": seed, "combiner": combiner, "validation": validation}
    _, _, test_idx = test_split(len(test), int(split["combiner"]), int(split["validation"]), int(split["seed"]))
    images = to_float(test.images)
    outputs = model.run(images, "test")
    digits = ({k: v[test_idx] for k, v in outputs.items()}, images[test_idx], test.labels[test_idx])
    sets = {}
    for name in ROLES["confirmation"][0]:
        drawn = make_set(name, per_set, seed, shape, "confirmation")
        sets[name] = (model.run(drawn, f"confirmation-{name}-{per_set}-{seed}"), drawn)
    calibration = OODCalibration.from_card(model.card["ood"])
    result = evaluate_sets(calibration, digits, sets)
    return {
        "model": model.card["name"], "version": model.card["version"], "threshold": calibration.threshold,
        "features": [f.name for f in calibration.features], "seed": seed, "per_set": per_set,
        "digit_split": split, "mnist_test": result["digits"], "sets": result["sets"],
    }  # fmt: skip


def training_split(card: dict[str, Any]) -> tuple[int, int]:
    """(--val-split, --seed) of the card's training command: which training images the model held out."""
    training = card.get("training") or {}
    found = re.search(r"--val-split[ =](\d+)", str(training.get("command", "")))
    return (int(found.group(1)) if found else 0), int(training.get("seed") or 0)

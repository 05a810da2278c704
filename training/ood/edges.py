"""Edge pairs: two images just either side of a card's "not a digit" threshold, for the tests that pin the flag.

`edge_pair` blends a typeset digit into a letter and bisects on the blend; for a card with a misread veto,
`veto_pair` blends one typeset digit into another until the margin crosses the veto's cut. `write_edges` keeps them
per model in a JSON file (tests/service/runtime/ood_edges.json), `capsnet-ood --write-edges` the command.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np

from service.contract import OODCalibration, array_from_pixels, preprocess, read_card
from training.ood.fitted import ModelOutputs

EDGE_DIGITS = "4712309568"  # typeset digits tried, in turn, as the in-distribution end of an edge pair
EDGE_OTHERS = "HAKXTPE"  # and letters as the other end
EDGE_STEPS = 40
EDGE_NEAR = 0.02  # a pair whose scores both lie this close to the threshold (relatively) ends the search
EDGE_CLEAR = 1e-3  # and no closer than this: a batch's size moves a served score by up to about 1e-4
EDGE_CLEAR_MIN = 5e-4  # nor closer than this, however small the threshold


def typeset(char: str) -> np.ndarray:
    """A DejaVu Sans character as the service prepares an upload of it: uint8 (28, 28), white on black."""
    from training.ood.nondigits import font_paths, typeset

    canvas = typeset(char, font_paths()[0])
    return np.round(preprocess(canvas, (28, 28)).array.reshape(28, 28) * 255).astype(np.uint8)


def blend(digit: np.ndarray, other: np.ndarray, t: float) -> np.ndarray:
    return np.round((1 - t) * digit.astype(np.float64) + t * other).astype(np.uint8)


def scorer(model: ModelOutputs, calibration: OODCalibration) -> Callable[[np.ndarray], tuple[float, dict[str, Any]]]:
    """The score and features of one uint8 (28, 28) image, fed as the service feeds an uploaded array."""

    def score(pixels: np.ndarray) -> tuple[float, dict[str, np.ndarray]]:
        images = array_from_pixels(pixels.tolist(), (28, 28)).astype(np.float32).reshape(1, 1, 28, 28)  # as served
        out = model.run(images)
        args = (out["scores"], out.get("reconstruction"), out.get("poses"), out.get("explanation"), out.get("parts"))
        features = calibration.measure(images, *args)
        return float(calibration.score(features)[0]), features

    return score


def edge_pair(model_dir: Path) -> dict[str, Any]:
    """Two images on either side of the card's threshold, as close to it as uint8 pixels allow: a typeset digit
    blended into a letter (bisection on the blend), the first pair within EDGE_NEAR of it and no closer than
    EDGE_CLEAR, or else the closest.
    For tests that pin the served flag."""
    model = ModelOutputs(model_dir)
    calibration = OODCalibration.from_card(model.card["ood"])
    score = scorer(model, calibration)

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
            gaps = [abs(pair[side]["ood_score"] - calibration.threshold) for side in ("below", "above")]
            if min(gaps) < max(EDGE_CLEAR * abs(calibration.threshold), EDGE_CLEAR_MIN):
                continue  # too close for the served flag to be sure of the side
            gap = max(gaps)
            if best is None or gap < best[0]:
                best = (gap, pair)
            if gap < EDGE_NEAR * abs(calibration.threshold):
                return pair
    if best is not None:
        return best[1]
    raise ValueError(
        f"no typeset digit of {EDGE_DIGITS} is accepted and letter of {EDGE_OTHERS} rejected (or every blend of "
        f"such a pair scores within {EDGE_CLEAR:g} of the threshold, relatively)"
    )


def veto_pair(model_dir: Path) -> dict[str, Any] | None:
    """For a card with a misread veto: two images either side of its cut, both accepted by the score without the
    veto, so that the veto alone flips the flag: a typeset digit blended into another (bisection on the blend
    where the margin first falls to the cut, then on the pixels, `straddle`), the first pair whose margins lie within
    EDGE_NEAR of the cut, or else the closest. None for a card without a veto."""
    model = ModelOutputs(model_dir)
    calibration = OODCalibration.from_card(model.card["ood"])
    veto = calibration.veto
    if veto is None:
        return None
    score, plain = scorer(model, calibration), scorer(model, replace(calibration, veto=None))

    def vetoed(pixels: np.ndarray) -> bool:
        return bool(plain(pixels)[1][veto.feature][0] <= veto.at_most)

    best: tuple[float, dict[str, Any]] | None = None
    for d, e in ((d, e) for d in EDGE_DIGITS for e in EDGE_DIGITS if d != e):
        digit, other = typeset(d), typeset(e)
        steps = np.linspace(0, 1, EDGE_STEPS + 1)
        crossed = next((t for t in steps if vetoed(blend(digit, other, t))), None)
        if crossed is None or crossed == 0:
            continue
        low, high = crossed - steps[1], crossed
        for _ in range(EDGE_STEPS):
            middle = (low + high) / 2
            low, high = (low, middle) if vetoed(blend(digit, other, middle)) else (middle, high)
        outside, inside = straddle(blend(digit, other, low), blend(digit, other, high), vetoed)
        sides = {"outside": outside, "inside": inside}
        if any(plain(pixels)[0] > calibration.threshold for pixels in sides.values()):
            continue  # the score alone refuses one of them: not the veto's doing
        pair: dict[str, Any] = {"digits": d + e, "at_most": veto.at_most, "score": veto.score}
        for side, pixels in sides.items():
            value, features = score(pixels)
            pair[side] = {
                "pixels": pixels.tolist(), "ood_score": value, veto.feature: float(features[veto.feature][0]),
                "parts": {part.name: part.contribution for part in calibration.parts(features)[0]},
            }  # fmt: skip
        gap = max(abs(pair[side][veto.feature] / veto.at_most - 1) for side in sides)
        if best is None or gap < best[0]:
            best = (gap, pair)
        if gap < EDGE_NEAR:
            return pair
    if best is not None:
        return best[1]
    raise ValueError(f"no blend of two typeset digits of {EDGE_DIGITS} crosses the veto's cut while the score "
                     "without the veto accepts it")  # fmt: skip


def straddle(
    outside: np.ndarray, inside: np.ndarray, vetoed: Callable[[np.ndarray], bool]
) -> tuple[np.ndarray, np.ndarray]:
    """Two images that differ in one pixel, the first not `vetoed` and the second vetoed, between `outside` (not
    vetoed) and `inside` (vetoed): bisection on how many of the pixels in which they differ come from `inside`. Two
    blends a step apart differ in many pixels at once, too coarse for a small cut."""
    changed = np.flatnonzero(outside != inside)

    def mixed(k: int) -> np.ndarray:
        image = outside.copy()
        image.flat[changed[:k]] = inside.flat[changed[:k]]
        return image

    low, high = 0, len(changed)  # mixed(low) is not vetoed, mixed(high) is
    while high - low > 1:
        middle = (low + high) // 2
        low, high = (low, middle) if vetoed(mixed(middle)) else (middle, high)
    return mixed(low), mixed(high)


def write_edges(model_dir: Path, file: Path) -> dict[str, Any]:
    """Add (or replace) the model's edge pair (and veto pair) in a JSON file of edge pairs by model name."""
    pairs = json.loads(file.read_text()) if file.is_file() else {}
    name = read_card(model_dir)["name"]
    pairs[name] = edge_pair(model_dir)
    if (vetoed := veto_pair(model_dir)) is not None:
        pairs[name]["veto"] = vetoed
    file.parent.mkdir(parents=True, exist_ok=True)
    file.write_text(json.dumps(dict(sorted(pairs.items()))) + "\n")
    return pairs[name]

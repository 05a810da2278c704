"""The choice of the "not a digit" score on the validation sets: which candidate feature set, at which threshold
percentile (`training.ood.fitted` fits the candidates and reports the choice)."""

from __future__ import annotations

from typing import Any

import numpy as np

CHOICE_MARGIN = 0.01  # worst-set shares this close to the best (about one standard error at 1,000 images) tie
TARGET_ACCEPTANCE = 0.99  # of unseen digits, the flag's promise
TIGHTER = (0.1, 0.2)  # percentile points a threshold may come down by to keep the previous score's accuracy
# The misread vetoes offered: each refuses readings whose margin is at most that of this share of unseen digits
# written by other hands than the training digits (MNIST's test writers, whose digits the network learns from)
VETO_SHARES = (0.002, 0.003, 0.004, 0.005)
VETO_LIFT = 1.0  # a vetoed image scores at least this far above the threshold


def margins(scores: np.ndarray) -> np.ndarray:
    """(N,) winning minus runner-up score of each row of scores (N, K)."""
    ranked = np.sort(scores.astype(np.float64), axis=1)
    return ranked[:, -1] - ranked[:, -2]


def veto_cut(scores: np.ndarray, share: float) -> float:
    """The margin at the `share` quantile of digits' scores (N, K)."""
    return float(np.quantile(margins(scores), share))


def veto_label(label: str, share: float) -> str:
    """The name of candidate `label` with the misread veto at `share`."""
    return f"{label}, misread veto {share:.1%}"


def threshold_with_veto(scores: np.ndarray, vetoed: np.ndarray, q: float) -> float | None:
    """The threshold at which `q` percent of validation digits are accepted when the `vetoed` ones are refused
    whatever their score; None when the veto alone refuses more than 100 - q percent."""
    if vetoed.mean() * 100 > 100 - q:
        return None
    return float(np.percentile(np.where(vetoed, scores.max() + VETO_LIFT, scores), q))


def choose(candidates: dict[str, Any]) -> str:
    """The candidate whose worst validation set is rejected most; among those within CHOICE_MARGIN of it, the one
    with the most features (more parts explain a flag), then the best mean share."""
    best = max(c["worst_rejected"] for c in candidates.values())
    close = [label for label, c in candidates.items() if c["worst_rejected"] >= best - CHOICE_MARGIN]
    return max(close, key=lambda k: (len(candidates[k]["features"]), candidates[k]["mean_rejected"]))


def choose_guarded(candidates: dict[str, Any], accuracy: float | None) -> tuple[str, float]:
    """(candidate, percentile): among the candidates within CHOICE_MARGIN of the best worst-set share (at their own
    percentile), `choose` those whose accepted validation digits are read as accurately as `accuracy` (the previous
    score's) or more, at the loosest threshold that does so (their own percentile, else a `tighter` one); with no
    `accuracy`, or none reaching it, `choose` at their own. Only when no strong candidate keeps the accuracy at any
    threshold does the guard look at the weaker ones, in the same way: the promise of accuracy comes first."""
    own = max(c["percentile"] for c in candidates.values())
    if accuracy is None:
        return choose(candidates), own
    best = max(c["worst_rejected"] for c in candidates.values())
    strong = {k: c for k, c in candidates.items() if c["worst_rejected"] >= best - CHOICE_MARGIN}
    for pool in (strong, candidates):
        options = sorted({own} | {float(q) for c in pool.values() for q in c.get("tighter", {})}, reverse=True)
        for q in options:
            at_q = {}
            for label, c in pool.items():
                row = c if c["percentile"] == q else c.get("tighter", {}).get(f"{q:g}")
                if row is not None and (row["digits"]["accuracy_accepted"] or 0.0) >= accuracy:
                    at_q[label] = {"features": c["features"], **row}
            if at_q:
                return choose(at_q), q
    return choose(candidates), own

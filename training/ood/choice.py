"""The choice of the "not a digit" score on the validation sets: which candidate feature set, at which threshold
percentile (`training.ood.fitted` fits the candidates and reports the choice)."""

from __future__ import annotations

from typing import Any

CHOICE_MARGIN = 0.01  # worst-set shares this close to the best (about one standard error at 1,000 images) tie
TARGET_ACCEPTANCE = 0.99  # of unseen digits, the flag's promise
TIGHTER = (0.1, 0.2)  # percentile points a threshold may come down by to keep the previous score's accuracy


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
    `accuracy`, or none reaching it, `choose` at their own. The guard never trades a detector for a weaker one."""
    own = max(c["percentile"] for c in candidates.values())
    if accuracy is None:
        return choose(candidates), own
    best = max(c["worst_rejected"] for c in candidates.values())
    strong = {k: c for k, c in candidates.items() if c["worst_rejected"] >= best - CHOICE_MARGIN}
    options = sorted({own} | {float(q) for c in strong.values() for q in c.get("tighter", {})}, reverse=True)
    for q in options:
        at_q = {}
        for label, c in strong.items():
            row = c if c["percentile"] == q else c.get("tighter", {}).get(f"{q:g}")
            if row is not None and (row["digits"]["accuracy_accepted"] or 0.0) >= accuracy:
                at_q[label] = {"features": c["features"], **row}
        if at_q:
            return choose(at_q), q
    return choose(candidates), own

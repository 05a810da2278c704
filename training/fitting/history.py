"""A training run's per-epoch history (`metrics.jsonl`): its curve, and a docs page's table with both selections.

`python -m training.fitting.history RUN/metrics.jsonl` prints a Markdown table (one row per epoch) and a summary of
the two ways to pick an epoch: best by test error (as the paper reports) and best by validation error (the
held-out 5,000 training images of `--val-split`), the latter with its test error, which is the honest
estimate. `--update docs/training.md` writes both between the page's `training-table` markers, so the
page's figures always come from the committed `metrics.jsonl`.
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from training.entry import cli_error

MARKERS = ("<!-- training-table:start -->", "<!-- training-table:end -->")


def table_markers(name: str | None) -> tuple[str, str]:
    """The page markers of a training table: unnamed (the bundled dynamic model's) or `training-table:NAME`."""
    if name is None:
        return MARKERS
    return f"<!-- training-table:{name}:start -->", f"<!-- training-table:{name}:end -->"


PRECISION_NAMES = {"float32": "float32", "bfloat16-mixed": "bf16 mixed"}
REQUIRED = ("epoch", "train_loss")  # an epoch that was not evaluated (`--eval-every`) has no test columns


def evaluated(history: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The rows of the epochs that were evaluated: those with a test error (`--eval-every` skips some)."""
    return [h for h in history if h.get("test_error") is not None]


def draw_curve(history: list[dict[str, Any]], path: Path) -> None:
    """`history` as a PNG: train and test loss, and test, validation and train error on a log scale, the held-out
    columns at the evaluated epochs."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    tested = evaluated(history)
    epochs, at = [h["epoch"] for h in history], [h["epoch"] for h in tested]
    # The held-out figures are the weight average's where it was kept (`--ema`), the train ones never are.
    averaged = (
        " (average)"
        if all(h.get("ema") for h in tested)
        else " (average in part)"
        if any(h.get("ema") for h in tested)
        else ""
    )
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(10, 4))
    ax1.plot(epochs, [h["train_loss"] for h in history], marker="o", label="train")
    if tested and all("test_loss" in h for h in tested):
        ax1.plot(at, [h["test_loss"] for h in tested], marker="o", label="test" + averaged)
    ax1.set(xlabel="epoch", ylabel="loss", title="loss")
    ax1.legend()
    if tested:
        ax2.plot(at, [100 * h["test_error"] for h in tested], marker="o", label="test error" + averaged)
    if tested and all("val_error" in h for h in tested):
        ax2.plot(at, [100 * h["val_error"] for h in tested], marker="o", label="validation error" + averaged)
    if all("train_accuracy" in h for h in history):
        ax2.plot(epochs, [100 * (1 - h["train_accuracy"]) for h in history], marker="o", label="train error")
    ax2.set(xlabel="epoch", ylabel="error (%)", title="error", yscale="log")
    if ax2.lines:  # none before the first evaluation of a run without train accuracy
        ax2.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


class HistoryError(ValueError):
    """A metrics.jsonl that cannot be read as a training history (the message names the file and line)."""


def load_history(path: Path) -> list[dict[str, Any]]:
    """The epochs of `path`, in order; the last record of an epoch wins (a resumed run may repeat one)."""
    try:
        lines = Path(path).read_text().splitlines()
    except OSError as e:
        raise HistoryError(f"cannot read {path}: {e.strerror or e}") from e
    epochs: dict[int, dict[str, Any]] = {}
    for number, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except json.JSONDecodeError as e:
            raise HistoryError(f"{path}:{number}: not JSON ({e.msg})") from e
        missing = [key for key in REQUIRED if not isinstance(record, dict) or key not in record]
        if missing:
            raise HistoryError(f"{path}:{number}: missing {', '.join(missing)}")
        epochs[int(record["epoch"])] = record
    if not evaluated(list(epochs.values())):
        raise HistoryError(f"{path} has no evaluated epochs" if epochs else f"{path} has no epochs")
    return [epochs[e] for e in sorted(epochs)]


@dataclass(frozen=True)
class Selection:
    """One way of choosing the epoch to ship: the epoch and its test error."""

    rule: str
    epoch: int
    test_error: float


def selections(history: list[dict[str, Any]]) -> list[Selection]:
    """Best by test error and, when the run held out validation images, best by validation error.

    Only evaluated epochs are candidates; ties go to the earlier epoch (what `best.pt` / `best_val.pt` keep:
    they are only replaced by a strictly better epoch).
    """
    by_test = min(evaluated(history), key=lambda h: (h["test_error"], h["epoch"]))
    chosen = [Selection("best test error (as the paper reports)", by_test["epoch"], by_test["test_error"])]
    validated = [h for h in history if "val_error" in h]
    if validated:
        by_val = min(validated, key=lambda h: (h["val_error"], h["epoch"]))
        chosen.append(
            Selection(
                f"best validation error ({by_val['val_error']:.2%} on {by_val.get('val_n', '?')} held-out images)",
                by_val["epoch"],
                by_val["test_error"],
            )
        )
    return chosen


def _percent(value: float | None) -> str:
    return "" if value is None else f"{value:.2%}"


def render_table(history: list[dict[str, Any]]) -> str:
    """The Markdown table: one row per epoch (empty test cells where not evaluated), the selected ones in bold."""
    bold = {s.epoch for s in selections(history)}
    has_val = any("val_error" in h for h in history)
    head = ["epoch", "train loss", "train error", "test error (10,000 images)"]
    head += ["validation error"] if has_val else []
    head += ["learning rate", "precision", "seconds"]
    rows = ["| " + " | ".join(head) + " |", "|" + "|".join("---:" if h != "precision" else "---" for h in head) + "|"]
    for h in history:
        train_error = 1 - h["train_accuracy"] if "train_accuracy" in h else None
        test = _percent(h.get("test_error"))
        cells = [str(h["epoch"]), f"{h['train_loss']:.4f}", _percent(train_error)]
        cells.append(f"**{test}**" if h["epoch"] in bold else test)
        cells += [_percent(h.get("val_error"))] if has_val else []
        lr = h.get("lr")
        cells.append("" if lr is None else f"{lr:.6f}")
        precision = str(h.get("precision", "float32"))
        cells.append(PRECISION_NAMES.get(precision, precision))
        cells.append(f"{h['seconds']:.0f}" if "seconds" in h else "")
        rows.append("| " + " | ".join(cells) + " |")
    return "\n".join(rows)


def epoch_ranges(rows: list[dict[str, Any]]) -> str:
    """The rows' epochs as runs, e.g. "2–5, 8" (rows sorted by epoch)."""
    runs: list[list[int]] = []
    for epoch in (int(h["epoch"]) for h in rows):
        if runs and epoch == runs[-1][1] + 1:
            runs[-1][1] = epoch
        else:
            runs.append([epoch, epoch])
    return ", ".join(str(a) if a == b else f"{a}–{b}" for a, b in runs)


def averaged_note(history: list[dict[str, Any]]) -> str | None:
    """Which epochs were evaluated with the weights' moving average (`--ema`), as a sentence; None: none were."""
    averaged = [h for h in history if h.get("ema")]
    if not averaged:
        return None
    decays = ", ".join(map(str, sorted({h["ema"] for h in averaged})))
    which = "Every epoch's" if len(averaged) == len(history) else f"Epochs {epoch_ranges(averaged)}:"
    return (
        f"{which} test and validation errors are those of the weights' exponential moving average (`--ema`, decay "
        f"{decays} per step), the weights its checkpoints save and export; the train loss and error are the trained "
        "weights'."
    )


def render(history: list[dict[str, Any]], source: str) -> str:
    """Table plus the selections, as the docs pages show them."""
    lines = [f"Per epoch, from `{source}`:", "", render_table(history), ""]
    if note := averaged_note(history):
        lines += [note, ""]
    if len(evaluated(history)) < len(history):
        lines += ["An empty test error is an epoch that was not evaluated (`capsnet-train --eval-every`).", ""]
    for s in selections(history):
        lines.append(f"- Selected by {s.rule}: epoch {s.epoch}, test error **{s.test_error:.2%}**.")
    return "\n".join(lines) + "\n"


def replace_between_markers(text: str, content: str, markers: tuple[str, str] = MARKERS) -> str:
    """`text` with everything between the two markers replaced by `content` (the markers stay)."""
    start, end = markers
    if text.count(start) != 1 or text.count(end) != 1 or text.index(start) > text.index(end):
        raise HistoryError(f"expected one {start} followed by one {end}")
    head, rest = text.split(start, 1)
    return head + start + "\n" + content + rest[rest.index(end) :]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m training.fitting.history", description=__doc__.split("\n\n")[0])
    parser.add_argument("metrics", type=Path, help="a run's metrics.jsonl")
    parser.add_argument(
        "--update",
        "--update-readme",
        dest="update_readme",
        type=Path,
        metavar="PAGE",
        help="rewrite the Markdown page PAGE between its training-table markers (e.g. docs/training.md)",
    )
    parser.add_argument(
        "--table",
        metavar="NAME",
        help="with --update: the table between the training-table:NAME markers, for a page with several "
        "(default: the unnamed training-table markers)",
    )
    parser.add_argument(
        "--source", help="the path the text names as the table's source (default: the metrics path as given)"
    )
    args = parser.parse_args(argv)
    try:
        text = render(load_history(args.metrics), args.source or str(args.metrics))
        if args.update_readme is None:
            print(text, end="")
            return 0
        readme = args.update_readme.read_text()
        args.update_readme.write_text(replace_between_markers(readme, text, table_markers(args.table)))
    except (HistoryError, OSError) as e:
        return cli_error("python -m training.fitting.history", e)
    print(f"{args.update_readme} updated")
    return 0


if __name__ == "__main__":
    sys.exit(main())

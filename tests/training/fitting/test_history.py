"""training.fitting.history: the docs' training tables are rendered from metrics.jsonl, with both selections."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from training.fitting.history import (
    MARKERS,
    HistoryError,
    draw_curve,
    evaluated,
    load_history,
    main,
    render,
    render_table,
    replace_between_markers,
    selections,
    table_markers,
)

ROOT = Path(__file__).resolve().parents[3]


def _write(path: Path, records: list[dict]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in records))
    return path


def _epoch(epoch: int, test: float, val: float | None = None, **extra: object) -> dict:
    record = {"epoch": epoch, "train_loss": 0.1 / epoch, "train_accuracy": 0.99, "test_error": test, "lr": 0.001}
    if val is not None:
        record.update(val_error=val, val_n=5000)
    return record | extra


def test_selections_report_best_by_test_and_the_validation_choice_with_its_test_error(tmp_path: Path) -> None:
    history = load_history(
        _write(tmp_path / "m.jsonl", [_epoch(1, 0.006, 0.010), _epoch(2, 0.004, 0.009), _epoch(3, 0.005, 0.007)])
    )
    by_test, by_val = selections(history)
    assert (by_test.epoch, by_test.test_error) == (2, 0.004)
    assert (by_val.epoch, by_val.test_error) == (3, 0.005)
    assert "0.70% on 5000 held-out images" in by_val.rule


def test_ties_go_to_the_earlier_epoch_like_best_pt(tmp_path: Path) -> None:
    history = load_history(_write(tmp_path / "m.jsonl", [_epoch(1, 0.005), _epoch(2, 0.005)]))
    (by_test,) = selections(history)
    assert by_test.epoch == 1


def test_a_repeated_epoch_keeps_its_last_record_and_epochs_are_sorted(tmp_path: Path) -> None:
    history = load_history(_write(tmp_path / "m.jsonl", [_epoch(2, 0.009), _epoch(1, 0.01), _epoch(2, 0.004)]))
    assert [h["epoch"] for h in history] == [1, 2]
    assert history[1]["test_error"] == 0.004


def test_table_bolds_the_selected_epochs_and_shows_validation_only_when_present(tmp_path: Path) -> None:
    plain = render_table([_epoch(1, 0.006), _epoch(2, 0.004, precision="bfloat16-mixed", seconds=12.4)])
    assert "validation" not in plain
    assert "| 2 | 0.0500 | 1.00% | **0.40%** | 0.001000 | bf16 mixed | 12 |" in plain
    assert "| 1 | 0.1000 | 1.00% | 0.60% | 0.001000 | float32 |  |" in plain
    with_val = render_table([_epoch(1, 0.006, 0.01), _epoch(2, 0.004, 0.02)])
    assert "validation error" in with_val
    assert "**0.60%** | 1.00%" in with_val and "**0.40%** | 2.00%" in with_val


def test_render_says_from_which_epoch_the_errors_are_the_averages() -> None:
    assert "moving average" not in render([_epoch(1, 0.006), _epoch(2, 0.004)], "m.jsonl")
    rows = [_epoch(1, 0.006), _epoch(2, 0.004, ema=0.999), _epoch(3, 0.004, ema=0.999), _epoch(4, 0.004)]
    text = render([*rows, _epoch(5, 0.003, ema=0.99)], "m.jsonl")
    assert "Epochs 2–3, 5: test and validation errors are those of the weights' exponential moving average" in text
    assert "(`--ema`, decay 0.99, 0.999 per step)" in text
    assert "Every epoch's test" in render([_epoch(1, 0.006, ema=0.9)], "m.jsonl")


def test_epochs_not_evaluated_have_empty_test_cells_and_are_never_selected(tmp_path: Path) -> None:
    """`--eval-every 2`: epochs 1 and 3 have no test columns; the best is chosen among 2 and 4."""
    skipped = [{"epoch": e, "train_loss": 0.1 / e, "lr": 0.001} for e in (1, 3)]
    rows = [*skipped, _epoch(2, 0.006), _epoch(4, 0.004)]
    history = load_history(_write(tmp_path / "m.jsonl", rows))
    assert [h["epoch"] for h in evaluated(history)] == [2, 4]
    (by_test,) = selections(history)
    assert (by_test.epoch, by_test.test_error) == (4, 0.004)
    text = render(history, "m.jsonl")
    assert "| 3 | 0.0333 |  |  | 0.001000 | float32 |  |" in text and "**0.40%**" in text
    assert "An empty test error is an epoch that was not evaluated (`capsnet-train --eval-every`)." in text
    draw_curve(history, tmp_path / "curve.png")
    draw_curve(skipped[:1], tmp_path / "first.png")  # the first epoch of a run that evaluates every 2nd
    assert (tmp_path / "curve.png").stat().st_size > 1000 and (tmp_path / "first.png").stat().st_size > 1000


@pytest.mark.parametrize(
    ("content", "message"),
    [
        ("", "has no epochs"),
        ("{not json\n", "m.jsonl:1: not JSON"),
        ('{"epoch": 1}\n', "m.jsonl:1: missing train_loss"),
        ('{"epoch": 1, "train_loss": 0.1}\n', "m.jsonl has no evaluated epochs"),
        ("[1, 2]\n", "m.jsonl:1: missing epoch"),
    ],
)
def test_bad_histories_name_the_file_and_line(tmp_path: Path, content: str, message: str) -> None:
    path = tmp_path / "m.jsonl"
    path.write_text(content)
    with pytest.raises(HistoryError, match=message):
        load_history(path)


def test_replace_between_markers_needs_exactly_one_pair() -> None:
    start, end = MARKERS
    assert replace_between_markers(f"a\n{start}\nold\n{end}\nb", "new\n") == f"a\n{start}\nnew\n{end}\nb"
    for broken in ("no markers", f"{end}\n{start}", f"{start}{start}{end}"):
        with pytest.raises(HistoryError, match="expected one"):
            replace_between_markers(broken, "x")


def test_cli_updates_a_readme_and_fails_in_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    metrics = _write(tmp_path / "m.jsonl", [_epoch(1, 0.006)])
    readme = tmp_path / "README.md"
    start, end = MARKERS
    readme.write_text(f"intro\n{start}\nstale\n{end}\nrest\n")
    assert main([str(metrics), "--update-readme", str(readme), "--source", "docs/m.jsonl"]) == 0
    assert readme.read_text() == f"intro\n{start}\n{render(load_history(metrics), 'docs/m.jsonl')}{end}\nrest\n"
    assert main([str(tmp_path / "missing.jsonl")]) == 2
    err = capsys.readouterr().err
    assert err.startswith("python -m training.fitting.history: error: cannot read") and err.count("\n") == 1


@pytest.mark.parametrize(
    "model, table, page",
    [
        ("capsnet-mnist", None, "docs/training.md"),
        ("capsnet-mnist/from-scratch", "capsnet-mnist-from-scratch", "docs/training.md"),
        ("capsnet-em-mnist", "capsnet-em-mnist", "docs/em-model.md"),
    ],
)
def test_the_pages_table_is_what_the_committed_metrics_render(model: str, table: str | None, page: str) -> None:
    """The docs' training figures come from the committed metrics.jsonl, not from hand edits."""
    text = (ROOT / page).read_text()
    source = f"docs/training/{model}/metrics.jsonl"
    assert source in text
    expected = replace_between_markers(text, render(load_history(ROOT / source), source), table_markers(table))
    option = f" --table {table}" if table else ""
    assert text == expected, f"run: python -m training.fitting.history {source} --update {page}{option}"


def test_named_tables_have_their_own_markers(tmp_path: Path) -> None:
    metrics = _write(tmp_path / "m.jsonl", [_epoch(1, 0.02)])
    readme = tmp_path / "README.md"
    start, end = table_markers("em")
    readme.write_text(f"{MARKERS[0]}\nkept\n{MARKERS[1]}\n{start}\nold\n{end}\n")
    assert main([str(metrics), "--update", str(readme), "--table", "em"]) == 0
    text = readme.read_text()
    assert "kept" in text and "old" not in text and "2.00%" in text.split(start)[1]

"""What `capsnet-train` and `capsnet-evaluate` print, run as console scripts into a log (stderr not a terminal)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import REPO_ROOT

SCRIPTS = Path(sys.executable).parent  # this environment's console scripts (.venv/bin)


def run(script: str, *args: str, cwd: Path = REPO_ROOT) -> subprocess.CompletedProcess[str]:
    """The console script by the path a newcomer types (relative to the checkout), PATH without any venv."""
    command = os.path.relpath(SCRIPTS / script, cwd)
    if not (SCRIPTS / script).exists():
        pytest.skip(f"{script} is not installed in {SCRIPTS} (pip install -e .)")
    env = {k: v for k, v in os.environ.items() if k != "CAPSNET_DATA_DIR"} | {"PATH": "/usr/bin:/bin"}
    return subprocess.run([command, *args], cwd=cwd, env=env, capture_output=True, text=True, timeout=600)


@pytest.fixture(scope="module")
def trained(mnist_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, subprocess.CompletedProcess[str]]:
    out = tmp_path_factory.mktemp("runs") / "my-run"
    done = run(
        "capsnet-train", "--data-dir", str(mnist_dir), "--out", str(out), "--preset", "tiny", "--epochs", "2",
        "--batch-size", "16", "--device", "cpu",
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    return out, done


def test_training_into_a_log_has_no_carriage_returns_and_says_what_it_evaluates(
    trained: tuple[Path, subprocess.CompletedProcess[str]],
) -> None:
    _, done = trained
    assert "\r" not in done.stderr  # no progress bar redrawn into a file
    for epoch in (1, 2):
        assert f"epoch {epoch}/2: training, steps 1 to 4" in done.stderr
    assert done.stderr.count("evaluating on 32 test images") == 2  # one line per evaluation, where a bar would be


def test_each_epoch_is_printed_once(trained: tuple[Path, subprocess.CompletedProcess[str]]) -> None:
    out, done = trained
    (line,) = done.stdout.splitlines()  # the last epoch's row, on stdout only
    rows = [json.loads(r) for r in (out / "metrics.jsonl").read_text().splitlines()]
    assert json.loads(line) == rows[-1] and len(rows) == 2
    assert '"epoch"' not in done.stderr  # the log's line per epoch is prose, not the row again
    best = min(r["test_error"] for r in rows)
    assert f"epoch 2/2: test error {rows[1]['test_error']:.2%} (best {best:.2%}), train loss" in done.stderr


def test_training_ends_saying_what_it_wrote_and_what_to_run_next(
    trained: tuple[Path, subprocess.CompletedProcess[str]], mnist_dir: Path
) -> None:
    out, done = trained
    rows = [json.loads(r) for r in (out / "metrics.jsonl").read_text().splitlines()]
    best = min(rows, key=lambda r: (r["test_error"], r["epoch"]))
    assert done.stderr.splitlines()[-3:] == [
        f"capsnet-train: wrote metrics.jsonl, training_curve.png, last.pt, best.pt to {out}; best.pt is epoch "
        f"{best['epoch']} (test error {best['test_error']:.2%})",
        f"next: evaluate it:  .venv/bin/capsnet-evaluate --checkpoint {out / 'best.pt'} --data-dir {mnist_dir}",
        f"      export it to a model directory of its own:  .venv/bin/capsnet-export {out / 'best.pt'} "
        f"--out model/zoo/my-run --data-dir {mnist_dir}",
    ]
    assert not (REPO_ROOT / "model" / "zoo" / "my-run").exists()  # the suggested name is a new one


def test_evaluate_prints_shares_without_float_noise(
    trained: tuple[Path, subprocess.CompletedProcess[str]], mnist_dir: Path
) -> None:
    out, _ = trained
    done = run("capsnet-evaluate", "--checkpoint", str(out / "best.pt"), "--data-dir", str(mnist_dir), "--limit", "30")
    assert done.returncode == 0, done.stderr[-3000:]
    assert "\r" not in done.stderr
    result = json.loads(done.stdout)
    n, errors = result["n"], result["errors"]
    assert n == 30
    assert result["test_error"] == round(errors / n, 3) and result["test_accuracy"] == round((n - errors) / n, 3)
    assert result["test_error"] + result["test_accuracy"] == pytest.approx(1.0)
    for key in ("test_error", "test_accuracy"):  # at most 3 decimals for 30 images: no 0.23070000000000002
        assert len(repr(result[key]).partition(".")[2]) <= 3, result[key]


def test_shares_are_rounded_to_what_the_count_supports() -> None:
    import numpy as np

    from training.fitting.results import EvalResult

    result = EvalResult(n=10_000, errors=7_693, confusion=np.eye(10, dtype=np.int64)).to_dict()
    assert repr(result["test_accuracy"]) == "0.2307" and repr(result["test_error"]) == "0.7693"  # not 0.230700000…02
    third = EvalResult(n=3, errors=1, confusion=np.eye(10, dtype=np.int64)).to_dict()
    assert (third["test_error"], third["test_accuracy"]) == (0.33, 0.67)  # n's digits + 1 decimals

"""The thread-layout benchmark: each layout's images/s summed over its processes, and a failed worker named."""

from __future__ import annotations

import json

import pytest

from training.benchmarks import threads


def test_layouts_are_summed_and_compared(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    calls = []

    def fake(arch: str, processes: int, per_process: int, steps: int, batch: int, amp: bool) -> list[float]:
        calls.append((arch, processes, per_process, steps, batch, amp))
        return [10.0 * per_process] * processes  # two threads twice as fast as one, two processes as fast as each

    monkeypatch.setattr(threads, "run_layout", fake)
    assert threads.main(["--arch", "dynamic", "--steps", "2", "--batch-size", "8", "--amp"]) == 0
    out = json.loads(capsys.readouterr().out)
    row = out["architectures"]["dynamic"]
    assert row["images_per_second"] == {"1x1": 10.0, "1x2": 20.0, "2x1": 20.0}
    assert row["two_runs_over_one"] == 1.0 and row["per_process"]["2x1"] == [10.0, 10.0]
    assert calls == [("dynamic", 1, 1, 2, 8, True), ("dynamic", 1, 2, 2, 8, True), ("dynamic", 2, 1, 2, 8, True)]
    assert out["machine"] and out["amp"] is True


def test_a_failed_worker_is_one_line_and_exit_2(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    def broken(*_: object) -> list[float]:
        raise RuntimeError("a baseline worker failed with exit 1")

    monkeypatch.setattr(threads, "run_layout", broken)
    assert threads.main(["--arch", "baseline"]) == 2
    assert capsys.readouterr().err.strip() == "threads: error: a baseline worker failed with exit 1"

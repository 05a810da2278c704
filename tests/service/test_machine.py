"""The torch-free machine facts the benchmarks record: the CPU's busy share from /proc/stat."""

from __future__ import annotations

import pytest

from service import machine


def test_cpu_busy_percent_from_two_proc_stat_samples(monkeypatch: pytest.MonkeyPatch) -> None:
    samples = iter(["cpu  100 0 100 700 100 0 0 0 0 0\ncpu0 …", "cpu  250 0 150 800 100 0 0 0 0 0\ncpu0 …"])

    class FakePath:
        def __init__(self, path: str) -> None:
            assert path == "/proc/stat"

        def read_text(self) -> str:
            return next(samples)

    monkeypatch.setattr(machine, "Path", FakePath)
    assert machine.cpu_busy_percent(seconds=0.0) == 66.7  # 200 busy of 300 jiffies
    monkeypatch.setattr(machine, "Path", lambda path: (_ for _ in ()).throw(OSError("no /proc")))
    assert machine.cpu_busy_percent(seconds=0.0) is None

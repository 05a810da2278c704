"""The one timing loop: it runs for the time asked, at least the runs asked, and times each run on its clock."""

from __future__ import annotations

import itertools

from training.benchmarks.timing import timed_runs


def test_runs_at_least_min_runs_even_with_no_time() -> None:
    calls: list[int] = []
    durations = timed_runs(lambda: calls.append(1), 0.0, min_runs=4)
    assert len(durations) == len(calls) == 4 and all(d >= 0 for d in durations)


def test_runs_until_the_clock_says_the_time_is_up() -> None:
    ticks = itertools.count()  # a fake clock: one second per reading
    durations = timed_runs(lambda: None, 6.0, clock=lambda: float(next(ticks)))
    # readings: start 0; then per run a check (1, 4, 7) and the run's start and end (2-3, 5-6): two runs
    assert durations == [1.0, 1.0]


def test_zero_seconds_and_no_minimum_runs_nothing() -> None:
    assert timed_runs(lambda: None, 0.0) == []

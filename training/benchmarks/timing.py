"""The one timing loop every benchmark runs: a call repeated for some seconds, each run timed."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

Clock = Callable[[], float]  # seconds: time.perf_counter (wall) or time.process_time (this process's CPU)


def timed_runs(
    call: Callable[[], Any], seconds: float, min_runs: int = 0, clock: Clock = time.perf_counter
) -> list[float]:
    """Run `call` (which must block until its result is ready) until `seconds` have passed on `clock` and it ran at
    least `min_runs` times; the duration of each run on `clock`, in seconds."""
    durations: list[float] = []
    start = clock()
    while len(durations) < min_runs or clock() - start < seconds:
        t0 = clock()
        call()
        durations.append(clock() - t0)
    return durations

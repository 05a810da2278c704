"""The machine a measurement ran on and how busy it was, without torch: for the service's and training's benchmarks."""

from __future__ import annotations

import os
import platform
import time
from pathlib import Path


def usable_cpus() -> int:
    """The CPUs this process may run on (its affinity mask), not the host's count where the two differ."""
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1


def cpu_model() -> str:
    """The CPU's model name from /proc/cpuinfo where there is one, else the platform's processor or machine type."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def load_average() -> list[float] | None:
    """The 1, 5 and 15 minute load averages (None where the platform has none)."""
    return [round(x, 2) for x in os.getloadavg()] if hasattr(os, "getloadavg") else None


def cpu_busy_percent(seconds: float = 1.0) -> float | None:
    """Share of all CPUs' time spent busy over the next `seconds`, from /proc/stat (None where there is none).

    Taken just before measuring: unlike the load average, which lags by about a minute, it says
    whether something else was running at the time.
    """

    def sample() -> tuple[int, int]:
        fields = [int(x) for x in Path("/proc/stat").read_text().splitlines()[0].split()[1:]]
        idle = fields[3] + (fields[4] if len(fields) > 4 else 0)  # idle + iowait
        return sum(fields[:8]), idle  # user … steal; guest time is already inside user

    try:
        total0, idle0 = sample()
        time.sleep(seconds)
        total1, idle1 = sample()
    except (OSError, ValueError, IndexError):
        return None
    elapsed = total1 - total0
    return round(100.0 * (1.0 - (idle1 - idle0) / elapsed), 1) if elapsed > 0 else None

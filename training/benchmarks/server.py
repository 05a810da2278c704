"""The server under test for the service benchmark: a `capsnet-serve` process started and awaited, and its CPU time,
peak memory and metrics read from outside (from /proc and HTTP; None where there is no /proc)."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
import urllib.request
from dataclasses import dataclass
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[2]
CLOCK_TICKS = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100


def process_cpu_seconds(pid: int, thread: int | None = None) -> float | None:
    """User + system CPU time of a process and all its threads, or of one of its threads (the main thread's id is
    the process id), from /proc (None where there is none)."""
    path = Path(f"/proc/{pid}/stat") if thread is None else Path(f"/proc/{pid}/task/{thread}/stat")
    try:
        fields = path.read_text().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / CLOCK_TICKS
    except (OSError, IndexError, ValueError):
        return None


@dataclass
class ServerCpu:
    """The server's CPU seconds over the service windows: the whole process, and its main (event loop) thread;
    None once a reading failed."""

    process: float | None = 0.0
    loop: float | None = 0.0

    def add(self, process: float | None, loop: float | None) -> None:
        self.process = None if self.process is None or process is None else self.process + process
        self.loop = None if self.loop is None or loop is None else self.loop + loop


def cpu_since(before: float | None, after: float | None) -> float | None:
    return None if before is None or after is None else after - before


def read_text(url: str) -> str:
    with urllib.request.urlopen(url, timeout=10) as response:
        return str(response.read().decode())


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def start_server(repository: Path, port: int, env: dict[str, str], grpc_port: int = 0) -> subprocess.Popen[bytes]:
    command = [sys.executable, "-m", "service.main", "--host", "127.0.0.1", "--port", str(port)]
    command += ["--grpc-port", str(grpc_port)]
    command += ["--model-repository", str(repository), "--log-level", "warning"]
    process = subprocess.Popen(command, cwd=REPO_ROOT, env={**os.environ, **env})
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"capsnet-serve exited with {process.returncode}")
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/health/ready", timeout=1) as r:
                if r.status == 200:
                    return process
        except OSError:
            time.sleep(0.2)
    process.kill()
    raise TimeoutError("capsnet-serve did not become ready")


def peak_rss_mib(pid: int) -> float | None:
    """Peak resident memory (VmHWM) of a process, from /proc; None where /proc is not available."""
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024
    except OSError:
        return None
    return None

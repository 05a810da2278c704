"""A real `capsnet-serve` process on a free loopback port, for the tests that talk HTTP to it."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import httpx

REPO_ROOT = Path(__file__).resolve().parents[2]


def serve_command() -> list[str]:
    """The installed console script, or the same `main()` through `python -m` where it is not installed."""
    script = Path(sys.executable).with_name("capsnet-serve")
    return [str(script)] if script.exists() else [sys.executable, "-m", "service.main"]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def wait_until_ready(base: str, process: subprocess.Popen[str], timeout_s: float = 120.0) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(
                f"capsnet-serve exited with {process.returncode}: {process.stdout.read() if process.stdout else ''}"
            )
        try:
            if httpx.get(f"{base}/health/ready", timeout=1.0).status_code == 200:
                return
        except httpx.TransportError:
            pass
        time.sleep(0.2)
    raise TimeoutError("capsnet-serve did not become ready")


@contextmanager
def running_server(repository: Path, **env: str) -> Iterator[tuple[str, subprocess.Popen[str]]]:
    """Start capsnet-serve on `repository` with extra CAPSNET_* settings; yield (base URL, process) once ready."""
    port = free_port()
    settings = {"CAPSNET_INTRA_OP_THREADS": "1", "CAPSNET_WARMUP_RUNS": "1", "CAPSNET_GRPC_PORT": "0", **env}
    process = subprocess.Popen(
        [*serve_command(), "--host", "127.0.0.1", "--port", str(port), "--model-repository", str(repository)],
        cwd=REPO_ROOT,
        env={**os.environ, **settings},
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    base = f"http://127.0.0.1:{port}"
    try:
        wait_until_ready(base, process)
        yield base, process
    finally:
        if process.poll() is None:
            process.kill()
        process.wait(10)

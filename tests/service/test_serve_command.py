"""`capsnet-serve` as a newcomer runs it: the console script (and `make serve`), its ports, start-up checks and log."""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import subprocess
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import httpx
import onnxruntime as ort
import pytest

from tests.service.conftest import TINY
from tests.service.live_server import REPO_ROOT, serve_command, wait_until_ready

QUIET = {"CAPSNET_INTRA_OP_THREADS": "1", "CAPSNET_WARMUP_RUNS": "1"}


def clean_env(**settings: str) -> dict[str, str]:
    """The environment without any CAPSNET_* variable of the caller's, plus `settings`."""
    return {**{k: v for k, v in os.environ.items() if not k.startswith("CAPSNET_")}, **QUIET, **settings}


def serve(*args: str, timeout: float = 120, **settings: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*serve_command(), *args], cwd=REPO_ROOT, env=clean_env(**settings), capture_output=True, text=True,
        timeout=timeout,
    )  # fmt: skip


@contextmanager
def listening(port: int = 0) -> Iterator[int]:
    """A socket listening on a loopback port (a free one for 0), as another server would hold it."""
    with socket.socket() as taken:
        taken.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        taken.bind(("127.0.0.1", port))
        taken.listen()
        yield taken.getsockname()[1]


def free_pair() -> int:
    """A port P such that P and P + 1 are both free now."""
    for _ in range(50):
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        try:
            with socket.socket() as a, socket.socket() as b:
                a.bind(("127.0.0.1", port))
                b.bind(("127.0.0.1", port + 1))
            return port
        except OSError:
            continue
    raise RuntimeError("no two consecutive free ports")


def is_free(port: int) -> bool:
    try:
        with socket.socket() as s:
            s.bind(("127.0.0.1", port))
        return True
    except OSError:
        return False


@pytest.mark.slow
def test_make_serve_with_another_port_serves_grpc_on_the_next_one(model_repository: Path) -> None:
    """`make serve PORT=...` works as written: gRPC takes PORT + 1 instead of clashing with the default 8001."""
    port = free_pair()
    process = subprocess.Popen(
        ["make", "--no-print-directory", "serve", f"PORT={port}", "HOST=127.0.0.1"], cwd=REPO_ROOT,
        env=clean_env(CAPSNET_MODEL_REPOSITORY=str(model_repository)), stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT, text=True, start_new_session=True,
    )  # fmt: skip
    try:
        wait_until_ready(f"http://127.0.0.1:{port}", process)  # type: ignore[arg-type]
        with socket.create_connection(("127.0.0.1", port + 1), timeout=5):
            pass  # gRPC listens beside HTTP
        assert httpx.get(f"http://127.0.0.1:{port}/v1/models").json()["default_model"] == TINY
    finally:
        os.killpg(process.pid, signal.SIGTERM)
        output, _ = process.communicate(timeout=60)
    assert f"listening on 127.0.0.1:{port + 1}" in output, output[-3000:]


def test_make_serve_passes_grpc_port() -> None:
    plan = subprocess.run(
        ["make", "-n", "serve", "GRPC_PORT=9123"], cwd=REPO_ROOT, capture_output=True, text=True, check=True
    ).stdout
    assert "capsnet-serve --host 127.0.0.1 --port 8000 --grpc-port 9123" in plan
    plan = subprocess.run(["make", "-n", "serve"], cwd=REPO_ROOT, capture_output=True, text=True, check=True).stdout
    assert "--grpc-port" not in plan  # unset: capsnet-serve derives it from the port


def test_a_taken_grpc_port_is_one_line_with_a_free_alternative(model_repository: Path) -> None:
    """A second server beside a running one: its gRPC port (HTTP + 1) is taken, so it says so and exits at once."""
    port = free_pair()
    with listening(port + 1):
        started = time.monotonic()
        done = serve("--port", str(port), "--model-repository", str(model_repository))
        seconds = time.monotonic() - started
    assert done.returncode == 1 and "Traceback" not in done.stderr
    (line,) = done.stderr.strip().splitlines()
    found = re.fullmatch(
        rf"capsnet-serve: cannot listen for gRPC on 127\.0\.0\.1:{port + 1}: Address already in use; choose another "
        r"with --grpc-port or CAPSNET_GRPC_PORT \(e\.g\. --grpc-port (\d+), or make serve GRPC_PORT=\1\); "
        r"--grpc-port 0 turns gRPC off",
        line,
    )
    assert found, line
    assert is_free(int(found[1])) and seconds < 30  # nothing was loaded


def test_a_host_of_another_machine_names_the_host_not_the_port(model_repository: Path) -> None:
    done = serve("--host", "192.0.2.1", "--port", str(free_pair()), "--grpc-port", "0")  # TEST-NET-1: never local
    assert done.returncode == 1 and "Traceback" not in done.stderr
    (line,) = done.stderr.strip().splitlines()
    assert line.startswith("capsnet-serve: cannot listen on 192.0.2.1:")
    assert line.endswith(
        "not an address of this machine; choose another with --host or CAPSNET_HOST (e.g. 127.0.0.1 or 0.0.0.0)"
    )
    assert "--port" not in line


def test_an_unknown_default_model_fails_at_start(model_repository: Path) -> None:
    done = serve("--model-repository", str(model_repository), "--dry-run", CAPSNET_DEFAULT_MODEL="tinny")
    assert done.returncode == 1 and "Traceback" not in done.stderr and done.stdout == ""
    assert done.stderr.strip().splitlines()[-1] == (
        f"capsnet-serve: the default model 'tinny' (CAPSNET_DEFAULT_MODEL) is not in {model_repository}, which holds "
        "['tiny', 'tiny-em', 'tiny-nodecoder']; did you mean 'tiny'?"
    )


@pytest.fixture(scope="module")
def one_model_dry_run(model_repository: Path) -> subprocess.CompletedProcess[str]:
    """--model-repository naming one model directory, with a misspelt setting, loaded and reported (--dry-run)."""
    return serve("--model-repository", str(model_repository / TINY), "--dry-run", CAPSNET_LOGLEVEL="debug")


def test_one_model_directory_is_served_as_a_repository_of_one(
    one_model_dry_run: subprocess.CompletedProcess[str],
) -> None:
    assert one_model_dry_run.returncode == 0, one_model_dry_run.stderr[-3000:]
    report = json.loads(one_model_dry_run.stdout)
    assert report["ready"] is True and report["default_model"] == TINY
    assert list(report["models"]) == [TINY] and report["models"][TINY]["state"] == "ready"


def test_a_misspelt_setting_is_warned_about_with_the_closest_one(
    one_model_dry_run: subprocess.CompletedProcess[str],
) -> None:
    assert "WARNING service.main: ignoring CAPSNET_LOGLEVEL: no such setting; did you mean CAPSNET_LOG_LEVEL?" in (
        one_model_dry_run.stderr
    )


def test_the_log_says_which_provider_runs_and_why_the_others_do_not(
    one_model_dry_run: subprocess.CompletedProcess[str],
) -> None:
    (line,) = [s for s in one_model_dry_run.stderr.splitlines() if "execution provider" in s]
    assert "execution provider CPUExecutionProvider (CAPSNET_PROVIDER=auto)" in line
    available = ort.get_available_providers()
    if "CUDAExecutionProvider" in available and not Path("/dev/nvidia0").exists():
        assert "CUDAExecutionProvider (no GPU visible)" in line
    if "TensorrtExecutionProvider" in available:
        assert "TensorrtExecutionProvider (the service runs on CUDA or the CPU only)" in line
    assert "offers" not in line  # no bare list of providers that are not used

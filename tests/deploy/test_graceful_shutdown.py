"""SIGTERM during a burst: the real `capsnet-serve` stops accepting, answers every request it holds, exits 0.

This is what the Deployment's preStop sleep + terminationGracePeriodSeconds rely on (and `docker stop`)."""

from __future__ import annotations

import asyncio
import http.client
import io
import json
import os
import signal
import socket
import subprocess
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import grpc
import numpy as np
import pytest
from PIL import Image

from deploy.image_smoke import multipart
from service.grpc import protocol
from tests.deploy.manifests import REPO_ROOT
from tests.service.live_server import free_port, serve_command

BURST = 24  # concurrent requests in flight when SIGTERM arrives
# The batcher holds a batch open this long for more requests: the burst is still queued when SIGTERM lands,
# whatever the machine's speed, and the drain has real work to finish.
QUEUE_DELAY_MS = 1500
SHUTDOWN_TIMEOUT_S = 15
START_TIMEOUT_S = 120

pytestmark = pytest.mark.slow


@dataclass
class Outcome:
    sent: float = 0.0
    done: float = 0.0
    status: int | None = None
    body: bytes = b""
    error: str | None = None


@pytest.fixture(scope="module")
def repository(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The bundled models when they are there; otherwise a tiny exported model (needs the training extra)."""
    bundled = REPO_ROOT / "model" / "zoo"
    if any(bundled.glob("*/model.json")):
        return bundled
    try:
        from tests.service.conftest import TINY, export_tiny
    except ImportError as e:
        pytest.skip(f"no bundled model in model/zoo and no tiny export available ({e})")
    root = tmp_path_factory.mktemp("repository")
    export_tiny(root, TINY)
    return root


@pytest.fixture
def grpc_port() -> int:
    return free_port()


@pytest.fixture
def server(repository: Path, tmp_path: Path, grpc_port: int) -> Iterator[tuple[subprocess.Popen[bytes], int, Path]]:
    port = free_port()
    log = tmp_path / "server.log"
    env = {
        **os.environ,
        "OMP_NUM_THREADS": "1",
        "CAPSNET_INTRA_OP_THREADS": "1",
        "CAPSNET_MAX_BATCH_SIZE": "256",
        "CAPSNET_MAX_QUEUE_DELAY_MS": str(QUEUE_DELAY_MS),
        "CAPSNET_SHUTDOWN_TIMEOUT_S": str(SHUTDOWN_TIMEOUT_S),
        "CAPSNET_WARMUP_RUNS": "1",
        "CAPSNET_GRPC_PORT": str(grpc_port),
    }
    command = [*serve_command(), "--host", "127.0.0.1", "--port", str(port), "--model-repository", str(repository)]
    with log.open("wb") as out:
        proc = subprocess.Popen(command, env=env, stdout=out, stderr=subprocess.STDOUT)
    try:
        wait_ready(proc, port, log)
        yield proc, port, log
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def wait_ready(proc: subprocess.Popen[bytes], port: int, log: Path) -> None:
    deadline = time.monotonic() + START_TIMEOUT_S
    while time.monotonic() < deadline:
        assert proc.poll() is None, f"capsnet-serve exited with {proc.returncode}:\n{log.read_text()[-3000:]}"
        try:
            if request(port, "GET", "/v2/health/ready")[0] == 200:
                return
        except OSError:
            pass
        time.sleep(0.2)
    pytest.fail(f"capsnet-serve not ready within {START_TIMEOUT_S} s:\n{log.read_text()[-3000:]}")


def request(port: int, method: str, path: str, body: bytes | None = None, timeout: float = 10) -> tuple[int, bytes]:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
    try:
        headers = {"Content-Type": "application/json"} if body is not None else {}
        conn.request(method, path, body=body, headers=headers)
        response = conn.getresponse()
        return response.status, response.read()
    finally:
        conn.close()


def infer_body() -> bytes:
    tensor = {"name": "image", "shape": [1, 1, 28, 28], "datatype": "FP32", "data": [0.0] * 784}
    return json.dumps({"inputs": [tensor]}).encode()


def send_infer(port: int, path: str, body: bytes, outcome: Outcome, start: threading.Barrier) -> None:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=SHUTDOWN_TIMEOUT_S + 30)
    try:
        start.wait()
        conn.request("POST", path, body=body, headers={"Content-Type": "application/json"})
        outcome.sent = time.monotonic()
        response = conn.getresponse()
        outcome.status, outcome.body = response.status, response.read()
    except Exception as e:
        outcome.error = f"{type(e).__name__}: {e}"
    finally:
        outcome.done = time.monotonic()
        conn.close()


def probe_new_connections(port: int, proc: subprocess.Popen[bytes], seen: list[tuple[float, str, bool]]) -> None:
    """New connections after SIGTERM, until the process is gone: (time, outcome, server still running)."""
    while proc.poll() is None:
        try:
            outcome = str(request(port, "GET", "/health/live", timeout=5)[0])
        except ConnectionRefusedError:
            outcome = "refused"
        except OSError as e:
            outcome = type(e).__name__
        seen.append((time.monotonic(), outcome, proc.poll() is None))
        time.sleep(0.02)


def test_sigterm_drains_in_flight_requests_and_exits_zero(
    server: tuple[subprocess.Popen[bytes], int, Path],
) -> None:
    proc, port, log = server
    status, listing = request(port, "GET", "/v1/models")
    assert status == 200
    model = json.loads(listing)["default_model"]
    path, body = f"/v2/models/{model}/infer", infer_body()

    outcomes = [Outcome() for _ in range(BURST)]
    start = threading.Barrier(BURST + 1)
    workers = [threading.Thread(target=send_infer, args=(port, path, body, o, start)) for o in outcomes]
    for worker in workers:
        worker.start()
    start.wait()
    deadline = time.monotonic() + 10
    while not all(o.sent or o.error for o in outcomes) and time.monotonic() < deadline:
        time.sleep(0.01)
    assert all(o.sent for o in outcomes), [o.error for o in outcomes if o.error]
    time.sleep(0.3)  # every request read by the server and queued in the open batch

    terminated = time.monotonic()
    proc.send_signal(signal.SIGTERM)
    seen: list[tuple[float, str, bool]] = []
    prober = threading.Thread(target=probe_new_connections, args=(port, proc, seen))
    prober.start()
    try:
        returncode = proc.wait(timeout=SHUTDOWN_TIMEOUT_S + 10)
    except subprocess.TimeoutExpired:
        pytest.fail(
            f"capsnet-serve still running {SHUTDOWN_TIMEOUT_S + 10} s after SIGTERM:\n{log.read_text()[-3000:]}"
        )
    exited = time.monotonic()
    for worker in workers:
        worker.join(timeout=10)
    prober.join(timeout=10)
    server_log = log.read_text()

    in_flight = [o for o in outcomes if o.done > terminated]
    assert len(in_flight) == BURST, "the burst must still be in flight at SIGTERM for the test to mean anything"
    for o in outcomes:
        assert o.error is None and o.status == 200, f"an accepted request was not answered: {o}\n{server_log[-3000:]}"
        outputs = {out["name"]: out for out in json.loads(o.body)["outputs"]}
        assert outputs and all(out["shape"][0] == 1 for out in outputs.values())
    assert exited - terminated < SHUTDOWN_TIMEOUT_S + 5
    # New connections during the drain are refused (the listener is closed), never answered with an error.
    assert not [s for s in seen if s[1].isdigit() and int(s[1]) >= 500], seen
    assert any(outcome == "refused" and running for _, outcome, running in seen), seen
    assert "Traceback" not in server_log, server_log[-3000:]

    # 0, not -SIGTERM: uvicorn re-raises the signal after draining; service/main.py turns it into a clean exit.
    assert returncode == 0, server_log[-3000:]


def test_sigterm_drains_grpc_calls_and_exits_zero(
    server: tuple[subprocess.Popen[bytes], int, Path], grpc_port: int
) -> None:
    proc, port, log = server
    model = json.loads(request(port, "GET", "/v1/models")[1])["default_model"]
    image = np.zeros((1, 1, 28, 28), np.float32)
    message = protocol.ModelInferRequest(
        model_name=model,
        inputs=[{"name": "image", "datatype": "FP32", "shape": list(image.shape)}],
        raw_input_contents=[image.tobytes()],
    )

    async def burst() -> tuple[int, list[object], float]:
        async with grpc.aio.insecure_channel(f"127.0.0.1:{grpc_port}") as channel:
            infer = protocol.client_method(channel, "ModelInfer")
            calls = [asyncio.ensure_future(infer(message, timeout=SHUTDOWN_TIMEOUT_S + 30)) for _ in range(BURST)]
            await asyncio.sleep(1.0)  # every call received and queued in the batch held open for QUEUE_DELAY_MS
            pending = sum(not c.done() for c in calls)
            proc.send_signal(signal.SIGTERM)
            terminated = time.monotonic()
            return pending, list(await asyncio.gather(*calls, return_exceptions=True)), terminated

    pending, results, terminated = asyncio.run(burst())
    try:
        returncode = proc.wait(timeout=SHUTDOWN_TIMEOUT_S + 10)
    except subprocess.TimeoutExpired:
        pytest.fail(f"capsnet-serve still running after SIGTERM:\n{log.read_text()[-3000:]}")
    server_log = log.read_text()
    assert pending == BURST, "the burst must still be in flight at SIGTERM for the test to mean anything"
    errors = [r for r in results if isinstance(r, BaseException)]
    assert not errors, f"calls in flight at SIGTERM failed: {errors[:3]}\n{server_log[-3000:]}"
    assert all(r.outputs[0].shape[0] == 1 for r in results)  # type: ignore[attr-defined]
    assert time.monotonic() - terminated < SHUTDOWN_TIMEOUT_S + 5
    assert "gRPC stopped: calls in flight finished" in server_log
    assert "Traceback" not in server_log, server_log[-3000:]
    assert returncode == 0, server_log[-3000:]


def test_requests_sent_before_sigterm_are_read_not_reset(
    server: tuple[subprocess.Popen[bytes], int, Path],
) -> None:
    """Requests whose bytes are on the wire when SIGTERM comes (sent, not yet parsed by the server) are answered.

    uvicorn's own shutdown resets connections it has not read yet; `DrainingServer` reads on for
    CAPSNET_SHUTDOWN_READ_GRACE_S first. Raw sockets: each request is written whole before the signal.
    """
    proc, port, log = server
    rng = np.random.default_rng(0)
    body, content_type = multipart(
        [(f"d{i}.png", png((rng.random((28, 28)) > 0.8).astype(np.uint8) * 255)) for i in range(64)]
    )
    head = f"POST /v1/classify HTTP/1.1\r\nHost: x\r\nContent-Type: {content_type}\r\nContent-Length: {len(body)}\r\n"
    sockets = []
    for _ in range(12):
        sock = socket.create_connection(("127.0.0.1", port), timeout=60)
        sock.sendall((head + "Connection: close\r\n\r\n").encode() + body)
        sockets.append(sock)
    proc.send_signal(signal.SIGTERM)
    statuses = []
    for sock in sockets:
        with sock:
            reply = b""
            try:
                while chunk := sock.recv(65536):
                    reply += chunk
            except ConnectionResetError:
                reply = b"reset"
            statuses.append(reply[9:12].decode(errors="replace") if reply.startswith(b"HTTP/1.1") else "reset")
    assert statuses == ["200"] * 12, f"{statuses}\n{log.read_text()[-2000:]}"
    assert proc.wait(SHUTDOWN_TIMEOUT_S + 10) == 0


def png(array: np.ndarray) -> bytes:
    buffer = io.BytesIO()
    Image.fromarray(array).save(buffer, format="PNG")
    return buffer.getvalue()


def test_draining_server_reads_on_before_uvicorns_shutdown(monkeypatch: pytest.MonkeyPatch) -> None:
    import uvicorn

    from service.main import DrainingServer

    calls: list[float] = []

    async def uvicorn_shutdown(self: uvicorn.Server, sockets: object = None) -> None:
        calls.append(time.monotonic())

    monkeypatch.setattr(uvicorn.Server, "shutdown", uvicorn_shutdown)
    server = DrainingServer(uvicorn.Config(app=None), read_grace_s=0.3)  # type: ignore[arg-type]
    start = time.monotonic()
    asyncio.run(server.shutdown())
    assert len(calls) == 1 and calls[0] - start >= 0.3

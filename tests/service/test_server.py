"""The real `capsnet-serve` process on a loopback port: HTTP, batching of a concurrent burst, clean shutdown."""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import subprocess
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import numpy as np
import pytest

from tests.service.conftest import TINY, digit_image, png_bytes
from tests.service.live_server import running_server, serve_command

BURST = 96


@pytest.fixture(scope="module")
def server(model_repository: Path) -> Iterator[tuple[str, subprocess.Popen[str]]]:
    with running_server(model_repository, CAPSNET_LOG_LEVEL="info") as running:
        yield running


def batch_histogram(metrics: str, model: str, graph: str) -> dict[str, float]:
    pattern = re.compile(
        rf'capsnet_batch_size_(bucket|count)\{{graph="{graph}",(?:le="([^"]+)",)?model="{model}",version="1"\}} '
        r"([0-9.e+]+)"
    )
    found = {}
    for kind, le, value in pattern.findall(metrics):
        found["count" if kind == "count" else le] = float(value)
    return found


@pytest.mark.slow
def test_real_server_answers_http(server: tuple[str, subprocess.Popen[str]]) -> None:
    base, _ = server
    r = httpx.post(f"{base}/v1/classify", files=[("files", ("d.png", png_bytes(digit_image()), "image/png"))])
    assert r.status_code == 200 and r.json()["model"] == TINY
    assert httpx.get(f"{base}/v2/health/live").status_code == 200
    assert httpx.get(f"{base}/v2/models/{TINY}").json()["platform"] == "onnxruntime_onnx"
    r = httpx.post(f"{base}/v1/classify", content=b"x", headers={"content-type": "text/plain"})
    assert r.status_code == 415 and r.json()["type"] == "unsupported_media_type"


@pytest.mark.slow
def test_concurrent_burst_is_batched(server: tuple[str, subprocess.Popen[str]]) -> None:
    base, _ = server
    before = batch_histogram(httpx.get(f"{base}/metrics").text, TINY, "capsnet")
    image = np.random.default_rng(0).random((1, 1, 28, 28), dtype=np.float32)
    body = {"inputs": [{"name": "image", "shape": [1, 1, 28, 28], "datatype": "FP32", "data": image.ravel().tolist()}]}

    def call(i: int) -> tuple[int, list[float]]:
        with httpx.Client(base_url=base, timeout=60) as c:
            r = c.post(f"/v2/models/{TINY}/infer", json={**body, "id": str(i)})
            out = r.json()
            assert out["id"] == str(i)
            return r.status_code, out["outputs"][0]["data"]

    with ThreadPoolExecutor(32) as pool:
        results = list(pool.map(call, range(BURST)))
    assert [status for status, _ in results] == [200] * BURST
    first = results[0][1]
    assert all(np.allclose(data, first, atol=1e-6) for _, data in results)  # batching never mixes up rows
    after = batch_histogram(httpx.get(f"{base}/metrics").text, TINY, "capsnet")
    runs = after["count"] - before.get("count", 0)
    single = after["1.0"] - before.get("1.0", 0)
    assert runs < BURST, f"{BURST} requests took {runs} runs: nothing was batched"
    assert runs - single > 0, "no batch larger than 1 in the batch-size histogram"


@pytest.mark.slow
def test_stock_triton_client_works_unchanged(server: tuple[str, subprocess.Popen[str]]) -> None:
    httpclient = pytest.importorskip("tritonclient.http", reason="tritonclient[http] is not installed")
    base, _ = server
    client = httpclient.InferenceServerClient(url=base.removeprefix("http://"))
    assert client.is_server_live() and client.is_server_ready() and client.is_model_ready(TINY)
    assert client.get_server_metadata()["name"] == "capsnet-serve"
    metadata = client.get_model_metadata(TINY)
    assert [o["name"] for o in metadata["outputs"]] == ["lengths", "poses", "reconstruction", "explanation"]
    images = np.random.default_rng(0).random((2, 1, 28, 28), dtype=np.float32)
    results = {}
    for binary in (True, False):  # the client's default (binary tensors), then JSON
        tensor = httpclient.InferInput("image", list(images.shape), "FP32")
        tensor.set_data_from_numpy(images, binary_data=binary)
        outputs = [httpclient.InferRequestedOutput(n, binary_data=binary) for n in ("lengths", "poses")]
        result = client.infer(TINY, inputs=[tensor], outputs=outputs, request_id="triton")
        assert result.get_response()["id"] == "triton"
        results[binary] = (result.as_numpy("lengths"), result.as_numpy("poses"))
    assert results[True][0].shape == (2, 10) and results[True][1].shape == (2, 10, 8)
    np.testing.assert_allclose(results[True][0], results[False][0], atol=1e-6)
    np.testing.assert_allclose(results[True][1], results[False][1], atol=1e-6)
    client.close()


@pytest.mark.slow
def test_sigterm_shuts_down_cleanly(server: tuple[str, subprocess.Popen[str]]) -> None:
    _, process = server
    process.send_signal(signal.SIGTERM)
    assert process.wait(60) == 0
    assert process.stdout is not None
    log = process.stdout.read()
    assert "shut down: queued requests finished" in log


def test_help_states_the_defaults() -> None:
    result = subprocess.run([*serve_command(), "--help"], capture_output=True, text=True, timeout=60, check=True)
    assert "--model-repository" in result.stdout and "(default: CAPSNET_PORT or 8000)" in result.stdout


def test_dry_run_loads_every_model(model_repository: Path, broken_repository: Path) -> None:
    env = {**os.environ, "CAPSNET_INTRA_OP_THREADS": "1", "CAPSNET_WARMUP_RUNS": "0", "CAPSNET_LOG_LEVEL": "error"}
    ok = subprocess.run(
        [*serve_command(), "--dry-run", "--model-repository", str(model_repository)],
        capture_output=True,
        text=True,
        timeout=120,
        env=env,
        check=False,
    )
    assert ok.returncode == 0, ok.stderr
    report = json.loads(ok.stdout)
    assert report["ready"] is True and report["default_model"] == TINY
    assert report["models"][TINY]["provider"] == "CPUExecutionProvider"
    bad = subprocess.run(
        [*serve_command(), "--dry-run", "--model-repository", str(broken_repository)],
        capture_output=True,
        text=True,
        timeout=120,
        env=env,
        check=False,
    )
    assert bad.returncode == 1 and json.loads(bad.stdout)["models"]["altered"]["state"] == "failed"


def test_missing_repository_exits_with_a_message(tmp_path: Path) -> None:
    result = subprocess.run(
        [*serve_command(), "--model-repository", str(tmp_path / "absent")],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert result.returncode == 1
    assert f"capsnet-serve: model repository {tmp_path / 'absent'} is not a directory" in result.stderr


def test_empty_repository_and_bad_settings_exit_with_a_message(tmp_path: Path) -> None:
    empty = subprocess.run(
        [*serve_command(), "--model-repository", str(tmp_path)], capture_output=True, text=True, timeout=60, check=False
    )
    assert empty.returncode == 1 and "Traceback" not in empty.stderr
    assert f"capsnet-serve: no model directories (with model.json) in {tmp_path}" in empty.stderr
    env = {**os.environ, "CAPSNET_INTRA_OP_THREADS": "many"}
    bad = subprocess.run(
        [*serve_command(), "--port", "99999"], capture_output=True, text=True, timeout=60, env=env, check=False
    )
    assert bad.returncode == 1 and "Traceback" not in bad.stderr
    assert "capsnet-serve: invalid settings (CAPSNET_* variables or options): port: Input should be" in bad.stderr
    assert "intra_op_threads: Input should be a valid integer" in bad.stderr


def test_port_in_use_fails_at_once_with_one_line(model_repository: Path) -> None:
    """A taken port ends the command before any model loads: exit 1 and one line naming the way out."""
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        done = subprocess.run(
            [*serve_command(), "--port", str(port), "--model-repository", str(model_repository)],
            capture_output=True,
            text=True,
            timeout=120,
        )
    assert done.returncode == 1
    (line,) = done.stderr.strip().splitlines()
    found = re.fullmatch(
        rf"capsnet-serve: cannot listen on 127\.0\.0\.1:{port}: Address already in use; choose another with --port "
        r"or CAPSNET_PORT \(e\.g\. --port (\d+), or make serve PORT=\1\)",
        line,
    )
    assert found, line
    for free in (int(found[1]), int(found[1]) + 1):  # the suggestion is free, and so is its gRPC port (+ 1)
        with socket.socket() as s:
            s.bind(("127.0.0.1", free))
    assert "models" not in done.stdout + done.stderr  # no model was loaded


def test_the_app_keeps_numpys_blas_on_one_thread(model_repository: Path) -> None:
    """Beside ONNX Runtime, a second OpenBLAS thread spinning after each of the score's small products costs the
    server about a third of its throughput at concurrency 32 (docs/not-a-digit.md#cost)."""
    from threadpoolctl import threadpool_info, threadpool_limits

    from service.core.config import Settings
    from service.main import create_app

    with threadpool_limits(limits=2, user_api="blas"):  # restored afterwards, whatever create_app sets
        create_app(Settings(model_repository=model_repository))
        blas = [pool for pool in threadpool_info() if pool["user_api"] == "blas"]
        assert blas and all(pool["num_threads"] == 1 for pool in blas)

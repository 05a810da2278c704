"""Hostile requests against the real `capsnet-serve` process: each refused with a 4xx, the keep-alive connection kept,
liveness answered while the costliest is refused, and no traceback in the log."""

from __future__ import annotations

import http.client
import json
import threading
import time
from pathlib import Path
from urllib.parse import urlsplit

import httpx
import numpy as np
import pytest

from tests.service.api.test_bodies import TINY_IMAGES_BODY, multipart_body
from tests.service.conftest import TINY
from tests.service.live_server import running_server

JSON = {"Content-Type": "application/json"}


def v2_body(first_pixel: float) -> bytes:
    data = np.full(784, 0.5)
    data[0] = first_pixel
    tensor = {"name": "image", "shape": [1, 1, 28, 28], "datatype": "FP32", "data": data.tolist()}
    return json.dumps({"inputs": [tensor]}).encode()


def answer(connection: http.client.HTTPConnection, path: str, body: bytes, headers: dict[str, str]) -> int:
    connection.request("POST", path, body=body, headers=headers)
    response = connection.getresponse()
    response.read()
    return response.status


def liveness_delays(base: str, stop: threading.Event, delays: list[float]) -> None:
    with httpx.Client(base_url=base, timeout=30) as client:
        while not stop.is_set():
            start = time.perf_counter()
            assert client.get("/health/live").status_code == 200
            delays.append(time.perf_counter() - start)
            time.sleep(0.01)


@pytest.mark.slow
def test_hostile_requests_are_refused_cleanly_by_the_real_server(model_repository: Path) -> None:
    with running_server(model_repository, CAPSNET_DEFAULT_MODEL=TINY) as (base, process):
        url = urlsplit(base)
        connection = http.client.HTTPConnection(url.hostname or "", url.port, timeout=30)
        infer = f"/v2/models/{TINY}/infer"
        # One keep-alive connection: each refusal leaves it usable for the next, valid request.
        assert answer(connection, infer, v2_body(1e30), JSON) == 400
        assert answer(connection, infer, v2_body(1.0), JSON) == 200
        long_boundary = {"Content-Type": "multipart/form-data; boundary=" + "b" * 257}
        assert answer(connection, "/v1/classify", b"x", long_boundary) == 400
        assert answer(connection, "/v1/classify", b"[" + b"1" * 5000 + b"]", JSON) == 400
        parts = {"Content-Type": "multipart/form-data; boundary=xyz"}
        assert answer(connection, "/v1/classify", multipart_body(b"xyz", 70_000), parts) == 413
        assert answer(connection, infer, v2_body(0.0), JSON) == 200

        stop, delays = threading.Event(), []
        probe = threading.Thread(target=liveness_delays, args=(base, stop, delays))
        probe.start()
        time.sleep(0.2)
        start = time.perf_counter()
        assert answer(connection, "/v1/classify", TINY_IMAGES_BODY, JSON) == 413
        refused_s = time.perf_counter() - start
        time.sleep(0.2)
        stop.set()
        probe.join()
        connection.close()
        assert refused_s < 2.0, refused_s  # it took 11 s when every entry was parsed and validated first
        assert max(delays) < 0.5, delays  # 100 ms on an idle machine (training.benchmarks.hostile); slack for CI
        metrics = httpx.get(f"{base}/metrics").text
        assert 'status="500"' not in metrics and 'route="unmatched"' not in metrics
    log = process.stdout.read() if process.stdout else ""
    assert "Traceback" not in log and "ERROR" not in log, log

"""Hostile-input benchmark: how fast `capsnet-serve` refuses requests built to cost it, and how long its liveness
probe waits meanwhile.

Starts `capsnet-serve` on the model repository (gRPC off), or measures a server already running (`--url`). Each case
is sent on a fresh connection while a probe thread asks `GET /health/live` every 10 ms on a keep-alive connection;
a case reports the status it got, the time from its first byte sent to the answer (or the close), and the longest
probe that overlapped it. Prints the machine first and one row per case. No torch, no model/ import.

    python -m training.benchmarks.hostile [--model-repository model/zoo] [--url http://127.0.0.1:8000]
"""

from __future__ import annotations

import argparse
import base64
import contextlib
import http.client
import io
import json
import os
import platform
import select
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from urllib.parse import urlsplit

import numpy as np
from PIL import Image

from service.machine import cpu_busy_percent, cpu_model, load_average, usable_cpus

REPO_ROOT = Path(__file__).resolve().parents[2]
PROBE_INTERVAL_S = 0.01
CAP_STEP, MAX_HELD = 64, 8192  # connections opened at a time, and at most, looking for the server's cap
MiB = 1 << 20


Send = Callable[[tuple[str, int], bytes], tuple[int | None, float]]  # (address, payload) -> (status or None, s)


@dataclass(frozen=True)
class Case:
    name: str
    payload: Callable[[], bytes]  # built before the clock starts
    expected: str  # what the service answers by design, e.g. "400"
    send: Send = lambda address, data: exchange(address, data)


@dataclass
class Probe:
    """`GET /health/live` every PROBE_INTERVAL_S on one keep-alive connection: (start, seconds) of each."""

    address: tuple[str, int]
    samples: list[tuple[float, float]]
    stop: threading.Event

    def run(self) -> None:
        connection = http.client.HTTPConnection(*self.address, timeout=60)
        while not self.stop.is_set():
            start = time.perf_counter()
            connection.request("GET", "/health/live")
            response = connection.getresponse()
            response.read()
            self.samples.append((start, time.perf_counter() - start))
            time.sleep(PROBE_INTERVAL_S)
        connection.close()

    def longest(self, start: float, end: float) -> float:
        """The longest probe that was in flight at any time in [start, end]."""
        return max((s for t, s in self.samples if t <= end and t + s >= start), default=0.0)


def status_of(answer: bytes) -> int | None:
    line = answer.split(b"\r\n", 1)[0].split()
    return int(line[1]) if len(line) > 1 and line[1].isdigit() else None


def exchange(address: tuple[str, int], data: bytes, timeout_s: float = 120.0) -> tuple[int | None, float]:
    """Send `data` on a new connection, read until the answer's head (or the close): (status, seconds)."""
    with socket.create_connection(address, timeout=timeout_s) as sock:
        start = time.perf_counter()
        with contextlib.suppress(BrokenPipeError, ConnectionResetError):  # refused while sending: read the answer
            sock.sendall(data)
        answer = b""
        with contextlib.suppress(ConnectionResetError):
            while b"\r\n\r\n" not in answer and (chunk := sock.recv(65536)):
                answer += chunk
        return status_of(answer), time.perf_counter() - start


def post(path: str, body: bytes, content_type: str) -> bytes:
    head = f"POST {path} HTTP/1.1\r\nHost: bench\r\nContent-Type: {content_type}\r\nContent-Length: {len(body)}\r\n"
    return head.encode() + b"Connection: close\r\n\r\n" + body


def multipart(parts: list[bytes], boundary: bytes = b"hostile") -> tuple[bytes, str]:
    body = b"".join(
        b"--" + boundary + b'\r\nContent-Disposition: form-data; name="files"; filename="i.png"\r\n'
        b"Content-Type: image/png\r\n\r\n" + part + b"\r\n"
        for part in parts
    )
    return body + b"--" + boundary + b"--\r\n", f"multipart/form-data; boundary={boundary.decode()}"


def png(width: int, height: int) -> bytes:
    """A PNG of a white bar on black: compresses small, decodes at full cost."""
    pixels = np.zeros((height, width), np.uint8)
    pixels[height // 3 : height // 2, width // 4 : 3 * width // 4] = 255
    buffer = io.BytesIO()
    Image.fromarray(pixels).save(buffer, format="PNG")
    return buffer.getvalue()


def over_the_cap(address: tuple[str, int], data: bytes) -> tuple[int | None, float]:
    """Open connections, CAP_STEP at a time, until the server answers new ones at once (its cap); then time one
    more. (None, 0) when MAX_HELD connections are all held open."""
    held: list[socket.socket] = []
    try:
        while len(held) < MAX_HELD:
            batch = [socket.create_connection(address, timeout=30) for _ in range(CAP_STEP)]
            held += batch
            if select.select(batch, [], [], 0.2)[0]:  # the server wrote to (refused) one of them
                return exchange(address, data)
        return None, 0.0
    finally:
        for sock in held:
            sock.close()


def v2_huge_pixel(model: str) -> bytes:
    pixels = [1e30] + [0.0] * 783
    tensor = {"name": "image", "shape": [1, 1, 28, 28], "datatype": "FP32", "data": pixels}
    return post(f"/v2/models/{model}/infer", json.dumps({"inputs": [tensor]}).encode(), "application/json")


def json_images(entry: bytes, count: int) -> bytes:
    return post("/v1/classify", b'{"images":[' + b",".join([entry] * count) + b"]}", "application/json")


def multipart_images(parts: list[bytes]) -> bytes:
    return post("/v1/classify", *multipart(parts))


def header_value(size: int) -> bytes:
    return b"GET /health/live HTTP/1.1\r\nHost: bench\r\nX-Big: " + b"a" * size + b"\r\n\r\n"


def cases(model: str) -> list[Case]:
    """The hostile requests, each a Case; `model` is the model the v2 cases address. `expected` is what the service
    answers with its default settings (docs/security.md)."""
    base64_entry = b'{"data":"' + base64.b64encode(b"\x00\x00\x00") + b'"}'
    live = b"GET /health/live HTTP/1.1\r\nHost: bench\r\n\r\n"
    return [
        Case("v2 JSON, one pixel 1e30", lambda: v2_huge_pixel(model), "400"),
        Case("v1 multipart, 257-character boundary",
             lambda: post("/v1/classify", b"x", "multipart/form-data; boundary=" + "b" * 257), "400"),
        Case("v1 JSON, 650,000 empty images (7.4 MiB)", lambda: json_images(b'{"data":""}', 650_000), "413"),
        Case("v1 JSON, 560,000 base64 images (8.5 MiB)", lambda: json_images(base64_entry, 560_000), "413"),
        Case("v1 multipart, 70,000 empty parts", lambda: multipart_images([b""] * 70_000), "413"),
        Case("v1 multipart, 64 PNGs of 4472×4472", lambda: multipart_images([png(4472, 4472)] * 64), "413"),
        Case("v1 multipart, 4 PNGs of 2000×2000 (the default pixel budgets)",
             lambda: multipart_images([png(2000, 2000)] * 4), "200"),
        Case("1 MiB header value", lambda: header_value(MiB), "431"),
        Case("64 MiB header value", lambda: header_value(64 * MiB), "431"),
        Case("half a request line, then silence", lambda: b"GET /heal", "408 after 10 s"),
        Case("a connection that sends nothing", lambda: b"", "closed after 5 s"),
        Case("one connection more than the server holds open", lambda: live, "503", over_the_cap),
    ]  # fmt: skip


def start_server(repository: Path, port: int) -> subprocess.Popen[bytes]:
    env = {**os.environ, "CAPSNET_GRPC_PORT": "0", "CAPSNET_LOG_LEVEL": "warning"}
    command = [sys.executable, "-m", "service.main", "--port", str(port), "--model-repository", str(repository)]
    return subprocess.Popen(command, cwd=REPO_ROOT, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)


def wait_ready(address: tuple[str, int], timeout_s: float = 180.0) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        with contextlib.suppress(OSError):
            if exchange(address, b"GET /health/ready HTTP/1.1\r\nHost: bench\r\n\r\n", timeout_s=5)[0] == 200:
                return
        time.sleep(0.5)
    raise TimeoutError("capsnet-serve did not become ready")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def machine_lines() -> list[str]:
    return [
        f"date: {datetime.now(timezone.utc).isoformat(timespec='seconds')}",
        f"machine: {cpu_model()}, {usable_cpus()} usable CPUs, {platform.system()} {platform.release()}, "
        f"Python {platform.python_version()}",
        f"load average: {load_average()}, CPU busy just before: {cpu_busy_percent()} %",
    ]


def run(address: tuple[str, int], model: str) -> list[str]:
    probe = Probe(address, [], threading.Event())
    thread = threading.Thread(target=probe.run, daemon=True)
    thread.start()
    rows = [f"{'case':<62} {'expected':>20} {'got':>6} {'answered in':>12} {'liveness max':>13}"]
    for case in cases(model):
        payload = case.payload()
        time.sleep(0.2)  # probes before the case
        start = time.perf_counter()
        status, seconds = case.send(address, payload)
        end = time.perf_counter()
        time.sleep(0.1)
        got = str(status) if status is not None else "closed"
        rows.append(
            f"{case.name:<62} {case.expected:>20} {got:>6} {seconds * 1000:>9.0f} ms "
            f"{probe.longest(start, end) * 1000:>10.0f} ms"
        )
    probe.stop.set()
    thread.join(10)
    return rows


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m training.benchmarks.hostile", description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--model-repository",
        type=Path,
        default=REPO_ROOT / "model" / "zoo",
        help="repository the started server serves (default: the bundled model/zoo)",
    )
    parser.add_argument("--model", default="capsnet-mnist", help="model the v2 cases address (default: capsnet-mnist)")
    parser.add_argument("--url", help="measure this running server instead of starting one (default: start one)")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    print("\n".join(machine_lines()))
    server = None
    if args.url:
        url = urlsplit(args.url)
        address = (url.hostname or "127.0.0.1", url.port or 80)
    else:
        address = ("127.0.0.1", free_port())
        server = start_server(args.model_repository, address[1])
    try:
        wait_ready(address)
        served = args.url or f"capsnet-serve --model-repository {os.path.relpath(args.model_repository)}"
        print(f"server: {served} (the service's default limits unless CAPSNET_* variables say otherwise)")
        print("\n".join(run(address, args.model)))
    finally:
        if server is not None:
            server.terminate()
            _, errors = server.communicate(timeout=60)
            tracebacks = errors.decode(errors="replace").count("Traceback")
            print(f"server log: {len(errors.splitlines())} lines on stderr at level warning, {tracebacks} tracebacks")


if __name__ == "__main__":
    main()

"""Load generators for the service benchmark: the requests it sends, and three ways to send them.

Five request kinds, one image each: `v1-png` (multipart PNG upload to `/v1/models/{name}/classify`), `v1-json`
(the same PNG as base64 JSON), `v2-json` (an Open Inference Protocol tensor as JSON numbers), `v2-binary`
(the tensor with the binary tensor data extension) and `grpc` (ModelInfer over gRPC with raw tensor bytes).
Three drivers keep `concurrency` connections busy: a built-in asyncio client (`python`, the only one for gRPC),
and `hey` and `wrk` run as subprocesses where they are installed.
"""

from __future__ import annotations

import asyncio
import base64
import csv
import io
import json
import os
import shutil
import subprocess
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
from PIL import Image

from service.grpc.load import grpc_calls, grpc_window, infer_message
from service.grpc.protocol import method_path
from service.runtime.card import ModelCard

KINDS = ("v1-png", "v1-json", "v2-json", "v2-binary", "grpc")
GRPC_CONTENT_TYPE = "application/grpc"
DRIVERS = ("python", "hey", "wrk")
BOUNDARY = "capsnet-benchmark-boundary"
WRK_SCRIPT = """
local f = assert(io.open(os.getenv("CAPSNET_BENCH_BODY"), "rb"))
wrk.method = "POST"
wrk.body = f:read("*all")
f:close()
wrk.headers["Content-Type"] = os.getenv("CAPSNET_BENCH_CONTENT_TYPE")
local header = os.getenv("CAPSNET_BENCH_HEADER_LENGTH")
if header ~= "" then wrk.headers["Inference-Header-Content-Length"] = header end
done = function(summary, latency, requests)
  local e = summary.errors
  io.write(string.format('CAPSNET_BENCH {"requests":%d,"non2xx":%d,"socket_errors":%d,"seconds":%f,' ..
    '"p50_ms":%f,"p90_ms":%f,"p99_ms":%f}\\n', summary.requests, e.status, e.connect + e.read + e.write + e.timeout,
    summary.duration / 1e6, latency:percentile(50) / 1e3, latency:percentile(90) / 1e3, latency:percentile(99) / 1e3))
end
"""


@dataclass(frozen=True)
class Payload:
    """One HTTP request: where it goes and what it carries."""

    path: str
    content_type: str
    body: bytes
    header_length: int | None = None  # Inference-Header-Content-Length, for v2 binary tensors

    def encoded(self, host: str, port: int) -> bytes:
        """The whole HTTP/1.1 request, for the built-in client."""
        headers = {"Host": f"{host}:{port}", "Content-Type": self.content_type, "Content-Length": str(len(self.body))}
        if self.header_length is not None:
            headers["Inference-Header-Content-Length"] = str(self.header_length)
        lines = [f"POST {self.path} HTTP/1.1", *(f"{k}: {v}" for k, v in headers.items())]
        return ("\r\n".join(lines) + "\r\n\r\n").encode() + self.body


@dataclass
class LoadResult:
    """What one driver measured over one window: requests done, errors, and latencies (or their percentiles)."""

    requests: int
    errors: int
    seconds: float
    latencies_s: list[float] = field(default_factory=list)
    percentiles_ms: dict[str, float] | None = None  # from a tool that reports percentiles only (wrk)


def digit_png(height: int, width: int) -> bytes:
    """A synthetic white-on-black stroke ("7"-like) of the model's input size, as PNG."""
    a = np.zeros((height, width), np.uint8)
    sy, sx = height / 28, width / 28
    a[int(6 * sy) : int(8 * sy) + 1, int(8 * sx) : int(20 * sx)] = 255
    for r in range(int(8 * sy), int(22 * sy)):
        c = int((20 - (r / sy - 8) * 0.5) * sx)
        a[r, max(c - int(sx), 0) : c + int(sx) + 1] = 255
    buffer = io.BytesIO()
    Image.fromarray(a).save(buffer, format="PNG")
    return buffer.getvalue()


def payload(card: ModelCard, kind: str) -> Payload:
    """The request of `kind` for one image, addressed to the model of `card`."""
    if kind == "grpc":
        return Payload(method_path("ModelInfer"), GRPC_CONTENT_TYPE, infer_message(card))
    png = digit_png(*card.image_size)
    if kind == "v1-png":
        part = f'--{BOUNDARY}\r\nContent-Disposition: form-data; name="files"; filename="digit.png"\r\n'
        body = (part + "Content-Type: image/png\r\n\r\n").encode() + png + f"\r\n--{BOUNDARY}--\r\n".encode()
        return Payload(f"/v1/models/{card.name}/classify", f"multipart/form-data; boundary={BOUNDARY}", body)
    if kind == "v1-json":
        body = json.dumps({"images": [{"data": base64.b64encode(png).decode()}]}).encode()
        return Payload(f"/v1/models/{card.name}/classify", "application/json", body)
    image = np.asarray(Image.open(io.BytesIO(png)), np.float32).reshape(1, *card.image_shape) / 255.0
    tensor: dict[str, Any] = {"name": card.input.name, "shape": list(image.shape), "datatype": "FP32"}
    path = f"/v2/models/{card.name}/infer"
    if kind == "v2-json":
        body = json.dumps({"inputs": [{**tensor, "data": image.ravel().tolist()}]}).encode()
        return Payload(path, "application/json", body)
    if kind == "v2-binary":
        raw = image.astype("<f4").tobytes()
        tensor["parameters"] = {"binary_data_size": len(raw)}
        head = json.dumps({"inputs": [tensor], "parameters": {"binary_data_output": True}}).encode()
        return Payload(path, "application/octet-stream", head + raw, header_length=len(head))
    raise ValueError(f"unknown request kind {kind!r}; choose from {KINDS}")


def available_drivers(wanted: list[str]) -> tuple[list[str], dict[str, str]]:
    """The drivers of `wanted` that can run here, and a note per driver (its path, or why it is skipped)."""
    usable, notes = [], {}
    for driver in wanted:
        if driver == "python":
            usable.append(driver)
            notes[driver] = "built-in asyncio client"
        elif (path := shutil.which(driver)) is not None:
            usable.append(driver)
            notes[driver] = path
        else:
            notes[driver] = f"not installed, skipped (apt-get install {driver})"
    return usable, notes


def run_load(driver: str, host: str, port: int, request: Payload, concurrency: int, seconds: float) -> LoadResult:
    """Keep `concurrency` connections busy with `request` for about `seconds` (`port`: gRPC's for a gRPC request)."""
    if request.content_type == GRPC_CONTENT_TYPE:
        if driver != "python":
            raise ValueError(f"gRPC requests need the python driver, not {driver!r}")
        return grpc_load(f"{host}:{port}", request.body, concurrency, seconds)
    if driver == "python":
        return asyncio.run(python_load(host, port, request, concurrency, seconds))
    with tempfile.TemporaryDirectory(prefix="capsnet-bench-") as scratch:
        body = Path(scratch) / "body"
        body.write_bytes(request.body)
        if driver == "hey":
            return hey_load(f"http://{host}:{port}{request.path}", request, body, concurrency, seconds)
        if driver == "wrk":
            return wrk_load(f"http://{host}:{port}{request.path}", request, body, concurrency, seconds)
    raise ValueError(f"unknown driver {driver!r}; choose from {DRIVERS}")


async def _client(host: str, port: int, request: bytes, until: float, done: list[tuple[float, float, int]]) -> None:
    """Keep one connection busy until `until`, recording (start, end, status) of every request."""
    reader, writer = await asyncio.open_connection(host, port)
    try:
        while time.perf_counter() < until:
            t0 = time.perf_counter()
            writer.write(request)
            head = await reader.readuntil(b"\r\n\r\n")
            lines = head.lower().split(b"\r\n")
            length = next(int(line.split(b":", 1)[1]) for line in lines if line.startswith(b"content-length:"))
            await reader.readexactly(length)
            done.append((t0, time.perf_counter(), int(head[9:12])))
    finally:
        writer.close()


async def python_load(host: str, port: int, request: Payload, concurrency: int, seconds: float) -> LoadResult:
    done: list[tuple[float, float, int]] = []
    start = time.perf_counter()
    encoded = request.encoded(host, port)
    await asyncio.gather(*(_client(host, port, encoded, start + seconds, done) for _ in range(concurrency)))
    return LoadResult(
        requests=len(done),
        errors=sum(status != 200 for _, _, status in done),
        seconds=time.perf_counter() - start,
        latencies_s=[end - begin for begin, end, _ in done],
    )


def grpc_load(target: str, message: bytes, concurrency: int, seconds: float) -> LoadResult:
    """Calls with the blocking client at concurrency 1, else with the asyncio client (see service.grpc.load)."""
    if concurrency == 1:
        done = grpc_calls(target, message, seconds)
    else:
        done = asyncio.run(grpc_window(target, message, concurrency, 0.0, seconds))
    return LoadResult(
        requests=len(done),
        errors=sum(status != 200 for _, _, status in done),
        seconds=seconds,
        latencies_s=[end - begin for begin, end, _ in done],
    )


def hey_load(url: str, request: Payload, body: Path, concurrency: int, seconds: float) -> LoadResult:
    """`hey` on one CPU (it shares the machine with the server), one row per request in its CSV output."""
    command = ["hey", "-z", f"{seconds:.3f}s", "-c", str(concurrency), "-cpus", "1", "-m", "POST"]
    command += ["-T", request.content_type, "-D", str(body), "-o", "csv"]
    if request.header_length is not None:
        command += ["-H", f"Inference-Header-Content-Length: {request.header_length}"]
    start = time.perf_counter()
    out = subprocess.run([*command, url], capture_output=True, text=True, check=True, timeout=seconds + 60).stdout
    elapsed = time.perf_counter() - start
    rows = list(csv.DictReader(io.StringIO(out)))
    latencies = [float(r["response-time"]) for r in rows]
    errors = sum(r["status-code"] != "200" for r in rows)
    return LoadResult(requests=len(rows), errors=errors, seconds=elapsed, latencies_s=latencies)


def wrk_load(url: str, request: Payload, body: Path, concurrency: int, seconds: float) -> LoadResult:
    """`wrk` with one thread; a Lua script sends the body and prints the summary as JSON."""
    script = body.with_name("request.lua")
    script.write_text(WRK_SCRIPT)
    env = {
        "CAPSNET_BENCH_BODY": str(body),
        "CAPSNET_BENCH_CONTENT_TYPE": request.content_type,
        "CAPSNET_BENCH_HEADER_LENGTH": "" if request.header_length is None else str(request.header_length),
    }
    duration = max(1, round(seconds))  # wrk takes whole seconds
    command = ["wrk", "-t1", f"-c{concurrency}", f"-d{duration}s", "--timeout", "30s", "-s", str(script), url]
    done = subprocess.run(
        command, capture_output=True, text=True, check=True, timeout=duration + 60, env={**os.environ, **env}
    )
    line = next(x for x in done.stdout.splitlines() if x.startswith("CAPSNET_BENCH "))
    summary = json.loads(line.removeprefix("CAPSNET_BENCH "))
    return LoadResult(
        requests=summary["requests"],
        errors=summary["non2xx"] + summary["socket_errors"],
        seconds=summary["seconds"],
        percentiles_ms={q: summary[f"{q}_ms"] for q in ("p50", "p90", "p99")},
    )

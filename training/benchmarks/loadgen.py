"""Load generators for the service benchmark: the requests it sends, and three ways to send them.

Five request kinds, one image each: `v1-png` (multipart PNG upload to `/v1/models/{name}/classify`), `v1-json`
(the same PNG as base64 JSON), `v2-json` (an Open Inference Protocol tensor as JSON numbers), `v2-binary`
(the tensor with the binary tensor data extension) and `grpc` (ModelInfer over gRPC with raw tensor bytes).
Four drivers keep `concurrency` requests in flight: a built-in asyncio client (`python`, every kind), `hey` and
`wrk` (HTTP kinds) and `h2load` (gRPC: `concurrency` streams on one HTTP/2 connection, as a channel multiplexes
calls), run as subprocesses where they are installed. Outside drivers spend far less of the shared CPU per request
than a Python client, so the server is measured rather than the client.
"""

from __future__ import annotations

import asyncio
import base64
import csv
import io
import json
import os
import re
import resource
import shutil
import struct
import subprocess
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
from PIL import Image

from service.contract import ModelCard
from service.grpc.protocol import method_path
from training.benchmarks.grpc_load import check_infer_call, grpc_calls, grpc_window, infer_message

KINDS = ("v1-png", "v1-json", "v2-json", "v2-binary", "grpc")
GRPC_CONTENT_TYPE = "application/grpc"
DRIVERS = ("python", "hey", "wrk", "h2load")
GRPC_DRIVERS = ("python", "h2load")  # the drivers that speak gRPC; h2load speaks nothing else here
APT_PACKAGES = {"hey": "hey", "wrk": "wrk", "h2load": "nghttp2-client"}  # the Debian package of each outside driver
H2LOAD_SUMMARY = re.compile(r"requests: (\d+) total, \d+ started, (\d+) done, \d+ succeeded, (\d+) failed, "
                            r"(\d+) errored, (\d+) timeout")  # fmt: skip
H2LOAD_FINISHED = re.compile(r"finished in ([0-9.]+)(ms|s),")
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
    driver_cpu_s: float | None = None  # CPU time the load generator itself used (it shares the machine)


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
            notes[driver] = f"not installed, skipped (apt-get install {APT_PACKAGES[driver]})"
    return usable, notes


def drives(driver: str, kind: str) -> bool:
    """Whether `driver` can send requests of `kind` (gRPC: python and h2load; HTTP: all but h2load)."""
    return (driver in GRPC_DRIVERS) if kind == "grpc" else driver != "h2load"


def run_load(driver: str, host: str, port: int, request: Payload, concurrency: int, seconds: float) -> LoadResult:
    """Keep `concurrency` connections busy with `request` for about `seconds` (`port`: gRPC's for a gRPC request),
    with the CPU time the driver used: its subprocess's, or this process's for the built-in clients."""
    before = driver_cpu_seconds(driver)
    result = _run_load(driver, host, port, request, concurrency, seconds)
    after = driver_cpu_seconds(driver)
    result.driver_cpu_s = after - before
    return result


def driver_cpu_seconds(driver: str) -> float:
    """CPU seconds so far of `driver`: this process for the built-in clients; the finished subprocesses for the
    outside tools (each is waited for, so its time is then counted; the server, still running, is not)."""
    if driver == "python":
        return time.process_time()
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def _run_load(driver: str, host: str, port: int, request: Payload, concurrency: int, seconds: float) -> LoadResult:
    if request.content_type == GRPC_CONTENT_TYPE:
        if driver == "h2load":
            return h2load_load(host, port, request, concurrency, seconds)
        if driver != "python":
            raise ValueError(f"gRPC requests need the python or h2load driver, not {driver!r}")
        return grpc_load(f"{host}:{port}", request.body, concurrency, seconds)
    if driver == "h2load":
        raise ValueError("h2load drives gRPC requests only here; use hey or wrk for HTTP")
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
    """Calls with the blocking client at concurrency 1, else with the asyncio client (training.benchmarks.grpc_load)."""
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
    return hey_result(out, time.perf_counter() - start)


def hey_result(csv_text: str, elapsed: float) -> LoadResult:
    """hey's CSV (a row per request) as a LoadResult, timed by hey's own clock: from its start to the last response
    (each row's `offset` from the start plus its `response-time`), as hey's summary would. `elapsed`, the wall time
    of the whole subprocess, counts its start-up and the CSV it writes after the window as well (1-2 % of a 4 s
    window); it is used only when no request finished."""
    rows = list(csv.DictReader(io.StringIO(csv_text)))
    latencies = [float(r["response-time"]) for r in rows]
    errors = sum(r["status-code"] != "200" for r in rows)
    seconds = max((float(r["offset"]) + t for r, t in zip(rows, latencies, strict=True)), default=elapsed)
    return LoadResult(requests=len(rows), errors=errors, seconds=seconds, latencies_s=latencies)


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


def grpc_frame(message: bytes) -> bytes:
    """A gRPC length-prefixed message: uncompressed flag, 4-byte big-endian length, the message."""
    return b"\x00" + struct.pack(">I", len(message)) + message


def h2load_load(host: str, port: int, request: Payload, concurrency: int, seconds: float) -> LoadResult:
    """`h2load` POSTing the ModelInfer message as gRPC over HTTP/2 (h2c): `concurrency` streams on one connection.

    h2load judges a call by its HTTP status only, and a gRPC error comes as HTTP 200 with a non-zero grpc-status
    trailer: one call with the Python client first checks that this very message succeeds (RuntimeError if not);
    the benchmark also counts the server's non-OK gRPC statuses during the window (`grpc_failures`).
    """
    check_infer_call(f"{host}:{port}", request.body)
    with tempfile.TemporaryDirectory(prefix="capsnet-bench-") as scratch:
        body, log = Path(scratch) / "body", Path(scratch) / "requests.log"
        body.write_bytes(grpc_frame(request.body))
        command = ["h2load", "-c1", f"-m{concurrency}", "-t1", "-D", f"{max(1, round(seconds * 1000))}ms"]
        command += [
            "--warm-up-time",
            "0",
            "-d",
            str(body),
            "-H",
            f"content-type: {GRPC_CONTENT_TYPE}",
            "-H",
            "te: trailers",
        ]
        command += [f"--log-file={log}", f"http://{host}:{port}{request.path}"]
        out = subprocess.run(command, capture_output=True, text=True, check=True, timeout=seconds + 60).stdout
        rows = [line.split("\t") for line in log.read_text().splitlines() if line]
    summary, finished = H2LOAD_SUMMARY.search(out), H2LOAD_FINISHED.search(out)
    if summary is None or finished is None:
        raise RuntimeError(f"unexpected h2load output: {out[-500:]}")
    _, done, failed, errored, timeouts = (int(x) for x in summary.groups())
    elapsed = float(finished.group(1)) / (1000.0 if finished.group(2) == "ms" else 1.0)
    not_ok = sum(status != "200" for _, status, _ in rows)
    return LoadResult(
        requests=done,
        errors=max(failed + errored + timeouts, not_ok),
        seconds=elapsed,
        latencies_s=[int(duration_us) / 1e6 for _, _, duration_us in rows],
    )


def grpc_failures(metrics: str) -> int:
    """ModelInfer calls the server answered with a status other than OK (CANCELLED aside: the calls a driver leaves in
    flight when its window ends), from the text of its /metrics."""
    return sum(
        int(float(line.rsplit(" ", 1)[1]))
        for line in metrics.splitlines()
        if line.startswith("capsnet_http_requests_total{")
        and 'protocol="grpc"' in line
        and "/ModelInfer" in line
        and not any(f'status="{ok}"' in line for ok in ("OK", "CANCELLED"))
    )

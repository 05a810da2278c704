"""Load benchmark: raw ONNX Runtime throughput by batch size against the HTTP service by concurrency.

Runs, in one go and on one model: `capsnet.onnx` in ONNX Runtime directly (batch 1 … 128, with the
service's own session options), then a real `capsnet-serve` process driven through
`POST /v2/models/{name}/infer` with one image per request at each concurrency (like perf_analyzer),
then the same over gRPC (`ModelInfer` with raw tensor bytes), and prints throughput, latency
percentiles and the service ÷ raw ratios, with the machine it ran on.

    python -m service.benchmark [--model-repository DIR] [--model NAME] [--duration S]
"""

from __future__ import annotations

import argparse
import asyncio
import functools
import json
import os
import platform
import shlex
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Callable, Coroutine
from dataclasses import asdict, dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import numpy as np
import onnxruntime as ort

from service.core.config import Settings, cgroup_cpu_limit
from service.grpc.load import grpc_window, infer_message
from service.runtime.card import GRAPH_FILE, ModelCard
from service.runtime.repository import scan_repository
from service.runtime.sessions import active_provider, create_session

REPO_ROOT = Path(__file__).resolve().parents[1]
DEFAULT_BATCHES = (1, 2, 4, 8, 16, 32, 64, 128)
DEFAULT_CONCURRENCY = (1, 8, 32, 64)
Load = Callable[[int, float, float], Coroutine[Any, Any, list[tuple[float, float, int]]]]  # (concurrency, ramp, window)


@dataclass
class RawRow:
    batch: int
    runs: int
    throughput: float  # images/s
    p50_ms: float


@dataclass
class HttpRow:
    concurrency: int
    requests: int
    errors: int
    throughput: float  # requests/s (= images/s: one image per request)
    p50_ms: float
    p90_ms: float
    p99_ms: float
    raw_throughput: float  # raw ONNX Runtime at the best batch, measured in the same rounds
    raw_batch1_p50_ms: float | None  # raw batch 1, measured in the same rounds (concurrency 1 only)


def percentile_ms(latencies: list[float], q: float) -> float:
    return float(np.percentile(np.array(latencies) * 1000.0, q)) if latencies else float("nan")


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


def machine() -> dict[str, Any]:
    cpu = "unknown"
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    affinity = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    return {
        "cpu": cpu,
        "cpus_usable": affinity,
        "cgroup_cpu_quota": cgroup_cpu_limit(),
        "load_average_1m": os.getloadavg()[0] if hasattr(os, "getloadavg") else None,
        "cpu_busy_percent_before": cpu_busy_percent(),
        "platform": platform.platform(),
        "python": platform.python_version(),
        "onnxruntime": ort.__version__,
    }


def raw_slice(session: ort.InferenceSession, feed: dict[str, np.ndarray], seconds: float) -> list[float]:
    """Run the batch in `feed` for `seconds` (at least 3 runs); the latency of each run."""
    latencies: list[float] = []
    start = time.perf_counter()
    while time.perf_counter() - start < seconds or len(latencies) < 3:
        t0 = time.perf_counter()
        session.run(None, feed)
        latencies.append(time.perf_counter() - t0)
    return latencies


def random_feed(card: ModelCard, batch: int) -> dict[str, np.ndarray]:
    return {card.input.name: np.random.default_rng(batch).random((batch, *card.image_shape), dtype=np.float32)}


def raw_sweep(session: ort.InferenceSession, card: ModelCard, batches: list[int], seconds: float) -> list[RawRow]:
    rows = []
    for batch in batches:
        feed = random_feed(card, batch)
        raw_slice(session, feed, 0.0)  # warm-up
        latencies = raw_slice(session, feed, seconds)
        rows.append(
            RawRow(batch, len(latencies), batch * len(latencies) / sum(latencies), percentile_ms(latencies, 50))
        )
        print(f"  raw batch {batch:4d}: {rows[-1].throughput:9.1f} img/s  p50 {rows[-1].p50_ms:8.2f} ms", flush=True)
    return rows


def infer_request(card: ModelCard, host: str, port: int, binary: bool) -> bytes:
    """One pre-encoded HTTP/1.1 request for one random image (all outputs)."""
    image = np.random.default_rng(1).random((1, *card.image_shape), dtype=np.float32)
    tensor: dict[str, Any] = {"name": card.input.name, "shape": list(image.shape), "datatype": "FP32"}
    headers = {"Host": f"{host}:{port}"}
    if binary:
        raw = image.astype("<f4").tobytes()
        tensor["parameters"] = {"binary_data_size": len(raw)}
        head = json.dumps({"inputs": [tensor], "parameters": {"binary_data_output": True}}).encode()
        body = head + raw
        headers["Content-Type"] = "application/octet-stream"
        headers["Inference-Header-Content-Length"] = str(len(head))
    else:
        tensor["data"] = image.ravel().tolist()
        body = json.dumps({"inputs": [tensor]}).encode()
        headers["Content-Type"] = "application/json"
    headers["Content-Length"] = str(len(body))
    lines = [f"POST /v2/models/{card.name}/infer HTTP/1.1", *(f"{k}: {v}" for k, v in headers.items())]
    return ("\r\n".join(lines) + "\r\n\r\n").encode() + body


async def client(host: str, port: int, request: bytes, until: float, done: list[tuple[float, float, int]]) -> None:
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


async def http_window(
    host: str, port: int, request: bytes, concurrency: int, ramp: float, window: float
) -> list[tuple[float, float, int]]:
    """Steady load from `concurrency` connections; the requests that ended inside the window (after `ramp`
    seconds), so neither the ramp-up nor the drain at the end counts."""
    done: list[tuple[float, float, int]] = []
    start = time.perf_counter()
    first, last = start + ramp, start + ramp + window
    await asyncio.gather(*(client(host, port, request, last, done) for _ in range(concurrency)))
    return [d for d in done if first <= d[1] <= last]


def paired_level(
    session: ort.InferenceSession,
    card: ModelCard,
    best_batch: int,
    load: Load,
    concurrency: int,
    rounds: int,
    window: float,
) -> HttpRow:
    """Alternate raw ONNX Runtime (best batch; batch 1 too at concurrency 1) and the service, `rounds` times,
    so that both see the same machine: on a shared machine the load drifts within seconds."""
    best_feed, one_feed = random_feed(card, best_batch), random_feed(card, 1)
    raw: list[float] = []
    raw_one: list[float] = []
    done: list[tuple[float, float, int]] = []
    ramp = 1.0 + 0.02 * concurrency
    for i in range(rounds):
        if i % 2:  # every other round the service goes first, so that neither side always follows the other
            done += asyncio.run(load(concurrency, ramp, window))
        raw += raw_slice(session, best_feed, window)
        if concurrency == 1:
            raw_one += raw_slice(session, one_feed, window)
        if not i % 2:
            done += asyncio.run(load(concurrency, ramp, window))
    latencies = [end - start for start, end, _ in done]
    return HttpRow(
        concurrency,
        len(done),
        sum(status != 200 for _, _, status in done),
        len(done) / (rounds * window),
        percentile_ms(latencies, 50),
        percentile_ms(latencies, 90),
        percentile_ms(latencies, 99),
        best_batch * len(raw) / sum(raw),
        percentile_ms(raw_one, 50) if raw_one else None,
    )


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


def service_table(rows: list[HttpRow], protocol: str, best_batch: int) -> list[str]:
    if not rows:
        return []
    return [
        f"| {protocol} concurrency | throughput (img/s) | p50 (ms) | p90 (ms) | p99 (ms) | errors "
        f"| raw batch {best_batch} alongside (img/s) | service ÷ raw |",
        "|---:|---:|---:|---:|---:|---:|---:|---:|",
        *(
            f"| {h.concurrency} | {h.throughput:.1f} | {h.p50_ms:.2f} | {h.p90_ms:.2f} | {h.p99_ms:.2f} | "
            f"{h.errors} | {h.raw_throughput:.1f} | {h.throughput / h.raw_throughput:.0%} |"
            for h in rows
        ),
        "",
    ]


def targets(rows: list[HttpRow], protocol: str, ratio: float, p50_slack_ms: float) -> list[str]:
    """How the service did against the targets: at concurrency >= 32, `ratio` of raw ONNX Runtime's best
    batched throughput; at concurrency 1, a p50 within `p50_slack_ms` of raw batch 1's."""
    lines = []
    high = [h for h in rows if h.concurrency >= 32]
    if high:
        worst = min(high, key=lambda h: h.throughput / h.raw_throughput)
        share = worst.throughput / worst.raw_throughput
        lines.append(
            f"{protocol}, concurrency >= 32: the service delivers at least {share:.0%} "
            f"of raw ONNX Runtime's best batched throughput (target >= {ratio:.0%})"
        )
    one = next((h for h in rows if h.concurrency == 1), None)
    if one and one.raw_batch1_p50_ms is not None:
        extra = one.p50_ms - one.raw_batch1_p50_ms
        lines.append(
            f"{protocol}, concurrency 1: service p50 {one.p50_ms:.2f} ms vs raw batch-1 p50 "
            f"{one.raw_batch1_p50_ms:.2f} ms: {extra:+.2f} ms (target <= +{p50_slack_ms} ms)"
        )
    return lines


def report(result: dict[str, Any]) -> str:
    raw: list[RawRow] = result["raw"]
    http: list[HttpRow] = result["http"]
    m = result["machine"]
    lines = [
        f"machine: {m['cpu']}; {m['cpus_usable']} usable CPUs, cgroup quota {m['cgroup_cpu_quota']}; "
        f"load average {m['load_average_1m']:.1f} at start, {m['load_average_1m_end']:.1f} at end; "
        f"{m['platform']}; Python {m['python']}; onnxruntime {m['onnxruntime']}",
        f"model: {result['model']} ({result['provider']}, {result['threads']} intra-op threads); "
        f"service: max_batch_size {result['settings']['max_batch_size']}, "
        f"max_queue_delay_ms {result['settings']['max_queue_delay_ms']}; {result['encoding']} tensors, "
        "one image per request",
        "",
        "| raw ONNX Runtime batch | throughput (img/s) | p50 latency (ms) |",
        "|---:|---:|---:|",
        *(f"| {r.batch} | {r.throughput:.1f} | {r.p50_ms:.2f} |" for r in raw),
        "",
        *service_table(http, "HTTP", result["best_batch"]),
        *service_table(result.get("grpc", []), "gRPC", result["best_batch"]),
    ]
    lines += targets(http, "HTTP", 0.80, 1.5)
    lines += targets(result.get("grpc", []), "gRPC", 0.85, 0.5)
    if result.get("server_peak_rss_mib") is not None:
        lines.append(f"service peak resident memory under this load: {result['server_peak_rss_mib']:.0f} MiB (VmHWM)")
    return "\n".join(lines)


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    defaults = Settings()
    parser = argparse.ArgumentParser(prog="python -m service.benchmark", description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--model-repository",
        type=Path,
        default=defaults.model_repository,
        help=f"model repository (default: {defaults.model_repository})",
    )
    parser.add_argument("--model", help="model to measure (default: the first ready model of the repository)")
    parser.add_argument(
        "--threads",
        type=int,
        default=defaults.intra_op_threads,
        help=f"intra-op threads, raw and service (default: the CPU quota, here {defaults.intra_op_threads})",
    )
    parser.add_argument(
        "--provider", default=defaults.provider, help=f"auto, cuda or cpu (default: {defaults.provider})"
    )
    parser.add_argument(
        "--batches", default=",".join(map(str, DEFAULT_BATCHES)), help="raw batch sizes (default: 1,2,…,128)"
    )
    parser.add_argument(
        "--concurrency", default=",".join(map(str, DEFAULT_CONCURRENCY)), help="HTTP concurrencies (default: 1,8,32,64)"
    )
    parser.add_argument(
        "--duration", type=float, default=8.0, help="seconds measured per raw batch and per concurrency (default: 8)"
    )
    parser.add_argument("--rounds", type=int, default=4, help="raw/service alternations per concurrency (default: 4)")
    parser.add_argument(
        "--max-batch-size",
        type=int,
        default=defaults.max_batch_size,
        help=f"service max batch size (default: the service's, {defaults.max_batch_size})",
    )
    parser.add_argument(
        "--max-queue-delay-ms",
        type=float,
        default=defaults.max_queue_delay_ms,
        help=f"service max queue delay (default: the service's, {defaults.max_queue_delay_ms})",
    )
    parser.add_argument(
        "--encoding",
        choices=["binary", "json"],
        default="binary",
        help="tensor encoding of the requests: binary (perf_analyzer's default) or json (default: binary)",
    )
    parser.add_argument(
        "--grpc",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="also measure gRPC (ModelInfer, raw tensor bytes) at the same concurrencies (default: on)",
    )
    parser.add_argument("--json", type=Path, help="also write the results as JSON here (default: none)")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    models = [m for m in scan_repository(args.model_repository) if m.card is not None]
    if args.model:
        models = [m for m in models if m.name == args.model]
    if not models:
        sys.exit(f"no usable model {args.model or ''} in {args.model_repository}")
    entry = models[0]
    assert entry.card is not None
    card = entry.card
    batches = [int(b) for b in args.batches.split(",")]
    concurrency = [int(c) for c in args.concurrency.split(",")]
    result: dict[str, Any] = {
        "command": shlex.join(["python", "-m", "service.benchmark", *(sys.argv[1:] if argv is None else argv)]),
        "produced_at": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "machine": machine(),
        "model": card.name,
        "threads": args.threads,
        "encoding": args.encoding,
        "settings": {"max_batch_size": args.max_batch_size, "max_queue_delay_ms": args.max_queue_delay_ms},
    }
    print(f"benchmarking {card.name} from {entry.path}", flush=True)
    session = create_session(entry.path / GRAPH_FILE, args.provider, args.threads)
    result["provider"] = active_provider(session)
    result["raw"] = raw_sweep(session, card, batches, args.duration / args.rounds)
    best = max(result["raw"], key=lambda r: r.throughput)
    result["best_batch"] = best.batch
    port = free_port()
    env = {
        "CAPSNET_INTRA_OP_THREADS": str(args.threads),
        "CAPSNET_PROVIDER": args.provider,
        "CAPSNET_MAX_BATCH_SIZE": str(args.max_batch_size),
        "CAPSNET_MAX_QUEUE_DELAY_MS": str(args.max_queue_delay_ms),
        "CAPSNET_MAX_QUEUE_SIZE": str(max(256, 4 * max(concurrency))),
    }
    grpc_port = free_port() if args.grpc else 0
    server = start_server(args.model_repository, port, env, grpc_port)
    try:
        request = infer_request(card, "127.0.0.1", port, args.encoding == "binary")
        loads: dict[str, Load] = {"http": functools.partial(http_window, "127.0.0.1", port, request)}
        if args.grpc:
            loads["grpc"] = functools.partial(grpc_window, f"127.0.0.1:{grpc_port}", infer_message(card))
        for protocol, load in loads.items():
            result[protocol] = []
            for c in concurrency:
                row = paired_level(session, card, best.batch, load, c, args.rounds, args.duration / args.rounds)
                result[protocol].append(row)
                print(
                    f"  {protocol} concurrency {c:3d}: {row.throughput:9.1f} img/s  p50 {row.p50_ms:8.2f} ms  "
                    f"(raw alongside {row.raw_throughput:.1f} img/s)",
                    flush=True,
                )
        result["server_peak_rss_mib"] = peak_rss_mib(server.pid)
    finally:
        server.terminate()
        server.wait(60)
    result["machine"]["load_average_1m_end"] = os.getloadavg()[0] if hasattr(os, "getloadavg") else None
    print()
    print(report(result))
    if args.json:
        rows = {key: [asdict(r) for r in result[key]] for key in ("raw", "http", "grpc") if key in result}
        args.json.write_text(json.dumps({**result, **rows}, indent=2))


if __name__ == "__main__":
    main()

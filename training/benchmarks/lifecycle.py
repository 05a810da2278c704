"""Model lifecycle under load: failed requests through a swap, an unload and a failed load; RSS over load cycles.

`swap` starts `capsnet-serve --model-control explicit` on a repository it builds from model/zoo (the model as
version folder 1 and another model beside it), sends v1 PNG uploads and v2 tensors at the given concurrency each,
and meanwhile: adds version 2 and loads it (a swap), unloads the other model, adds a broken version 3 and loads
it (refused; version 2 keeps serving). It prints every request's outcome by kind and phase.
`memory` loads and unloads a model `--cycles` times and prints the server's RSS after each unload.
Both print the machine; figures in docs/model-management.md. No torch.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import numpy as np

from service.imaging import array_to_png
from service.machine import cpu_model, load_average, usable_cpus

REPO_ROOT = Path(__file__).resolve().parents[2]
ZOO = REPO_ROOT / "model" / "zoo"


def machine() -> str:
    return (
        f"{cpu_model()}, {usable_cpus()} usable CPUs, load average {load_average()}, "
        f"Python {platform.python_version()}, {platform.system()} {platform.release()}"
    )


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@contextmanager
def server(repository: Path, port: int, env: dict[str, str]) -> Iterator[subprocess.Popen[bytes]]:
    """capsnet-serve on 127.0.0.1:`port` (no gRPC), stopped on exit; yields once it answers /health/live."""
    command = [sys.executable, "-m", "service.main", "--port", str(port), "--model-repository", str(repository)]
    settings = {"CAPSNET_GRPC_PORT": "0", "CAPSNET_LOG_LEVEL": "warning", **env}
    process = subprocess.Popen(command, cwd=REPO_ROOT, env={**os.environ, **settings})
    try:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            if process.poll() is not None:
                raise SystemExit(f"capsnet-serve exited with {process.returncode}")
            try:
                if httpx.get(f"http://127.0.0.1:{port}/health/live", timeout=1).status_code == 200:
                    break
            except httpx.TransportError:
                time.sleep(0.2)
        yield process
    finally:
        process.terminate()
        process.wait(60)


def wait_ready(base: str) -> None:
    deadline = time.monotonic() + 300
    while httpx.get(f"{base}/health/ready", timeout=5).status_code != 200:
        if time.monotonic() > deadline:
            raise SystemExit("the server did not become ready")
        time.sleep(0.2)


def rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise SystemExit("no VmRSS in /proc (Linux only)")


# --- swap ---------------------------------------------------------------------------------------------------


@dataclass
class Tally:
    """Outcomes by (kind, phase): HTTP status or exception name, and the versions that answered."""

    outcomes: Counter[tuple[str, str, str]] = field(default_factory=Counter)
    versions: Counter[tuple[str, str]] = field(default_factory=Counter)
    latencies: dict[str, list[float]] = field(default_factory=dict)
    phase: str = "before"


def build_repository(root: Path, model: str, other: str) -> None:
    shutil.copytree(ZOO / model, root / model / "1")
    shutil.copytree(ZOO / other, root / other)


def add_version(root: Path, model: str, version: str, broken: bool = False) -> None:
    target = root / model / version
    shutil.copytree(root / model / "1", target)
    if broken:  # the graph altered after export: the card's sha256 no longer matches
        graph = target / "capsnet.onnx"
        with graph.open("r+b") as f:
            f.seek(-1, os.SEEK_END)
            last = f.read(1)
            f.seek(-1, os.SEEK_END)
            f.write(bytes([last[0] ^ 0xFF]))


async def client(http: httpx.AsyncClient, kind: str, model: str, body: Any, tally: Tally, until: list[bool]) -> None:
    while not until[0]:
        start = time.perf_counter()
        try:
            if kind == "v1-png":
                r = await http.post(f"/v1/models/{model}/classify", files=[("files", ("7.png", body, "image/png"))])
            else:
                r = await http.post(f"/v2/models/{model}/infer", json=body)
            outcome = str(r.status_code)
            if r.status_code == 200:
                tally.versions[kind, r.json()["model_version"]] += 1
        except httpx.HTTPError as e:
            outcome = type(e).__name__
        tally.outcomes[kind, tally.phase, outcome] += 1
        tally.latencies.setdefault(kind, []).append(time.perf_counter() - start)


async def drive(base: str, root: Path, args: argparse.Namespace) -> tuple[Tally, list[tuple[float, str, int, float]]]:
    image = np.zeros((28, 28), np.float32)
    image[6:8, 8:20], image[8:22, 14:16] = 1.0, 1.0  # a "7"-ish stroke
    png = array_to_png(image)
    tensor = {
        "inputs": [{"name": "image", "shape": [1, 1, 28, 28], "datatype": "FP32", "data": image.ravel().tolist()}]
    }
    tally, stop = Tally(), [False]
    # Idle connections are closed by the client well before uvicorn's 5 s keep-alive timeout closes them: a request
    # sent on a connection the server is closing at that moment fails with a ReadError that says nothing about
    # the swap (two runs with httpx's default 5 s expiry lost 0 and 3 requests that way).
    limits = httpx.Limits(max_connections=2 * args.concurrency + 4, keepalive_expiry=1.0)
    events: list[tuple[float, str, int, float]] = []
    async with httpx.AsyncClient(base_url=base, timeout=60, limits=limits) as http:
        workers = [
            asyncio.create_task(client(http, kind, args.model, body, tally, stop))
            for kind, body in (("v1-png", png), ("v2", tensor))
            for _ in range(args.concurrency)
        ]
        t0 = time.perf_counter()

        async def admin(label: str, path: str) -> None:
            start = time.perf_counter()
            tally.phase = label
            r = await http.post(path, timeout=300)
            events.append((start - t0, label, r.status_code, time.perf_counter() - start))

        await asyncio.sleep(args.settle)
        await asyncio.to_thread(add_version, root, args.model, "2")
        await admin("swap to version 2", f"/v2/repository/models/{args.model}/load")
        await asyncio.sleep(args.settle)
        await admin(f"unload {args.other}", f"/v2/repository/models/{args.other}/unload")
        await asyncio.sleep(args.settle)
        await asyncio.to_thread(add_version, root, args.model, "3", True)
        await admin("failed load of version 3", f"/v2/repository/models/{args.model}/load")
        await asyncio.sleep(args.settle)
        tally.phase = "after"
        await asyncio.sleep(args.settle)
        stop[0] = True
        await asyncio.gather(*workers)
        events.append((time.perf_counter() - t0, "end", 0, 0.0))
    return tally, events


def swap(args: argparse.Namespace) -> None:
    print(f"machine: {machine()}")
    with tempfile.TemporaryDirectory(prefix="capsnet-lifecycle-") as tmp:
        root = Path(tmp)
        build_repository(root, args.model, args.other)
        port = args.port or free_port()
        env = {"CAPSNET_MODEL_CONTROL": "explicit", "CAPSNET_LOAD_MODELS": f"{args.model},{args.other}"}
        with server(root, port, env):
            base = f"http://127.0.0.1:{port}"
            wait_ready(base)
            tally, events = asyncio.run(drive(base, root, args))
    print(
        f"model {args.model} (other model {args.other}); concurrency {args.concurrency} v1 PNG + {args.concurrency} v2"
    )
    for at, label, status, seconds in events:
        print(f"  t={at:6.1f} s  {label}: HTTP {status} after {seconds:.1f} s" if status else f"  t={at:6.1f} s  end")
    total = sum(tally.outcomes.values())
    failed = sum(n for (_, _, outcome), n in tally.outcomes.items() if outcome != "200")
    for kind in ("v1-png", "v2"):
        lat = np.array(tally.latencies.get(kind, [0.0])) * 1000
        by = {k[1:]: n for k, n in tally.outcomes.items() if k[0] == kind}
        versions = {v: n for (k, v), n in tally.versions.items() if k == kind}
        print(
            f"  {kind}: {sum(by.values())} requests, p50 {np.percentile(lat, 50):.0f} ms, p99 "
            f"{np.percentile(lat, 99):.0f} ms; answered by version {versions}"
        )
        for (phase, outcome), n in sorted(by.items()):
            print(f"    {phase}: {outcome} x {n}")
    print(f"failed requests: {failed} of {total}")
    if args.json:
        print(json.dumps({"requests": total, "failed": failed, "events": events}))
    sys.exit(1 if failed else 0)


# --- memory -------------------------------------------------------------------------------------------------


def memory(args: argparse.Namespace) -> None:
    print(f"machine: {machine()}")
    port = args.port or free_port()
    env = {"CAPSNET_MODEL_CONTROL": "explicit"}
    with server(args.model_repository, port, env) as process:
        base = f"http://127.0.0.1:{port}"
        with httpx.Client(base_url=base, timeout=300) as http:
            body = {"inputs": [{"name": "image", "shape": [1, 1, 28, 28], "datatype": "FP32", "data": [0.0] * 784}]}
            print(f"RSS before the first load: {rss_mib(process.pid):.1f} MiB")
            after: list[float] = []
            for cycle in range(1, args.cycles + 1):
                for step in ("load", "unload"):
                    r = http.post(f"/v2/repository/models/{args.model}/{step}")
                    if r.status_code != 200:
                        raise SystemExit(f"{step} failed: HTTP {r.status_code} {r.text}")
                    if step == "load":
                        loaded = rss_mib(process.pid)
                        assert http.post(f"/v2/models/{args.model}/infer", json=body).status_code == 200
                after.append(rss_mib(process.pid))
                print(f"cycle {cycle:2d}: RSS loaded {loaded:.1f} MiB, after unload {after[-1]:.1f} MiB")
    growth = after[-1] / after[0] - 1
    print(f"RSS after unload, cycle {args.cycles} vs cycle 1: {after[-1]:.1f} / {after[0]:.1f} MiB ({growth:+.1%})")
    sys.exit(0 if growth <= args.max_growth else 1)


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m training.benchmarks.lifecycle", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    s = sub.add_parser("swap", help="failed requests through a swap, an unload and a failed load (exit 1 if any)")
    s.add_argument("--model", default="capsnet-mnist", help="model served and swapped (default: capsnet-mnist)")
    s.add_argument("--other", default="capsnet-em-mnist", help="model unloaded meanwhile (default: capsnet-em-mnist)")
    s.add_argument("--concurrency", type=int, default=32, help="clients per protocol (default: 32)")
    s.add_argument("--settle", type=float, default=3.0, help="seconds of load between the events (default: 3)")
    s.add_argument("--port", type=int, default=0, help="server port (default: a free one)")
    s.add_argument("--json", action="store_true", help="also print a JSON summary (default: off)")
    m = sub.add_parser("memory", help="RSS after each of --cycles loads and unloads (exit 1 above --max-growth)")
    m.add_argument("--model-repository", type=Path, default=ZOO, help="repository (default: model/zoo)")
    m.add_argument("--model", default="capsnet-mnist", help="model loaded and unloaded (default: capsnet-mnist)")
    m.add_argument("--cycles", type=int, default=20, help="load/unload cycles (default: 20)")
    m.add_argument("--max-growth", type=float, default=0.10, help="allowed RSS growth, cycle N vs 1 (default: 0.10)")
    m.add_argument("--port", type=int, default=0, help="server port (default: a free one)")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    swap(args) if args.command == "swap" else memory(args)


if __name__ == "__main__":
    main()

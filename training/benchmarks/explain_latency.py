"""Explain's cost: /v1/explain at concurrency 1 against raw ONNX Runtime at batch 1, and classify beside it.

    python -m training.benchmarks.explain_latency --data-dir ../shared/data/mnist [--model capsnet-mnist]

Raw ONNX Runtime runs the model's graph on one test digit at a time with the service's thread count, alternating
with a real `capsnet-serve` (the model alone, on --port) answering /v1/explain (the default method, occlusion) for
the same digits one request at a time; then /v1/classify alone and while an explain client keeps the model busy.
Prints the p50s, their ratio and the machine.
"""

from __future__ import annotations

import argparse
import http.client
import json
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import numpy as np

from service.contract import GRAPH_FILE, create_session, load_model_dir, usable_cpus
from service.explanation import occlusion_tiles
from training.benchmarks.raw_ort import percentile_ms
from training.benchmarks.server import start_server
from training.benchmarks.service import machine
from training.data.mnist import load_split, to_float
from training.options import add_data_dir

REPO_ROOT = Path(__file__).resolve().parents[2]
TARGET_RATIO = 30.0  # explain's p50 at most this many raw batch-1 runs
ROUND = 10  # raw runs, then explain requests, alternately


@contextmanager
def running_service(repository: Path, port: int, default_model: str) -> Iterator[None]:
    """`capsnet-serve` over `repository` on 127.0.0.1:`port`, ready, and stopped afterwards."""
    process = start_server(repository, port, {"CAPSNET_DEFAULT_MODEL": default_model})
    try:
        yield
    finally:
        process.terminate()
        process.wait(timeout=30)


def raw_runner(model_dir: Path) -> Callable[[np.ndarray], None]:
    """A batch-1 run of the model's graph on a session with every usable CPU's thread (the service's default)."""
    card = load_model_dir(model_dir).card
    session = create_session(model_dir / GRAPH_FILE, "cpu", usable_cpus())

    def run(image: np.ndarray) -> None:
        session.run(None, {card.input.name: image[None]})

    return run


def timed_raw(run: Callable[[np.ndarray], None], images: np.ndarray, runs: int) -> list[float]:
    latencies = []
    for i in range(runs):
        start = time.perf_counter()
        run(images[i % len(images)])
        latencies.append(time.perf_counter() - start)
    return latencies


def request_bodies(images: np.ndarray) -> list[bytes]:
    """One JSON body per image: the array as the model receives it (no preprocessing)."""
    return [json.dumps({"images": [{"array": np.round(i[0], 4).tolist()}]}).encode() for i in images]


def timed_posts(
    port: int, path: str, bodies: list[bytes], runs: int, stop: threading.Event | None = None
) -> list[float]:
    """POST `bodies` in turn on one kept-alive connection (`runs` times, or until `stop`): the seconds of each."""
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=120)
    latencies: list[float] = []
    i = 0
    while (stop is None and i < runs) or (stop is not None and not stop.is_set()):
        start = time.perf_counter()
        connection.request("POST", path, bodies[i % len(bodies)], {"Content-Type": "application/json"})
        response = connection.getresponse()
        payload = response.read()
        if response.status != 200:
            raise RuntimeError(f"{path} answered {response.status}: {payload[:200]!r}")
        latencies.append(time.perf_counter() - start)
        i += 1
    connection.close()
    return latencies


def classify_beside_explain(port: int, name: str, bodies: list[bytes], runs: int) -> list[float]:
    """Classify latencies at concurrency 1 while a second client sends explain requests back to back."""
    stop = threading.Event()
    background = threading.Thread(target=timed_posts, args=(port, f"/v1/models/{name}/explain", bodies, 0, stop))
    background.start()
    try:
        time.sleep(0.5)
        return timed_posts(port, f"/v1/models/{name}/classify", bodies, runs)
    finally:
        stop.set()
        background.join()


def run(args: argparse.Namespace) -> dict[str, Any]:
    """Raw runs and explain requests alternate in rounds of ROUND, so both see the same machine."""
    model_dir = Path(args.model_repository) / args.model
    images = to_float(load_split(args.data_dir, "test").images[: args.digits])
    bodies = request_bodies(images)
    raw_run = raw_runner(model_dir)
    timed_raw(raw_run, images, 5)  # warm-up
    raw: list[float] = []
    explain: list[float] = []
    with tempfile.TemporaryDirectory() as repository:
        (Path(repository) / args.model).symlink_to(model_dir.resolve(), target_is_directory=True)
        with running_service(Path(repository), args.port, args.model):
            explain_path = f"/v1/models/{args.model}/explain"
            timed_posts(args.port, explain_path, bodies, 5)  # warm-up
            for _ in range(max(1, args.runs // ROUND)):
                raw += timed_raw(raw_run, images, ROUND)
                explain += timed_posts(args.port, explain_path, bodies, ROUND)
            classify = timed_posts(args.port, f"/v1/models/{args.model}/classify", bodies, args.runs)
            beside = classify_beside_explain(args.port, args.model, bodies, args.runs)
    raw_p50 = percentile_ms(raw, 50)
    return {
        "model": args.model,
        "digits": args.digits,
        "runs": args.runs,
        "occluded_copies_mean": round(float(np.mean([len(occlusion_tiles(i[0])) for i in images])), 1),
        "raw_ort_batch1_p50_ms": round(raw_p50, 2),
        "explain_p50_ms": round(percentile_ms(explain, 50), 2),
        "explain_p95_ms": round(percentile_ms(explain, 95), 2),
        "explain_over_raw": round(percentile_ms(explain, 50) / raw_p50, 1),
        "classify_p50_ms": round(percentile_ms(classify, 50), 2),
        "classify_p95_ms": round(percentile_ms(classify, 95), 2),
        "classify_beside_explain_p50_ms": round(percentile_ms(beside, 50), 2),
        "classify_beside_explain_p95_ms": round(percentile_ms(beside, 95), 2),
        "machine": machine(),
    }


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_data_dir(parser)
    parser.add_argument("--model-repository", default=str(REPO_ROOT / "model" / "zoo"), help="(default: model/zoo)")
    parser.add_argument("--model", default="capsnet-mnist", help="(default: capsnet-mnist)")
    parser.add_argument("--digits", type=int, default=50, help="test digits the requests cycle through (default: 50)")
    parser.add_argument("--runs", type=int, default=200, help="timed requests and raw runs of each kind (default: 200)")
    parser.add_argument("--port", type=int, default=18400, help="the service's port (default: 18400)")
    parser.add_argument("--out", help="also write the result as JSON here (default: print only)")
    parser.add_argument("--dry-run", action="store_true", help="5 digits, 10 runs")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.dry_run:
        args.digits, args.runs = 5, 10
    result = run(args)
    print(json.dumps(result["machine"]))
    print(
        f"{result['model']}: raw ONNX Runtime batch 1 p50 {result['raw_ort_batch1_p50_ms']} ms; "
        f"explain (occlusion, {result['occluded_copies_mean']} copies on average) p50 {result['explain_p50_ms']} ms "
        f"= {result['explain_over_raw']}x raw (target <= {TARGET_RATIO:g}x); classify p50 {result['classify_p50_ms']} "
        f"ms alone, {result['classify_beside_explain_p50_ms']} ms beside an explain client "
        f"(p95 {result['classify_p95_ms']} / {result['classify_beside_explain_p95_ms']} ms)"
    )
    if args.out:
        Path(args.out).write_text(json.dumps(result, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

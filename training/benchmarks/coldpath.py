"""What a lone request's own steps cost right after a model run, when ONNX Runtime has just evicted the caches.

    python -m training.benchmarks.coldpath [--model-repository DIR] [--model NAME] [--samples N]

At concurrency 1 every request's Python runs right after the previous request's ONNX Runtime run, which evicts it
from the caches (not by the weights' volume alone: the cost is about the same after the int8 model's run;
docs/serving-performance.md, session 13): each step then runs from memory rather than from the caches it ran from a
moment earlier. This times the service's own steps for the benchmark's request (one PNG in a
multipart body, `training.benchmarks.loadgen`) in process, each right after a batch-1 run ("cold") and again at
once ("warm"):

- read: the multipart body to the model's input (`images_from_body`: parsing, PNG decoding, MNIST normalization);
- respond: the model's outputs to the JSON body (`classify_result`, with the "not a digit" score, and pydantic).

The ratio is the price of the cold caches; docs/serving-performance.md uses it. Medians over `--samples` rounds.
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable, Coroutine
from pathlib import Path
from typing import Any, TypeVar, cast

import numpy as np
import onnxruntime as ort

from service.api.inputs import ImageBatch, images_from_body
from service.api.routes.inference import DEFAULT_OPTIONS, DEFAULT_TOP_K, classify_result
from service.contract import GRAPH_FILE, cpu_model, create_session, load_average, load_model_dir, usable_cpus
from service.core.config import Settings
from service.runtime.batcher import BatchResult, Rows
from training.benchmarks.loadgen import payload

DEFAULT_REPOSITORY = Path(__file__).resolve().parents[2] / "model" / "zoo"
T = TypeVar("T")


def at_once(coroutine: Coroutine[Any, Any, T]) -> T:
    """The value of a coroutine that never suspends (`images_from_body` for a small image does not)."""
    try:
        coroutine.send(None)
    except StopIteration as done:
        return cast(T, done.value)
    coroutine.close()
    raise RuntimeError("the step awaited something")


def step_costs(directory: Path, samples: int) -> dict[str, tuple[float, float]]:
    """{step: (cold median, warm median)} in seconds."""
    card = load_model_dir(directory).card
    session = create_session(directory / GRAPH_FILE)
    names = [o.name for o in session.get_outputs()]
    request, settings = payload(card, "v1-png"), Settings()

    def read() -> ImageBatch:
        return at_once(images_from_body(request.content_type, request.body, card, settings, DEFAULT_OPTIONS))

    batch = read()
    images, info = batch.array, batch.info
    feed = {card.input.name: images}
    computed = dict(zip(names, session.run(None, feed), strict=True))

    def respond() -> object:
        outputs = Rows(BatchResult(feed, computed), slice(0, 1))  # a new batch: nothing derived from it yet
        return classify_result(card, info, images, outputs, DEFAULT_TOP_K, False, False).model_dump_json(by_alias=True)

    steps: dict[str, Callable[[], object]] = {"read": read, "respond": respond}
    times: dict[str, tuple[list[float], list[float]]] = {name: ([], []) for name in steps}
    noise = np.random.default_rng(0).random(images.shape, dtype=np.float32)
    for _ in range(samples):
        for name, step in steps.items():
            cold, warm = times[name]
            session.run(None, {card.input.name: noise})  # evicts, as the previous request's run does
            for into in (cold, warm):
                start = time.perf_counter()
                step()
                into.append(time.perf_counter() - start)
    return {name: (statistics.median(cold), statistics.median(warm)) for name, (cold, warm) in times.items()}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        prog="python -m training.benchmarks.coldpath", description=__doc__.split("\n\n")[0]
    )
    parser.add_argument("--model-repository", type=Path, default=DEFAULT_REPOSITORY)
    parser.add_argument("--model", default="capsnet-mnist")
    parser.add_argument("--samples", type=int, default=300, help="rounds per step (default 300)")
    args = parser.parse_args(argv)
    if args.samples < 1:
        parser.error("--samples must be at least 1")
    directory = args.model_repository / args.model
    if not directory.is_dir():
        parser.error(f"no model directory {directory}")
    machine = f"{cpu_model()}; {usable_cpus()} usable CPUs; load average {load_average()}"
    print(f"machine: {machine}; onnxruntime {ort.__version__}")
    print(f"{args.model}: the service's steps for one PNG, right after a batch-1 run (cold) and repeated (warm)")
    print("| step | cold (µs) | warm (µs) | cold ÷ warm |\n|---|---:|---:|---:|")
    for name, (cold, warm) in step_costs(directory, args.samples).items():
        print(f"| {name} | {cold * 1e6:.0f} | {warm * 1e6:.0f} | {cold / warm:.1f} |")


if __name__ == "__main__":
    main()

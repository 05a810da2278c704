"""Section 6: inference speed of PyTorch and ONNX Runtime by batch size, against a matmul's GFLOP/s."""

from __future__ import annotations

import copy
import logging
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from service.contract import GRAPH_FILE, ProviderUnavailable, create_session, read_card
from training.benchmarks.flops import matmul_graph
from training.benchmarks.timing import timed_runs
from training.fitting.architectures import get_architecture
from training.fitting.device import synchronize
from training.report.common import (
    Context,
    Saved,
    Section,
    busy_note,
    figure,
    md_table,
    not_measured,
    provenance,
    rel,
    shown,
)
from training.report.compute import count_flops
from training.report.models import (
    fresh_model_dir,
    zoo_models,
)

log = logging.getLogger(__name__)


@dataclass
class Timing:
    images_per_s: float
    p50_ms: float
    p99_ms: float
    reps: int


def time_calls(call: Callable[[], Any], batch: int, seconds: float, min_reps: int, warmup: int = 2) -> Timing:
    """Latency of each call (which must block until its result is ready), repeated for `seconds` or min_reps."""
    for _ in range(warmup):
        call()
    lat = np.asarray(timed_runs(call, seconds, min_reps))
    return Timing(
        images_per_s=batch * len(lat) / float(lat.sum()),
        p50_ms=float(np.percentile(lat, 50) * 1e3),
        p99_ms=float(np.percentile(lat, 99) * 1e3),
        reps=len(lat),
    )


def model_flops(forward: Callable[[torch.Tensor], Any], shape: tuple[int, ...]) -> int:
    """Floating-point operations of one image's forward pass (convolutions and matrix products), by torch."""

    def one_image() -> None:
        with torch.no_grad():
            forward(torch.rand(1, *shape))

    return count_flops(one_image)


def runtimes() -> list[str]:
    import onnxruntime as ort

    names = ["pytorch-eager-cpu", "onnxruntime-cpu"]
    if torch.cuda.is_available():
        names.append("pytorch-eager-cuda")
        if "CUDAExecutionProvider" in ort.get_available_providers():
            names.append("onnxruntime-cuda")
    return names


def runtime_calls(
    runtime: str, model_dir: Path, card: dict[str, Any], model: torch.nn.Module
) -> tuple[Callable[[np.ndarray], Callable[[], Any]], Callable[[int], Callable[[], Any]]] | None:
    """(images -> model call, n -> n x n matmul call) for one runtime; None where it does not run here."""
    arch = get_architecture(card["architecture"])
    if runtime.startswith("pytorch"):
        device = torch.device("cuda" if runtime.endswith("cuda") else "cpu")
        net = copy.deepcopy(model).to(device).eval()

        def model_call(images: np.ndarray) -> Callable[[], Any]:
            x = torch.from_numpy(images).to(device)

            def call() -> Any:
                with torch.inference_mode():
                    out = arch.forward(net, x, None)
                synchronize(device)
                return out

            return call

        def matmul_call(n: int) -> Callable[[], Any]:
            a, b = torch.rand(n, n, device=device), torch.rand(n, n, device=device)

            def call() -> Any:
                c = a @ b
                synchronize(device)
                return c

            return call

        return model_call, matmul_call
    provider = "cuda" if runtime.endswith("cuda") else "cpu"
    try:
        session = create_session(model_dir / GRAPH_FILE, provider, torch.get_num_threads())
    except ProviderUnavailable:
        return None

    def ort_model_call(images: np.ndarray) -> Callable[[], Any]:
        feed = {card["input"]["name"]: images}
        return lambda: session.run(None, feed)

    def ort_matmul_call(n: int) -> Callable[[], Any]:
        s = create_session(matmul_graph(n), provider, torch.get_num_threads())
        feed = {"a": np.random.rand(n, n).astype(np.float32), "b": np.random.rand(n, n).astype(np.float32)}
        return lambda: s.run(None, feed)

    return ort_model_call, ort_matmul_call


def run_speed(ctx: Context) -> tuple[dict[str, Any], dict[str, np.ndarray]]:
    s = ctx.sizes
    if ctx.model is not None and ctx.model.is_dir():
        model_dir = ctx.model
    else:
        bundled = [d for d in zoo_models(ctx) if read_card(d).get("architecture") == "dynamic"]
        model_dir = bundled[0] if bundled else fresh_model_dir(ctx)
    card = read_card(model_dir)
    arch = get_architecture(card["architecture"])
    torch.manual_seed(ctx.seed)
    net = arch.build(card["model_config"]).eval()  # random weights: the speed does not depend on them
    shape = tuple(card["input"]["shape"][1:])
    flops = model_flops(lambda x: arch.forward(net, x, None), shape)
    rng = np.random.default_rng(ctx.seed)
    rows, matmul, skipped = [], {}, {}
    for runtime in runtimes():
        calls = runtime_calls(runtime, model_dir, card, net)
        if calls is None:
            skipped[runtime] = "the provider did not load"
            continue
        model_call, matmul_call = calls
        mm = time_calls(matmul_call(s.matmul_size), 1, s.speed_seconds, s.speed_min_reps)
        matmul[runtime] = 2 * s.matmul_size**3 * mm.images_per_s / 1e9  # GFLOP/s of one n x n product
        for batch in s.batches:
            images = rng.random((batch, *shape), dtype=np.float32)
            t = time_calls(model_call(images), batch, s.speed_seconds, s.speed_min_reps)
            achieved = flops * t.images_per_s / 1e9
            rows.append({
                "runtime": runtime, "batch": batch, **asdict(t),
                "gflops": achieved, "fraction_of_matmul": achieved / matmul[runtime],
            })  # fmt: skip
            log.info("speed %s batch %d: %.1f images/s", runtime, batch, t.images_per_s)
    result = {
        "model": shown(model_dir),
        "model_name": card.get("name"),
        "input_shape": list(shape),
        "flops_per_image": flops,
        "matmul_size": s.matmul_size,
        "matmul_gflops": matmul,
        "threads": torch.get_num_threads(),
        "rows": rows,
        "skipped": skipped,
    }
    return result, {}


def render_speed(ctx: Context, saved: Saved | None, reason: str | None) -> str:
    out = [
        "## 6. Speed",
        "",
        "One process measures every runtime: PyTorch eager and ONNX Runtime on the CPU, and on CUDA where a GPU "
        "is present, at batch 1, 8, 32, 128 and 256 (images/s over all calls; p50 and p99 latency of one call). "
        "Achieved GFLOP/s is the model's floating-point work per image (convolutions and matrix products, "
        "counted by `torch.utils.flop_counter`) times images/s; it is divided by the GFLOP/s of a large square "
        "float32 matrix product measured in the same process and runtime, the machine's practical limit. ONNX "
        "Runtime is fed numpy arrays, so its CUDA figures include the host-device copies; PyTorch and ONNX Runtime "
        "use the same number of CPU threads.",
        "",
    ]
    if saved is None:
        return not_measured(out, reason)
    r = saved.result
    m = saved.machine
    gpu = f"; GPU: {m['gpu']}" if m.get("gpu") else "; no GPU"
    cpu = m.get("cpu_model") or m.get("processor")
    out += [
        f"Model: `{r['model_name']}` ({r['model']}), input {r['input_shape']}, "
        f"{r['flops_per_image'] / 1e6:,.1f} MFLOP per image. Machine: {cpu}, {m.get('cpu_count')} CPUs, "
        f"{r['threads']} threads{gpu}; {busy_note(m)}.",
        "",
    ]
    headers = ["runtime", "batch", "images/s", "p50 (ms)", "p99 (ms)", "calls", "GFLOP/s", "of matmul GFLOP/s"]
    rows = [
        [x["runtime"], x["batch"], f"{x['images_per_s']:,.1f}", f"{x['p50_ms']:.2f}", f"{x['p99_ms']:.2f}",
         x["reps"], f"{x['gflops']:.2f}", f"{100 * x['fraction_of_matmul']:.1f}%"]
        for x in r["rows"]
    ]  # fmt: skip
    out += [md_table(headers, rows), ""]
    mm = [[k, f"{v:,.1f}"] for k, v in r["matmul_gflops"].items()]
    out += [md_table([f"runtime ({r['matmul_size']}×{r['matmul_size']} matmul)", "GFLOP/s"], mm), ""]
    for runtime, why in r.get("skipped", {}).items():
        out.append(f"- {runtime}: not measured ({why}).")
    if not any(k.endswith("cuda") for k in r["matmul_gflops"]):
        out.append("- CUDA: not measured (no GPU on the machine that produced this section).")
    path = ctx.figures / "speed.png"
    with figure(path, figsize=(5.5, 4)) as fig:
        ax = fig.subplots()
        for runtime in dict.fromkeys(x["runtime"] for x in r["rows"]):
            pts = [x for x in r["rows"] if x["runtime"] == runtime]
            ax.plot([x["batch"] for x in pts], [x["images_per_s"] for x in pts], "o-", label=runtime)
        ax.set(xscale="log", yscale="log", xlabel="batch size", ylabel="images/s", title="inference throughput")
        ax.legend()
    out += ["", provenance(saved), "", f"![throughput by batch size]({rel(ctx, path)})", ""]
    return "\n".join(out)


SECTION = Section("speed", run_speed, render_speed, reads_mnist=False)

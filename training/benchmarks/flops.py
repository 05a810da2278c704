"""FLOP accounting for the service benchmark: a graph's FLOPs per image, and this machine's float32 GEMM rate.

Counting needs the `onnx` package (the `training` extra) to read einsum equations and build the GEMM probe's
graph; the serving install does without, and the benchmark then says so instead of printing a share.
"""

from __future__ import annotations

import json
import math
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import onnxruntime as ort

from service.contract import ModelCard, create_session, session_options
from training.benchmarks.raw_ort import RawRow, random_feed, raw_slice
from training.benchmarks.timing import timed_runs

GEMM_SIZE = 2048
# The weight's input position of each convolution operator (float, integer and quantized forms).
CONV_WEIGHT = {"Conv": 1, "ConvInteger": 1, "QLinearConv": 3}
MATMULS = ("MatMul", "MatMulInteger", "QLinearMatMul")


class GemmProbe:
    """This machine's float32 GEMM rate: a `size`×`size` matmul by numpy's BLAS and, when the `onnx` package is there
    to build its graph, by ONNX Runtime's own (MLAS, the kernels the models run on) with `threads` intra-op threads.
    Each backend keeps its fastest run; `best_gflops` is the faster backend's, `backend` names it.

    Both are measured because neither bounds the other on every machine: on the AMD EPYC development machine numpy's
    OpenBLAS reaches about half of MLAS's rate, so a model judged against numpy alone could run at "124%" of the
    machine's GEMM rate."""

    def __init__(self, size: int = GEMM_SIZE, threads: int | None = None) -> None:
        rng = np.random.default_rng(0)
        self.size = size
        self.a, self.b = rng.random((size, size), dtype=np.float32), rng.random((size, size), dtype=np.float32)
        self.runs: dict[str, Callable[[], object]] = {"numpy": lambda: self.a @ self.b}
        session = _matmul_session(size, threads)
        if session is not None:
            feed = {"a": self.a, "b": self.b}
            self.runs["onnxruntime"] = lambda: session.run(None, feed)
        self.best_s = dict.fromkeys(self.runs, math.inf)
        for run in self.runs.values():
            run()  # warm-up

    def run(self, seconds: float) -> None:
        """Each backend in turn for `seconds` (at least one run each)."""
        for name, run in self.runs.items():
            self.best_s[name] = min(self.best_s[name], *timed_runs(run, seconds, min_runs=1))

    def gflops(self, backend: str) -> float:
        return 2 * self.size**3 / self.best_s[backend] / 1e9

    @property
    def backend(self) -> str:
        return min(self.best_s, key=lambda name: self.best_s[name])

    @property
    def best_gflops(self) -> float:
        return self.gflops(self.backend)


def matmul_graph(size: int) -> bytes:
    """The float32 reference: one `size`×`size` MatMul (inputs "a", "b", output "c"), serialized; needs `onnx`."""
    from onnx import TensorProto, helper

    square = [size, size]
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["a", "b"], ["c"])],
        "gemm",
        [helper.make_tensor_value_info(name, TensorProto.FLOAT, square) for name in ("a", "b")],
        [helper.make_tensor_value_info("c", TensorProto.FLOAT, square)],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)])
    model.ir_version = 9
    return bytes(model.SerializeToString())


def _matmul_session(size: int, threads: int | None) -> ort.InferenceSession | None:
    """An ONNX Runtime session of the MatMul reference with `threads` intra-op threads (None: ONNX Runtime's
    choice) and spinning threads, as a plain session has; None without `onnx`."""
    try:
        graph = matmul_graph(size)
    except ImportError:
        return None
    return create_session(graph, "cpu", options=session_options(threads or 0, allow_spinning=True))


GEMM_BACKENDS = {"numpy": "numpy's BLAS", "onnxruntime": "ONNX Runtime (MLAS)"}


def gemm_source(gemm: dict[str, Any]) -> str:
    """Which matmul set the GEMM rate, beside the other backend's rate (older results name numpy alone)."""
    size = f"{gemm['size']}×{gemm['size']}"
    backend = gemm.get("backend", "numpy")
    others = [
        f"{GEMM_BACKENDS.get(name, name)} {rate:.1f}"
        for name, rate in gemm.get("gflops_by_backend", {}).items()
        if name != backend
    ]
    text = f"a {size} matmul by {GEMM_BACKENDS.get(backend, backend)}"
    return text + (f", the faster; {', '.join(others)}" if others else "")


def gemm_shares(
    sessions: dict[str, tuple[ModelCard, ort.InferenceSession]],
    raw: dict[str, list[RawRow]],
    rounds: int,
    window: float,
    threads: int | None = None,
) -> dict[str, Any]:
    """This machine's float32 GEMM rate (numpy's and ONNX Runtime's, the faster counts) and each model's fastest raw
    run at its best batch, alternated `rounds` times; all best-of, the rate each reaches when nothing else gets in
    the way."""
    probe = GemmProbe(threads=threads)
    fastest: dict[str, float] = {}
    for _ in range(rounds):
        probe.run(window / 2)
        for name, (card, session) in sessions.items():
            best = max(raw[name], key=lambda r: r.throughput).batch
            latencies = raw_slice(session, random_feed(card, best), window / 2)
            fastest[name] = max(fastest.get(name, 0.0), best / min(latencies))
    by_backend = {name: round(probe.gflops(name), 1) for name in probe.runs}
    print("float32 GEMM: " + ", ".join(f"{name} {rate:.1f} GFLOP/s" for name, rate in by_backend.items()), flush=True)
    return {
        "size": probe.size,
        "gflops": probe.best_gflops,
        "backend": probe.backend,
        "gflops_by_backend": by_backend,
        "fastest_images_per_s": fastest,
    }


FLOPS_NOTE = "counted from ONNX Runtime's profile of one image (convolutions, matrix products, einsums)"


def onnx_flops_per_image(path: Path) -> tuple[int | None, str]:
    """Multiply-add FLOPs (2 per MAC) of the convolutions, matrix products and einsums of one image through the
    graph at `path`, and a note on how they were counted (or why they were not).

    The shapes are the ones ONNX Runtime meets: one batch-1 run of the graph with its profiler on (basic graph
    optimizations, so weight-only subgraphs such as a kron product of the weights are folded away as in the
    service, and every other node keeps its name and operator). Static shape inference cannot follow the
    exported routing's shape arithmetic (`Shape` → `Reshape`), so it left most matrix products uncounted."""
    try:
        import onnx
    except ImportError:
        return None, "counting FLOPs needs the onnx package: pip install onnx (or the training extra)"
    model = onnx.load(str(path))
    for index, node in enumerate(model.graph.node):
        node.name = node.name or f"node{index}"
    equations = {
        node.name: next(a.s.decode() for a in node.attribute if a.name == "equation")
        for node in model.graph.node
        if node.op_type == "Einsum"
    }
    with tempfile.TemporaryDirectory() as tmp:
        options = session_options(
            1, graph_optimization=ort.GraphOptimizationLevel.ORT_ENABLE_BASIC, profile_prefix=str(Path(tmp) / "flops")
        )
        session = create_session(model.SerializeToString(), "cpu", options=options)
        session.run(None, {i.name: _zeros(i) for i in session.get_inputs()})
        with open(session.end_profiling()) as f:
            events = json.load(f)
    total, skipped = 0, []
    for event in events:
        if event.get("cat") != "Node" or not event["name"].endswith(KERNEL_SUFFIX):
            continue
        args = event["args"]
        name = event["name"][: -len(KERNEL_SUFFIX)]
        flops = node_flops(args["op_name"], _shapes(args, "input"), _shapes(args, "output"), equations.get(name))
        if flops is None:
            skipped.append(args["op_name"])
        total += flops or 0
    note = FLOPS_NOTE
    if skipped:
        note += f"; left out: {', '.join(sorted(set(skipped)))} ({len(skipped)} nodes)"
    return total, note


KERNEL_SUFFIX = "_kernel_time"
NUMPY_TYPES = {
    "tensor(float)": np.float32,
    "tensor(float16)": np.float16,
    "tensor(double)": np.float64,
    "tensor(uint8)": np.uint8,
    "tensor(int8)": np.int8,
    "tensor(int32)": np.int32,
    "tensor(int64)": np.int64,
}


def _zeros(value: Any) -> np.ndarray:
    """A batch-1 array of zeros for a session input (symbolic dimensions as 1)."""
    shape = [d if isinstance(d, int) else 1 for d in value.shape]
    return np.zeros(shape, dtype=NUMPY_TYPES.get(value.type, np.float32))


def _shapes(args: dict[str, Any], side: str) -> list[list[int]]:
    """A profiled node's input or output shapes (ONNX Runtime leaves out inputs it pre-packed, e.g. Gemm's B)."""
    return [list(next(iter(entry.values()))) for entry in args.get(f"{side}_type_shape", [])]


def node_flops(op: str, inputs: list[list[int]], outputs: list[list[int]], equation: str | None = None) -> int | None:
    """FLOPs of one node run, from its operator and the shapes it ran with: 0 for element-wise and data movement,
    None where a needed shape or the einsum's equation is missing."""
    output = outputs[0] if outputs else None
    if op in CONV_WEIGHT:
        at = CONV_WEIGHT[op]
        if output is None or len(inputs) <= at:
            return None
        return 2 * math.prod(output) * math.prod(inputs[at][1:])
    if op in MATMULS:
        return None if output is None or not inputs else 2 * math.prod(output) * inputs[0][-1]
    if op == "Gemm":  # A is (M, K) or, transposed, (K, M): K is its size over M
        if output is None or not inputs or not output[0]:
            return None
        return 2 * math.prod(output) * (math.prod(inputs[0]) // output[0])
    if op == "Einsum":
        if equation is None or "..." in equation:
            return None
        operands = equation.replace(" ", "").split("->")[0].split(",")
        if len(operands) < 2:
            return 0
        if len(inputs) != len(operands):
            return None
        sizes = {
            ch: n for term, shape in zip(operands, inputs, strict=True) for ch, n in zip(term, shape, strict=False)
        }
        return 2 * math.prod(sizes.values())
    return 0

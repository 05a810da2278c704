"""FLOP accounting for the service benchmark: a graph's FLOPs per image, and this machine's float32 GEMM rate.

Counting needs the `onnx` package (the `training` extra) for shape inference; the serving install does without,
and the benchmark then says so instead of printing a share.
"""

from __future__ import annotations

import logging
import math
import time
from pathlib import Path
from typing import Any

import numpy as np

logger = logging.getLogger(__name__)

GEMM_SIZE = 2048
# The weight's input position of each convolution operator (float, integer and quantized forms).
CONV_WEIGHT = {"Conv": 1, "ConvInteger": 1, "QLinearConv": 3}
MATMULS = ("MatMul", "MatMulInteger", "QLinearMatMul")


class GemmProbe:
    """numpy's float32 `size`×`size` matmul (every BLAS thread); `best_gflops` is the fastest run seen so far."""

    def __init__(self, size: int = GEMM_SIZE) -> None:
        rng = np.random.default_rng(0)
        self.size = size
        self.a, self.b = rng.random((size, size), dtype=np.float32), rng.random((size, size), dtype=np.float32)
        self.best_s = math.inf
        self.a @ self.b  # warm-up

    def run(self, seconds: float) -> None:
        start = time.perf_counter()
        while time.perf_counter() - start < seconds or self.best_s == math.inf:
            t0 = time.perf_counter()
            self.a @ self.b
            self.best_s = min(self.best_s, time.perf_counter() - t0)

    @property
    def best_gflops(self) -> float:
        return 2 * self.size**3 / self.best_s / 1e9


def onnx_flops_per_image(path: Path) -> tuple[int | None, str]:
    """Multiply-add FLOPs (2 per MAC) of the convolutions, matrix products and einsums of one image through the
    graph at `path`, and a note on how they were counted (or why they were not)."""
    try:
        import onnx
        from onnx import shape_inference
    except ImportError:
        return None, "counting FLOPs needs the onnx package: pip install onnx (or the training extra)"
    model = onnx.load(str(path))
    for value in model.graph.input:
        dims = value.type.tensor_type.shape.dim
        if dims:
            dims[0].ClearField("dim_param")
            dims[0].dim_value = 1
    inferred = shape_inference.infer_shapes(model, data_prop=True)
    shapes = {init.name: list(init.dims) for init in inferred.graph.initializer}
    for value in [*inferred.graph.input, *inferred.graph.value_info, *inferred.graph.output]:
        dims = value.type.tensor_type.shape.dim
        if all(d.HasField("dim_value") for d in dims):
            shapes[value.name] = [d.dim_value for d in dims]
    total, skipped = 0, []
    for node in inferred.graph.node:
        flops = node_flops(node, shapes)
        if flops is None:
            skipped.append(node.op_type)
        total += flops or 0
    note = "counted with onnx shape inference (convolutions, matrix products, einsums)"
    if skipped:
        note += f"; left out for unknown shapes: {', '.join(sorted(set(skipped)))} ({len(skipped)} nodes)"
    return total, note


def node_flops(node: Any, shapes: dict[str, list[int]]) -> int | None:
    """FLOPs of one node: 0 for element-wise and data movement, None where a needed shape is unknown."""
    inputs = [shapes.get(name) for name in node.input]
    output = shapes.get(node.output[0]) if node.output else None
    if node.op_type in CONV_WEIGHT:
        weight = inputs[CONV_WEIGHT[node.op_type]]
        return None if weight is None or output is None else 2 * math.prod(output) * math.prod(weight[1:])
    if node.op_type in MATMULS:
        return None if inputs[0] is None or output is None else 2 * math.prod(output) * inputs[0][-1]
    if node.op_type == "Gemm":
        trans_a = next((a.i for a in node.attribute if a.name == "transA"), 0)
        if inputs[0] is None or output is None:
            return None
        return 2 * math.prod(output) * inputs[0][0 if trans_a else 1]
    if node.op_type == "Einsum":
        equation = next(a.s.decode() for a in node.attribute if a.name == "equation")
        operands = equation.split("->")[0].split(",")
        if any(s is None for s in inputs) or "..." in equation:
            return None
        sizes = {
            ch: n
            for term, shape in zip(operands, inputs, strict=True)
            for ch, n in zip(term, shape or [], strict=False)
        }
        return 2 * math.prod(sizes.values()) if len(operands) > 1 else 0
    return 0

"""FLOP counting from ONNX Runtime's profile, and the GEMM probe that sets this machine's rate."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest

from training.benchmarks import flops
from training.benchmarks.flops import FLOPS_NOTE, GemmProbe, gemm_source, node_flops, onnx_flops_per_image

onnx = pytest.importorskip("onnx")
from onnx import TensorProto, helper, numpy_helper  # noqa: E402


def dynamic_graph(path: Path) -> None:
    """Conv → a Reshape whose target is computed from `Shape` (static inference cannot follow it) → MatMul → Gemm
    (transA) → Einsum, with a symbolic batch axis: every product's FLOPs are known by hand."""
    rng = np.random.default_rng(0)

    def weight(name: str, *shape: int) -> TensorProto:
        return numpy_helper.from_array(rng.standard_normal(shape).astype(np.float32), name)

    nodes = [
        helper.make_node("Conv", ["x", "w"], ["c"], name="conv"),  # (b, 4, 6, 6): 2·144·9 per image
        helper.make_node("Shape", ["c"], ["shape"], name="shape", end=1),
        helper.make_node("Concat", ["shape", "minus_one"], ["target"], name="target", axis=0),
        helper.make_node("Reshape", ["c", "target"], ["flat"], name="flat"),  # (b, 144)
        helper.make_node("MatMul", ["flat", "m"], ["mm"], name="matmul"),  # (b, 10): 2·10·144
        helper.make_node("Transpose", ["mm"], ["mmt"], name="t"),  # (10, b)
        helper.make_node("Gemm", ["mmt", "g"], ["gm"], name="gemm", transA=1),  # (b, 6): 2·6·10
        helper.make_node("Einsum", ["gm", "e"], ["y"], name="einsum", equation="bi,ij->bj"),  # (b, 3): 2·6·3
    ]
    graph = helper.make_graph(
        nodes,
        "dynamic",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 1, 8, 8])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", 3])],
        [
            weight("w", 4, 1, 3, 3),
            numpy_helper.from_array(np.array([-1], np.int64), "minus_one"),
            weight("m", 144, 10),
            weight("g", 10, 6),
            weight("e", 6, 3),
        ],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)])
    model.ir_version = 9
    onnx.save(model, str(path))


def test_every_product_of_a_graph_with_shape_arithmetic_is_counted(tmp_path: Path) -> None:
    dynamic_graph(tmp_path / "g.onnx")
    total, note = onnx_flops_per_image(tmp_path / "g.onnx")
    assert note == FLOPS_NOTE
    assert total == 2 * 144 * 9 + 2 * 10 * 144 + 2 * 6 * 10 + 2 * 6 * 3


def test_a_node_without_what_it_needs_is_left_out_and_named() -> None:
    assert node_flops("Einsum", [[2, 3], [3, 4]], [[2, 4]], equation=None) is None
    assert node_flops("Einsum", [[2, 3], [3, 4]], [[2, 4]], equation="...i,ij->...j") is None
    assert node_flops("Einsum", [[2, 3]], [[3, 2]], equation="ij->ji") == 0  # a transpose
    assert node_flops("MatMul", [], [[2, 4]]) is None
    assert node_flops("QLinearConv", [[1, 1, 4, 4], [], [], [2, 1, 3, 3]], [[1, 2, 2, 2]]) == 2 * 8 * 9
    assert node_flops("Relu", [[1, 4]], [[1, 4]]) == 0


def test_without_onnx_the_count_says_why(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setitem(__import__("sys").modules, "onnx", None)
    assert onnx_flops_per_image(tmp_path / "absent.onnx") == (
        None,
        "counting FLOPs needs the onnx package: pip install onnx (or the training extra)",
    )


def test_the_gemm_probe_measures_both_backends_and_keeps_the_faster() -> None:
    probe = GemmProbe(size=64, threads=1)
    probe.run(0.01)
    assert set(probe.runs) == {"numpy", "onnxruntime"}
    rates = {name: probe.gflops(name) for name in probe.runs}
    assert all(math.isfinite(r) and r > 0 for r in rates.values())
    assert probe.best_gflops == max(rates.values()) and rates[probe.backend] == probe.best_gflops
    product = probe.runs["onnxruntime"]()
    assert isinstance(product, list) and np.allclose(product[0], probe.a @ probe.b, rtol=1e-4, atol=1e-3)


def test_without_onnx_the_gemm_probe_is_numpy_alone(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(flops, "_matmul_session", lambda size, threads: None)
    probe = GemmProbe(size=32)
    probe.run(0.0)
    assert list(probe.runs) == ["numpy"] and probe.backend == "numpy" and probe.best_gflops > 0


def test_the_gemm_rate_names_its_backend() -> None:
    new = {"size": 2048, "backend": "onnxruntime", "gflops_by_backend": {"numpy": 255.3, "onnxruntime": 465.7}}
    assert gemm_source(new) == ("a 2048×2048 matmul by ONNX Runtime (MLAS), the faster; numpy's BLAS 255.3")
    assert gemm_source({"size": 2048}) == "a 2048×2048 matmul by numpy's BLAS"  # an older result

"""The u_hat Einsum rewrite: same numbers as the Einsum, with and without the class-major Transpose after it."""

from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

from training.quantize.rewrite import U_HAT_EQUATION, rewrite_u_hat_einsum

N_IN, N_OUT, D, K = 6, 3, 4, 2


def u_hat_graph(equation: str = U_HAT_EQUATION, transpose: bool = True) -> onnx.ModelProto:
    """u (B, N_in, K) -> Einsum with W (N_in, N_out, D, K) [-> Transpose to (B, N_out, N_in, D)]."""
    w = np.random.default_rng(0).standard_normal((N_IN, N_OUT, D, K)).astype(np.float32)
    nodes = [helper.make_node("Einsum", ["W", "u"], ["einsum"], "node_einsum", equation=equation)]
    out, shape = "einsum", ["B", N_IN, N_OUT, D]
    if transpose:
        nodes.append(helper.make_node("Transpose", ["einsum"], ["u_hat"], "node_transpose", perm=[0, 2, 1, 3]))
        out, shape = "u_hat", ["B", N_OUT, N_IN, D]
    graph = helper.make_graph(
        nodes,
        "u_hat",
        [helper.make_tensor_value_info("u", TensorProto.FLOAT, ["B", N_IN, K])],
        [helper.make_tensor_value_info(out, TensorProto.FLOAT, shape)],
        [numpy_helper.from_array(w, "W")],
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)], ir_version=10)


def run(proto: onnx.ModelProto, u: np.ndarray) -> np.ndarray:
    session = ort.InferenceSession(proto.SerializeToString(), providers=["CPUExecutionProvider"])
    return session.run(None, {"u": u})[0]


@pytest.mark.parametrize("transpose", [True, False])
@pytest.mark.parametrize("batch", [1, 5])
def test_rewrite_computes_the_einsum(transpose: bool, batch: int) -> None:
    proto = u_hat_graph(transpose=transpose)
    u = np.random.default_rng(1).standard_normal((batch, N_IN, K)).astype(np.float32)
    want = run(proto, u)
    assert rewrite_u_hat_einsum(proto) == ["node_einsum"]
    onnx.checker.check_model(proto, full_check=True)
    ops = [n.op_type for n in proto.graph.node]
    assert ops == ["Transpose", "MatMul", "Reshape", "Transpose"]  # the class-major Transpose folded in
    assert [i.name for i in proto.graph.initializer] == ["node_einsum/weight_ikjd", "node_einsum/u_hat_shape"]
    np.testing.assert_allclose(run(proto, u), want, rtol=1e-5, atol=1e-6)


def test_other_einsums_are_left_alone() -> None:
    proto = u_hat_graph(equation="ijdk,bik->bjid")
    before = proto.SerializeToString()
    assert rewrite_u_hat_einsum(proto) == []
    assert proto.SerializeToString() == before

"""Numbers a model cannot take or give: inputs outside the card's range, and outputs that are not finite, answered
the same on every route and encoding (v2 JSON, v2 binary, gRPC; v1 where a client can reach them)."""

from __future__ import annotations

import json
import logging
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import tritonclient.grpc as triton
from fastapi.testclient import TestClient

from tests.service.api.test_api_v2 import binary_request, infer_body
from tests.service.conftest import TINY, service_settings, sha256, wait_ready
from tests.service.grpc.test_grpc import error_of, grpc_app, image_input

LOG_MODEL = "tiny-log"  # scores = log(image · w) with w > 0: -inf for a blank image, finite for any other
BLANK = np.zeros((1, 1, 28, 28), np.float32)
INK = np.full((1, 1, 28, 28), 0.5, np.float32)
NON_FINITE = (
    f"model {LOG_MODEL!r} computed NaN or infinite outputs for this input, which cannot be sent as numbers; "
    "send inputs like those it was trained on"
)


def write_log_model(root: Path) -> None:
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(0)
    weights = [
        numpy_helper.from_array(rng.uniform(0.01, 0.05, (784, 10)).astype(np.float32), "w_scores"),
        numpy_helper.from_array(rng.normal(0, 0.05, (784, 160)).astype(np.float32), "w_pose"),
        numpy_helper.from_array(np.array([-1, 784], np.int64), "flat_shape"),
        numpy_helper.from_array(np.array([-1, 10, 4, 4], np.int64), "pose_shape"),
    ]
    nodes = [
        helper.make_node("Reshape", ["image", "flat_shape"], ["flat"]),
        helper.make_node("MatMul", ["flat", "w_scores"], ["sums"]),
        helper.make_node("Log", ["sums"], ["scores"]),
        helper.make_node("MatMul", ["flat", "w_pose"], ["pose_flat"]),
        helper.make_node("Reshape", ["pose_flat", "pose_shape"], ["poses"]),
    ]
    graph = helper.make_graph(
        nodes,
        "log_scores",
        [helper.make_tensor_value_info("image", TensorProto.FLOAT, ["N", 1, 28, 28])],
        [
            helper.make_tensor_value_info("scores", TensorProto.FLOAT, ["N", 10]),
            helper.make_tensor_value_info("poses", TensorProto.FLOAT, ["N", 10, 4, 4]),
        ],
        initializer=weights,
    )
    proto = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)])
    proto.ir_version = 9
    directory = root / LOG_MODEL
    directory.mkdir(parents=True)
    onnx.save(proto, directory / "capsnet.onnx")
    graph_file = directory / "capsnet.onnx"
    card = {
        "format_version": 1,
        "name": LOG_MODEL,
        "architecture": "em",
        "input": {"name": "image", "shape": [-1, 1, 28, 28], "datatype": "FP32", "range": [0.0, 1.0]},
        "classes": [str(i) for i in range(10)],
        "outputs": [
            {"name": "scores", "shape": [-1, 10], "datatype": "FP32", "role": "scores"},
            {"name": "poses", "shape": [-1, 10, 4, 4], "datatype": "FP32", "role": "poses"},
        ],
        "scores": {"output": "scores", "kind": "activation"},
        "pose_shape": [4, 4],
        "files": {"capsnet.onnx": {"sha256": sha256(graph_file), "bytes": graph_file.stat().st_size}},
    }
    (directory / "model.json").write_text(json.dumps(card))


@pytest.fixture(scope="module")
def log_repository(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("log-model")
    write_log_model(root)
    return root


@pytest.fixture(scope="module")
def log_client(log_repository: Path) -> Iterator[TestClient]:
    from service.main import create_app

    settings = service_settings(log_repository, max_batch_size=8)
    with TestClient(create_app(settings), raise_server_exceptions=False) as client:
        wait_ready(client)
        yield client


def v2_json(client: TestClient, model: str, images: np.ndarray, **extra: Any) -> tuple[int, Any]:
    r = client.post(f"/v2/models/{model}/infer", json=infer_body(images, **extra))
    return r.status_code, r.json()


def v2_binary(client: TestClient, model: str, images: np.ndarray, scores: str = "scores") -> tuple[int, Any]:
    """Binary input and a binary `scores` output (the binary tensor data extension both ways)."""
    body, headers = binary_request(images, outputs=[{"name": scores, "parameters": {"binary_data": True}}])
    r = client.post(f"/v2/models/{model}/infer", content=body, headers=headers)
    return r.status_code, r.json() if r.headers["content-type"] == "application/json" else r.content


@pytest.mark.parametrize("value", [1e30, 1.5, -0.01])
def test_a_value_outside_the_cards_range_is_refused_on_every_encoding(
    client: TestClient, model_repository: Path, value: float
) -> None:
    images = INK.copy()
    images[0, 0, 0, 0] = value
    message = (
        f"input 'image' has values from {min(value, 0.5):g} to {max(value, 0.5):g}; model {TINY!r} takes values in "
        "[0, 1] (its card's input.range)"
    )
    assert v2_json(client, TINY, images) == (400, {"error": message})
    assert v2_binary(client, TINY, images, scores="lengths") == (400, {"error": message})
    with grpc_app(model_repository) as target, triton.InferenceServerClient(target) as c:
        assert error_of(lambda: c.infer(TINY, [image_input(images)])) == ("StatusCode.INVALID_ARGUMENT", message)


def test_the_edges_of_the_range_are_accepted(client: TestClient) -> None:
    images = np.stack([BLANK[0], np.ones_like(BLANK[0])])
    assert v2_json(client, TINY, images)[0] == 200


def test_a_card_range_must_be_ordered_and_finite() -> None:
    from service.runtime.card import CardError, parse_card

    card = json.loads((Path(__file__).parents[3] / "model/zoo/capsnet-mnist/model.json").read_text())
    assert parse_card(card).input.range == (0.0, 1.0)
    for bad in ([1.0, 0.0], [0.0, float("inf")]):
        with pytest.raises(CardError, match="input range must be two finite numbers"):
            parse_card({**card, "input": {**card["input"], "range": bad}})


def test_a_non_finite_output_is_one_error_on_json_binary_and_grpc(
    log_client: TestClient, log_repository: Path, caplog: pytest.LogCaptureFixture
) -> None:
    assert v2_json(log_client, LOG_MODEL, INK)[0] == 200  # an input with ink: finite scores
    with caplog.at_level(logging.INFO):
        assert v2_json(log_client, LOG_MODEL, BLANK) == (422, {"error": NON_FINITE})
    warnings = [r for r in caplog.records if r.levelno >= logging.WARNING]
    assert [r.getMessage() for r in warnings] == [
        f"model {LOG_MODEL} (capsnet graph) computed NaN or infinite outputs: refused with 422"
    ]
    assert all(r.exc_info is None for r in caplog.records)
    assert v2_binary(log_client, LOG_MODEL, BLANK) == (422, {"error": NON_FINITE})
    blank_array = {"images": [{"array": BLANK[0, 0].tolist()}]}
    r = log_client.post(f"/v1/models/{LOG_MODEL}/classify", json=blank_array)
    assert (r.status_code, r.json()) == (422, {"error": NON_FINITE, "type": "non_finite_output"})
    with grpc_app(log_repository) as target, triton.InferenceServerClient(target) as c:
        assert error_of(lambda: c.infer(LOG_MODEL, [image_input(BLANK)])) == ("StatusCode.INVALID_ARGUMENT", NON_FINITE)
        assert c.infer(LOG_MODEL, [image_input(INK)]).as_numpy("scores").shape == (1, 10)


def test_in_a_batch_only_the_request_with_non_finite_rows_is_refused(log_client: TestClient) -> None:
    """Rows of one run: the blank image's caller gets 422, the others their finite outputs."""
    from concurrent.futures import ThreadPoolExecutor

    def call(images: np.ndarray) -> int:
        return v2_json(log_client, LOG_MODEL, images)[0]

    with ThreadPoolExecutor(8) as pool:
        statuses = list(pool.map(call, [BLANK if i % 4 == 0 else INK for i in range(16)]))
    assert statuses == [422 if i % 4 == 0 else 200 for i in range(16)]


def test_finiteness_is_read_per_caller_from_one_check_per_batch() -> None:
    from service.runtime.batcher import BatchResult, Rows
    from service.runtime.model import all_finite

    outputs = {"scores": np.ones((4, 10), np.float32), "poses": np.ones((4, 10, 16), np.float32)}
    outputs["poses"][2, 3, 5] = np.nan
    batch = BatchResult({"image": np.zeros((4, 1, 28, 28), np.float32)}, outputs)
    assert [all_finite(Rows(batch, slice(i, i + 1))) for i in range(4)] == [True, True, False, True]
    assert not all_finite(Rows(batch, slice(0, 4))) and all_finite(Rows(batch, slice(3, 4)))
    assert not all_finite({"scores": np.array([[np.inf]])}) and all_finite({"scores": np.zeros((1, 1))})

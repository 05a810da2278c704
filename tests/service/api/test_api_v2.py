"""Open Inference Protocol (KServe v2) REST: the exact shapes of the spec, and its errors as {"error": ...}."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from fastapi.testclient import TestClient

from tests.service.api.test_api_v1 import run_graph
from tests.service.conftest import EM_LIKE, NO_DECODER, TINY

rng = np.random.default_rng(0)
IMAGES = rng.random((3, 1, 28, 28), dtype=np.float32)


def infer_body(images: np.ndarray = IMAGES, **extra: Any) -> dict[str, Any]:
    tensor = {"name": "image", "shape": list(images.shape), "datatype": "FP32", "data": images.ravel().tolist()}
    return {"inputs": [tensor], **extra}


def v2_error(r: Any) -> tuple[int, dict[str, Any]]:
    return r.status_code, r.json()


def test_server_metadata(client: TestClient) -> None:
    body = client.get("/v2").json()
    assert set(body) == {"name", "version", "extensions"}
    assert body["name"] == "capsnet-serve" and body["extensions"] == ["binary_tensor_data"]


def test_health_is_a_status_code_with_an_empty_body(client: TestClient) -> None:
    for path in (
        "/v2/health/live",
        "/v2/health/ready",
        f"/v2/models/{TINY}/ready",
        f"/v2/models/{TINY}/versions/1/ready",
    ):
        r = client.get(path)
        assert (r.status_code, r.content) == (200, b""), path


def test_model_metadata(client: TestClient) -> None:
    body = client.get(f"/v2/models/{TINY}").json()
    assert body == {
        "name": TINY,
        "versions": ["1"],
        "platform": "onnxruntime_onnx",
        "inputs": [{"name": "image", "datatype": "FP32", "shape": [-1, 1, 28, 28]}],
        "outputs": [
            {"name": "lengths", "datatype": "FP32", "shape": [-1, 10]},
            {"name": "poses", "datatype": "FP32", "shape": [-1, 10, 8]},
            {"name": "reconstruction", "datatype": "FP32", "shape": [-1, 1, 28, 28]},
            {"name": "explanation", "datatype": "FP32", "shape": [-1, 10, 6, 6]},
        ],
        "parameters": {"execution_provider": "CPUExecutionProvider", "architecture": "dynamic"},
    }
    assert client.get(f"/v2/models/{EM_LIKE}/versions/3").json()["outputs"][1]["shape"] == [-1, 10, 4, 4]


def test_infer_returns_every_output_exactly(client: TestClient, model_repository: Path) -> None:
    r = client.post(f"/v2/models/{TINY}/infer", json=infer_body(id="req-7"))
    assert r.status_code == 200
    body = r.json()
    assert list(body) == ["model_name", "model_version", "id", "outputs"]
    assert (body["model_name"], body["model_version"], body["id"]) == (TINY, "1", "req-7")
    expected = run_graph(model_repository, TINY, "capsnet.onnx", {"image": IMAGES})
    assert [o["name"] for o in body["outputs"]] == ["lengths", "poses", "reconstruction", "explanation"]
    for out in body["outputs"]:
        assert out["datatype"] == "FP32"
        assert out["shape"] == list(expected[out["name"]].shape)
        np.testing.assert_allclose(np.array(out["data"]).reshape(out["shape"]), expected[out["name"]], atol=1e-5)


def test_infer_output_selection_nested_data_and_parameters(client: TestClient) -> None:
    body = {
        "inputs": [{"name": "image", "shape": [3, 1, 28, 28], "datatype": "FP32", "data": IMAGES.tolist()}],
        "outputs": [{"name": "poses"}],
        "parameters": {"custom": 1},
    }
    out = client.post(f"/v2/models/{EM_LIKE}/versions/3/infer", json=body).json()
    assert "id" not in out
    assert [(o["name"], o["shape"]) for o in out["outputs"]] == [("poses", [3, 10, 4, 4])]
    flat = client.post(f"/v2/models/{EM_LIKE}/infer", json=infer_body(outputs=[{"name": "poses"}])).json()
    assert flat["outputs"] == out["outputs"]


def binary_request(images: np.ndarray, outputs: list[dict[str, Any]] | None = None) -> tuple[bytes, dict[str, str]]:
    raw = images.astype("<f4").tobytes()
    header: dict[str, Any] = {
        "inputs": [
            {
                "name": "image",
                "shape": list(images.shape),
                "datatype": "FP32",
                "parameters": {"binary_data_size": len(raw)},
            }
        ]
    }
    if outputs is not None:
        header["outputs"] = outputs
    head = json.dumps(header).encode()
    return head + raw, {"Inference-Header-Content-Length": str(len(head)), "content-type": "application/octet-stream"}


def test_binary_tensor_extension(client: TestClient, model_repository: Path) -> None:
    body, headers = binary_request(
        IMAGES, [{"name": "lengths", "parameters": {"binary_data": True}}, {"name": "poses"}]
    )
    r = client.post(f"/v2/models/{TINY}/infer", content=body, headers=headers)
    assert r.status_code == 200 and r.headers["content-type"] == "application/octet-stream"
    n = int(r.headers["inference-header-content-length"])
    header = json.loads(r.content[:n])
    lengths, poses = header["outputs"]
    assert lengths["parameters"] == {"binary_data_size": 3 * 10 * 4} and "data" not in lengths
    got = np.frombuffer(r.content[n:], "<f4").reshape(3, 10)
    expected = run_graph(model_repository, TINY, "capsnet.onnx", {"image": IMAGES})
    np.testing.assert_allclose(got, expected["lengths"], atol=1e-5)
    np.testing.assert_allclose(np.array(poses["data"]).reshape(3, 10, 8), expected["poses"], atol=1e-5)


@pytest.mark.parametrize(
    ("body", "message"),
    [
        (infer_body(IMAGES[:, 0]), "input 'image' has shape [3, 28, 28]; model 'tiny' expects [-1, 1, 28, 28]"),
        (
            infer_body(np.zeros((1, 1, 28, 27), np.float32)),
            "input 'image' has shape [1, 1, 28, 27]; model 'tiny' expects [-1, 1, 28, 28]",
        ),
        (
            infer_body(np.zeros((0, 1, 28, 28), np.float32)),
            "input 'image' has shape [0, 1, 28, 28]; dimensions must be positive",
        ),
        (
            {"inputs": [{**infer_body()["inputs"][0], "datatype": "FP64"}]},
            "input 'image' has datatype 'FP64'; model 'tiny' expects FP32",
        ),
        (
            {"inputs": [{**infer_body()["inputs"][0], "datatype": "INT32"}]},
            "input 'image' has datatype 'INT32'; model 'tiny' expects FP32",
        ),
        (
            {"inputs": [{**infer_body()["inputs"][0], "data": [0.0] * 100}]},
            "input 'image' has 100 values; shape [3, 1, 28, 28] needs 2352",
        ),
        (
            {"inputs": [{**infer_body()["inputs"][0], "name": "pixels"}]},
            "unknown input 'pixels'; model 'tiny' expects ['image']",
        ),
        ({"inputs": infer_body()["inputs"] * 2}, "inputs ['image', 'image'] name a tensor more than once"),
        (
            infer_body(outputs=[{"name": "logits"}]),
            "unknown output 'logits'; model 'tiny' has outputs ['lengths', 'poses', 'reconstruction', 'explanation']",
        ),
        ({"inputs": [{"name": "image", "shape": [1, 1, 28, 28], "datatype": "FP32"}]}, "input 'image' has no data"),
        ({"outputs": []}, "invalid request body: inputs: Field required"),
        (
            infer_body(outputs=[{"name": "lengths"}, {"name": "lengths"}]),
            "outputs ['lengths', 'lengths'] name a tensor more than once",
        ),
        (
            infer_body(parameters={"binary_data_output": "false"}),
            "request parameter 'binary_data_output' must be true or false, got 'false'",
        ),
        (
            infer_body(outputs=[{"name": "lengths", "parameters": {"binary_data": 0}}]),
            "output 'lengths' parameter 'binary_data' must be true or false, got 0",
        ),
        (
            {
                "inputs": [
                    {
                        "name": "image",
                        "shape": [3, 1, 28, 28],
                        "datatype": "FP32",
                        "parameters": {"binary_data_size": 9408.5},
                    }
                ]
            },
            "input 'image': parameter 'binary_data_size' must be an integer, got 9408.5",
        ),
        (
            {"inputs": [{"name": "image"}]},
            "invalid request body: inputs.0.shape: Field required; inputs.0.datatype: Field required",
        ),
    ],
)
def test_infer_errors(client: TestClient, body: dict[str, Any], message: str) -> None:
    assert v2_error(client.post(f"/v2/models/{TINY}/infer", json=body)) == (400, {"error": message})


def test_infer_non_numeric_data(client: TestClient) -> None:
    body = {"inputs": [{"name": "image", "shape": [1, 1, 28, 28], "datatype": "FP32", "data": ["a"] * 784}]}
    status, got = v2_error(client.post(f"/v2/models/{TINY}/infer", json=body))
    assert status == 400 and got["error"].startswith("input 'image': data must be FP32 numbers: ")
    assert set(got) == {"error"}


@pytest.mark.parametrize("value", ["NaN", "Infinity"])
def test_infer_nan_and_infinity(client: TestClient, value: str) -> None:
    data = ",".join([value] + ["0.5"] * 783)
    body = '{"inputs": [{"name": "image", "shape": [1, 1, 28, 28], "datatype": "FP32", "data": [' + data + "]}]}"
    r = client.post(f"/v2/models/{TINY}/infer", content=body.encode(), headers={"content-type": "application/json"})
    assert v2_error(r) == (400, {"error": "input 'image' contains NaN or infinite values"})


def test_infer_malformed_json_and_content_type(client: TestClient) -> None:
    r = client.post(f"/v2/models/{TINY}/infer", content=b"{", headers={"content-type": "application/json"})
    assert v2_error(r) == (
        400,
        {"error": "malformed JSON: Expecting property name enclosed in double quotes: line 1 column 2 (char 1)"},
    )
    r = client.post(f"/v2/models/{TINY}/infer", content=b"{}", headers={"content-type": "text/csv"})
    assert v2_error(r) == (415, {"error": "unsupported content type 'text/csv'; send application/json"})


def test_infer_json_nested_too_deeply(client: TestClient) -> None:
    deep = b"[" * 100_000 + b"]" * 100_000
    body = b'{"inputs": [{"name": "image", "shape": [1, 1, 28, 28], "datatype": "FP32", "data": ' + deep + b"}]}"
    r = client.post(f"/v2/models/{TINY}/infer", content=body, headers={"content-type": "application/json"})
    assert v2_error(r) == (400, {"error": "malformed JSON: nested too deeply"})


def test_infer_binary_errors(client: TestClient) -> None:
    body, headers = binary_request(IMAGES)
    r = client.post(f"/v2/models/{TINY}/infer", content=body[:-4], headers=headers)
    status, got = v2_error(r)
    assert status == 400 and got["error"].startswith("input 'image': binary_data_size 9408 does not match")
    r = client.post(f"/v2/models/{TINY}/infer", content=body + b"\0" * 4, headers=headers)
    assert v2_error(r) == (400, {"error": "4 bytes of binary data are not claimed by any input"})
    r = client.post(
        f"/v2/models/{TINY}/infer", content=body, headers={**headers, "Inference-Header-Content-Length": "x"}
    )
    assert v2_error(r) == (
        400,
        {"error": f"inference-header-content-length 'x' is not a length within the {len(body)}-byte body"},
    )


def test_infer_too_many_images(make_client: Any, model_repository: Path) -> None:
    client = make_client(model_repository, max_images_per_request=2)
    assert v2_error(client.post(f"/v2/models/{TINY}/infer", json=infer_body())) == (
        413,
        {"error": "too many images: batch of 3, the limit is 2 (CAPSNET_MAX_IMAGES_PER_REQUEST)"},
    )


def test_v2_body_over_the_limit(make_client: Any, model_repository: Path) -> None:
    client = make_client(model_repository, max_body_bytes=1000)
    r = client.post(f"/v2/models/{TINY}/infer", json=infer_body())
    assert r.status_code == 413 and set(r.json()) == {"error"}
    assert r.json()["error"].endswith("the limit is 1000 bytes (CAPSNET_MAX_BODY_BYTES)")


@pytest.mark.parametrize(
    ("path", "message"),
    [
        ("/v2/models/nope", f"model 'nope' not found; served models: {sorted([TINY, EM_LIKE, NO_DECODER])}"),
        ("/v2/models/nope/ready", f"model 'nope' not found; served models: {sorted([TINY, EM_LIKE, NO_DECODER])}"),
        (f"/v2/models/{TINY}/versions/9", "model 'tiny' has no version '9' (versions: ['1'])"),
        (f"/v2/models/{TINY}/versions/9/ready", "model 'tiny' has no version '9' (versions: ['1'])"),
        ("/v2/nothing", "no route for GET at this path; see /docs for the routes"),
    ],
)
def test_v2_not_found(client: TestClient, path: str, message: str) -> None:
    assert v2_error(client.get(path)) == (404, {"error": message})
    if "models" in path and not path.endswith("ready"):
        assert v2_error(client.post(f"{path}/infer", json=infer_body())) == (404, {"error": message})


@pytest.mark.parametrize("value", ["NaN", "Infinity", "-Infinity"])
def test_infer_rejects_nan_and_infinity(client: TestClient, value: str) -> None:
    data = ", ".join(["0.0"] * 783 + [value])
    text = f'{{"inputs": [{{"name": "image", "shape": [1, 1, 28, 28], "datatype": "FP32", "data": [{data}]}}]}}'
    r = client.post(f"/v2/models/{TINY}/infer", content=text, headers={"content-type": "application/json"})
    assert v2_error(r) == (400, {"error": "input 'image' contains NaN or infinite values"})

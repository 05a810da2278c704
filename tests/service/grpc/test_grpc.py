"""The Open Inference Protocol over gRPC, driven by the stock tritonclient.grpc (sync and asyncio) and stubs.

Each app runs in-process (its gRPC server on the TestClient's event loop, as under uvicorn) on a free port.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import grpc
import numpy as np
import pytest
import tritonclient.grpc as triton
import tritonclient.grpc.aio as triton_aio
from fastapi.testclient import TestClient
from grpc_health.v1 import health_pb2, health_pb2_grpc
from tritonclient.grpc import service_pb2, service_pb2_grpc
from tritonclient.utils import InferenceServerException

from service.grpc import protocol
from service.main import create_app
from service.runtime.batcher import DynamicBatcher
from tests.service.api.test_api_v1 import run_graph
from tests.service.conftest import EM_LIKE, TINY, service_settings, wait_ready
from tests.service.live_server import free_port

rng = np.random.default_rng(0)
IMAGES = rng.random((3, 1, 28, 28), dtype=np.float32)
MAX_IMAGES = 8
MAX_BYTES = 64_000  # 16 images fit in a message; 32 do not
INFER = "/inference.GRPCInferenceService/ModelInfer"


@contextmanager
def grpc_app(
    repository: Path, check_token: Callable[[str | None], bool] | None = None, **settings: Any
) -> Iterator[str]:
    """An app with gRPC on a free port, started and loaded; yields the gRPC target (host:port)."""
    port = free_port()
    app = create_app(service_settings(repository, grpc_port=port, **settings))
    if check_token is not None:
        app.state.check_token = check_token
    with TestClient(app, raise_server_exceptions=False) as client:
        wait_ready(client)
        yield f"127.0.0.1:{port}"


@pytest.fixture(scope="module")
def target(model_repository: Path) -> Iterator[str]:
    with grpc_app(model_repository, max_images_per_request=MAX_IMAGES, max_body_bytes=MAX_BYTES) as t:
        yield t


@pytest.fixture(scope="module")
def client(target: str) -> Iterator[triton.InferenceServerClient]:
    with triton.InferenceServerClient(target) as c:
        yield c


def image_input(images: np.ndarray = IMAGES, datatype: str = "FP32") -> triton.InferInput:
    tensor = triton.InferInput("image", list(images.shape), datatype)
    tensor.set_data_from_numpy(images)
    return tensor


def error_of(call: Callable[[], Any]) -> tuple[str, str]:
    with pytest.raises(InferenceServerException) as e:
        call()
    return str(e.value.status()), str(e.value.message())


def stub(target: str) -> service_pb2_grpc.GRPCInferenceServiceStub:
    """tritonclient's own generated stub, for messages its high-level client does not build (typed contents)."""
    return service_pb2_grpc.GRPCInferenceServiceStub(grpc.insecure_channel(target))


def typed_request(images: np.ndarray = IMAGES, **fields: Any) -> service_pb2.ModelInferRequest:
    request = service_pb2.ModelInferRequest(model_name=TINY, **fields)
    tensor = request.inputs.add(name="image", datatype="FP32", shape=images.shape)
    tensor.contents.fp32_contents.extend(images.ravel().tolist())
    return request


def test_health_liveness_readiness_and_metadata(client: triton.InferenceServerClient) -> None:
    assert client.is_server_live() and client.is_server_ready()
    assert client.is_model_ready(TINY) and client.is_model_ready(TINY, "1")
    server = client.get_server_metadata(as_json=True)
    assert server["name"] == "capsnet-serve" and server["version"]
    assert client.get_model_metadata(TINY, as_json=True) == {
        "name": TINY,
        "versions": ["1"],
        "platform": "onnxruntime_onnx",
        "inputs": [{"name": "image", "datatype": "FP32", "shape": ["-1", "1", "28", "28"]}],
        "outputs": [
            {"name": "lengths", "datatype": "FP32", "shape": ["-1", "10"]},
            {"name": "poses", "datatype": "FP32", "shape": ["-1", "10", "8"]},
            {"name": "reconstruction", "datatype": "FP32", "shape": ["-1", "1", "28", "28"]},
            {"name": "explanation", "datatype": "FP32", "shape": ["-1", "10", "6", "6"]},
        ],
    }
    em = client.get_model_metadata(EM_LIKE, "3", as_json=True)
    assert em["outputs"][1] == {"name": "poses", "datatype": "FP32", "shape": ["-1", "10", "4", "4"]}


def test_infer_raw_contents_every_output(client: triton.InferenceServerClient, model_repository: Path) -> None:
    result = client.infer(TINY, [image_input()], request_id="req-7")
    response = result.get_response()
    assert (response.model_name, response.model_version, response.id) == (TINY, "1", "req-7")
    assert [o.name for o in response.outputs] == ["lengths", "poses", "reconstruction", "explanation"]
    assert len(response.raw_output_contents) == 4  # raw in, raw out
    expected = run_graph(model_repository, TINY, "capsnet.onnx", {"image": IMAGES})
    for name, want in expected.items():
        got = result.as_numpy(name)
        assert got.dtype == np.float32 and got.shape == want.shape
        np.testing.assert_allclose(got, want, atol=1e-5)


def test_infer_requested_outputs_only(client: triton.InferenceServerClient) -> None:
    outputs = [triton.InferRequestedOutput("poses"), triton.InferRequestedOutput("lengths")]
    response = client.infer(TINY, [image_input()], outputs=outputs).get_response()
    assert [(o.name, list(o.shape)) for o in response.outputs] == [("poses", [3, 10, 8]), ("lengths", [3, 10])]


def test_infer_typed_contents_answers_typed_contents(target: str, model_repository: Path) -> None:
    request = typed_request(
        id="typed", outputs=[service_pb2.ModelInferRequest.InferRequestedOutputTensor(name="lengths")]
    )
    response = stub(target).ModelInfer(request)
    assert response.id == "typed" and not response.raw_output_contents
    (out,) = response.outputs
    assert (out.name, out.datatype, list(out.shape)) == ("lengths", "FP32", [3, 10])
    want = run_graph(model_repository, TINY, "capsnet.onnx", {"image": IMAGES})["lengths"]
    np.testing.assert_allclose(np.array(out.contents.fp32_contents).reshape(3, 10), want, atol=1e-5)


def test_asyncio_client(target: str, model_repository: Path) -> None:
    async def scenario() -> tuple[bool, dict[str, Any], list[np.ndarray]]:
        async with triton_aio.InferenceServerClient(target) as c:
            ready = await c.is_model_ready(TINY)
            metadata = await c.get_model_metadata(TINY, as_json=True)
            batches = [IMAGES[i : i + 1] for i in range(3)]
            results = await asyncio.gather(*(c.infer(TINY, [image_input(b)]) for b in batches))  # one batch
            return ready, metadata, [r.as_numpy("lengths") for r in results]

    ready, metadata, lengths = asyncio.run(scenario())
    assert ready and metadata["name"] == TINY
    want = run_graph(model_repository, TINY, "capsnet.onnx", {"image": IMAGES})["lengths"]
    np.testing.assert_allclose(np.concatenate(lengths), want, atol=1e-5)


@pytest.mark.parametrize(
    ("call", "status", "message"),
    [
        (
            lambda c: c.infer("nope", [image_input()]),
            "StatusCode.NOT_FOUND",
            "model 'nope' not found; served models: ['tiny', 'tiny-em', 'tiny-nodecoder']",
        ),
        (
            lambda c: c.get_model_metadata(TINY, "9"),
            "StatusCode.NOT_FOUND",
            "model 'tiny' has no version '9' (versions: ['1'])",
        ),
        (
            lambda c: c.is_model_ready("nope"),
            "StatusCode.NOT_FOUND",
            "model 'nope' not found; served models: ['tiny', 'tiny-em', 'tiny-nodecoder']",
        ),
        (
            lambda c: c.infer(TINY, [image_input(IMAGES[:, :, :27])]),
            "StatusCode.INVALID_ARGUMENT",
            "input 'image' has shape [3, 1, 27, 28]; model 'tiny' expects [-1, 1, 28, 28]",
        ),
        (
            lambda c: c.infer(TINY, [image_input(IMAGES.astype(np.float64), "FP64")]),
            "StatusCode.INVALID_ARGUMENT",
            "input 'image' has datatype 'FP64'; model 'tiny' expects FP32",
        ),
        (
            lambda c: c.infer(TINY, [image_input(np.full((1, 1, 28, 28), np.nan, np.float32))]),
            "StatusCode.INVALID_ARGUMENT",
            "input 'image' contains NaN or infinite values",
        ),
        (
            lambda c: c.infer(TINY, [image_input()], outputs=[triton.InferRequestedOutput("logits")]),
            "StatusCode.INVALID_ARGUMENT",
            "unknown output 'logits'; model 'tiny' has outputs ['lengths', 'poses', 'reconstruction', 'explanation']",
        ),
        (
            lambda c: c.infer(TINY, []),
            "StatusCode.INVALID_ARGUMENT",
            "missing input 'image' for model 'tiny'",
        ),
        (
            lambda c: c.infer(TINY, [image_input(rng.random((MAX_IMAGES + 1, 1, 28, 28), dtype=np.float32))]),
            "StatusCode.RESOURCE_EXHAUSTED",
            f"too many images: batch of {MAX_IMAGES + 1}, the limit is {MAX_IMAGES} (CAPSNET_MAX_IMAGES_PER_REQUEST)",
        ),
    ],
    ids=["model", "version", "ready", "shape", "datatype", "nan", "output", "no-input", "too-many-images"],
)
def test_errors_have_the_right_status_and_message(
    client: triton.InferenceServerClient, call: Callable[[Any], Any], status: str, message: str
) -> None:
    assert error_of(lambda: call(client)) == (status, message)


def test_message_over_the_size_limit_is_resource_exhausted(client: triton.InferenceServerClient) -> None:
    images = rng.random((32, 1, 28, 28), dtype=np.float32)  # 100 KB of raw tensor
    status, message = error_of(lambda: client.infer(TINY, [image_input(images)]))
    assert status == "StatusCode.RESOURCE_EXHAUSTED"
    assert f"vs. {MAX_BYTES})" in message, message  # grpc's own "Received message larger than max (… vs. …)"


@pytest.mark.parametrize(
    ("mutate", "message"),
    [
        (
            lambda r: r.raw_input_contents.append(b"\0" * 100),
            "input 'image' has 100 bytes of raw data; shape [3, 1, 28, 28] of FP32 needs 9408",
        ),
        (
            lambda r: r.raw_input_contents.extend([IMAGES.tobytes(), b""]),
            "raw_input_contents has 2 entries for 1 inputs: send one per input, in order",
        ),
        (
            lambda r: r.inputs[0].contents.Clear(),
            "input 'image' has no data: send its values in contents.fp32_contents or its bytes in raw_input_contents",
        ),
        (
            lambda r: r.inputs[0].contents.fp32_contents.append(0.5),
            "input 'image' has 2353 values; shape [3, 1, 28, 28] needs 2352",
        ),
    ],
    ids=["raw-bytes", "raw-count", "no-data", "typed-count"],
)
def test_tensor_data_errors(target: str, mutate: Callable[[Any], None], message: str) -> None:
    request = typed_request()
    if message.startswith("input 'image' has 100 bytes"):
        request.inputs[0].ClearField("contents")
    mutate(request)
    with pytest.raises(grpc.RpcError) as e:
        stub(target).ModelInfer(request)
    assert (e.value.code(), e.value.details()) == (grpc.StatusCode.INVALID_ARGUMENT, message)


def test_both_contents_and_raw_contents_are_refused(target: str) -> None:
    request = typed_request()
    request.raw_input_contents.append(IMAGES.tobytes())
    with pytest.raises(grpc.RpcError) as e:
        stub(target).ModelInfer(request)
    assert e.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert (
        e.value.details() == "inputs carry both contents and raw_input_contents: send each tensor's data one way only"
    )


def test_malformed_messages_are_invalid_argument_and_the_server_survives(
    target: str, client: triton.InferenceServerClient
) -> None:
    """Random bytes and bit-flipped valid requests: a clear status for each, never INTERNAL or UNKNOWN."""
    valid = typed_request(IMAGES[:1]).SerializeToString()
    fuzz = np.random.default_rng(7)
    messages = [fuzz.bytes(int(n)) for n in fuzz.integers(1, 400, 40)]
    for _ in range(60):
        flipped = bytearray(valid)
        for i in fuzz.integers(0, len(flipped), 3):
            flipped[i] ^= 1 << int(fuzz.integers(0, 8))
        messages.append(bytes(flipped))
    codes = set()
    with grpc.insecure_channel(target) as channel:
        call = channel.unary_unary(INFER)  # bytes in, bytes out
        for data in messages:
            try:
                call(data, timeout=10)
                codes.add(grpc.StatusCode.OK)
            except grpc.RpcError as e:
                codes.add(e.code())
                assert e.details() and "Traceback" not in e.details()
        with pytest.raises(grpc.RpcError) as e:
            call(b"\xff\xff\xff", timeout=10)
    assert e.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert e.value.details().startswith("malformed ModelInfer request message: ")
    assert codes <= {
        grpc.StatusCode.OK,
        grpc.StatusCode.INVALID_ARGUMENT,
        grpc.StatusCode.NOT_FOUND,
        grpc.StatusCode.RESOURCE_EXHAUSTED,
    }, codes
    assert client.is_server_live() and client.infer(TINY, [image_input()]).as_numpy("lengths").shape == (3, 10)


def test_health_service(target: str) -> None:
    with grpc.insecure_channel(target) as channel:
        check = health_pb2_grpc.HealthStub(channel).Check
        for service in ("", "inference.GRPCInferenceService", "liveness"):
            assert (
                check(health_pb2.HealthCheckRequest(service=service)).status == health_pb2.HealthCheckResponse.SERVING
            )
        with pytest.raises(grpc.RpcError) as e:
            check(health_pb2.HealthCheckRequest(service="nope"))
    assert e.value.code() == grpc.StatusCode.NOT_FOUND


def test_metrics_count_grpc_calls_by_protocol(model_repository: Path) -> None:
    port = free_port()
    with TestClient(create_app(service_settings(model_repository, grpc_port=port))) as http:
        wait_ready(http)
        with triton.InferenceServerClient(f"127.0.0.1:{port}") as c:
            c.infer(TINY, [image_input()])
            c.infer(TINY, [image_input()])
            error_of(lambda: c.infer("nope", [image_input()]))
        http.get("/v2/health/live")
        text = http.get("/metrics").text
    labels = 'method="POST",protocol="grpc",route="/inference.GRPCInferenceService/ModelInfer"'
    assert f'capsnet_http_requests_total{{{labels},status="OK"}} 2.0' in text
    assert f'capsnet_http_requests_total{{{labels},status="NOT_FOUND"}} 1.0' in text
    assert f"capsnet_http_request_duration_seconds_count{{{labels}}} 3.0" in text
    assert 'capsnet_http_requests_total{method="GET",protocol="http",route="/v2/health/live",status="200"} 1.0' in text
    assert 'capsnet_inferences_total{graph="capsnet",model="tiny",version="1"} 6.0' in text  # the same batcher as REST


def test_both_front_ends_count_their_requests_in_progress(
    model_repository: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """What the batchers read to tell a lone request from one among others (`RunSlots.activity`)."""
    seen: list[int] = []
    execute = DynamicBatcher._execute

    def spy(self: DynamicBatcher, live: list[Any]) -> Any:
        seen.append(self._slots.activity.count)
        return execute(self, live)

    monkeypatch.setattr(DynamicBatcher, "_execute", spy)
    port = free_port()
    app = create_app(service_settings(model_repository, grpc_port=port))
    with TestClient(app) as http:
        wait_ready(http)
        activity = app.state.registry.slots.activity
        with triton.InferenceServerClient(f"127.0.0.1:{port}") as c:
            c.infer(TINY, [image_input()])
        assert http.post(f"/v2/models/{TINY}/infer", json=v2_body()).status_code == 200
        assert seen == [1, 1] and activity.count == 0
        with triton.InferenceServerClient(f"127.0.0.1:{port}") as c:
            error_of(lambda: c.infer("nope", [image_input()]))
        assert http.get("/v2/health/live").status_code == 200
        too_large = b"x" * (app.state.settings.max_body_bytes + 1)
        assert http.post(f"/v1/models/{TINY}/classify", content=too_large).status_code == 413
        assert http.post(f"/v1/models/{TINY}/classify", content=b"{", headers=JSON).status_code == 400
        assert activity.count == 0  # errors and other routes leave nothing counted


JSON = {"content-type": "application/json"}


def v2_body() -> dict[str, Any]:
    return {
        "inputs": [{"name": "image", "shape": list(IMAGES.shape), "datatype": "FP32", "data": IMAGES.ravel().tolist()}]
    }


def test_full_queue_is_unavailable_with_a_retry_hint(model_repository: Path) -> None:
    """A 3-image batch holds the batcher open for 3 s; a 2-image request cannot join it and waits in the queue
    (size 1); the next request finds the queue full."""

    async def scenario(target: str) -> tuple[grpc.aio.AioRpcError, list[Any]]:
        async with grpc.aio.insecure_channel(target) as channel:
            infer = protocol.client_method(channel, "ModelInfer")

            def request(n: int) -> Any:
                return protocol.ModelInferRequest(
                    model_name=TINY,
                    inputs=[{"name": "image", "datatype": "FP32", "shape": [n, 1, 28, 28]}],
                    raw_input_contents=[IMAGES[:1].tobytes() * n],
                )

            held = asyncio.ensure_future(infer(request(3)))
            await asyncio.sleep(0.5)
            queued = asyncio.ensure_future(infer(request(2)))
            await asyncio.sleep(0.5)
            with pytest.raises(grpc.aio.AioRpcError) as e:
                await infer(request(1))
            return e.value, await asyncio.gather(held, queued)

    with grpc_app(model_repository, max_batch_size=4, max_queue_size=1, max_queue_delay_ms=3000) as target:
        error, answered = asyncio.run(scenario(target))
    assert error.code() == grpc.StatusCode.UNAVAILABLE
    assert error.details() == ("model 'tiny' has 1 requests queued (limit 1, CAPSNET_MAX_QUEUE_SIZE); retry later")
    assert ("retry-after", "1") in tuple(error.trailing_metadata() or ())
    assert [r.outputs[0].shape[0] for r in answered] == [3, 2]


def test_bearer_token_guards_inference_not_health(model_repository: Path) -> None:
    with grpc_app(model_repository, check_token=lambda token: token == "s3cret") as target:
        with triton.InferenceServerClient(target) as c:
            for headers in (None, {"authorization": "Bearer wrong"}, {"authorization": "s3cret"}):
                assert error_of(lambda h=headers: c.infer(TINY, [image_input()], headers=h)) == (
                    "StatusCode.UNAUTHENTICATED",
                    "missing or invalid bearer token: send 'authorization: Bearer <token>'",
                )
            assert error_of(lambda: c.get_server_metadata())[0] == "StatusCode.UNAUTHENTICATED"
            assert c.is_server_live() and c.is_server_ready()  # the protocol's health, open as REST's /v2/health/*
            assert error_of(lambda: c.is_model_ready(TINY))[0] == "StatusCode.UNAUTHENTICATED"
            good = {"authorization": "Bearer s3cret"}
            assert c.infer(TINY, [image_input()], headers=good).as_numpy("lengths").shape == (3, 10)
            assert c.is_server_ready(headers=good)
        with grpc.insecure_channel(target) as channel:
            response = health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest())
        assert response.status == health_pb2.HealthCheckResponse.SERVING


def test_the_token_file_guards_grpc_like_http(model_repository: Path, tmp_path: Path) -> None:
    tokens = tmp_path / "tokens"
    tokens.write_text("# the HTTP and gRPC token\nfile-token-1\n")
    with grpc_app(model_repository, auth_tokens_file=tokens) as target, triton.InferenceServerClient(target) as c:
        assert error_of(lambda: c.infer(TINY, [image_input()]))[0] == "StatusCode.UNAUTHENTICATED"
        good = {"authorization": "Bearer file-token-1"}
        assert c.infer(TINY, [image_input()], headers=good).as_numpy("lengths").shape == (3, 10)


def test_committed_descriptor_is_the_compiled_proto(tmp_path: Path) -> None:
    """`make proto` was run after the last edit of the .proto (the service loads the descriptor, not the .proto)."""
    from google.protobuf import descriptor_pb2
    from grpc_tools import protoc

    out = tmp_path / "compiled.binpb"
    args = ["protoc", f"-I{protocol.PROTO_FILE.parent}", f"--descriptor_set_out={out}", str(protocol.PROTO_FILE)]
    assert protoc.main(args) == 0
    compiled = descriptor_pb2.FileDescriptorSet.FromString(out.read_bytes())
    committed = descriptor_pb2.FileDescriptorSet.FromString(protocol.DESCRIPTOR_FILE.read_bytes())
    assert compiled == committed, "service/grpc/grpc_predict_v2.binpb is stale: run `make proto`"


def test_messages_match_the_stock_client_field_by_field() -> None:
    """Every field of our messages has the number, type and cardinality of tritonclient's (the same protocol)."""

    def fields(descriptor: Any, prefix: str = "") -> dict[str, tuple[int, int, bool]]:
        found = {f"{prefix}{f.name}": (f.number, f.type, f.is_repeated) for f in descriptor.fields}
        for nested in descriptor.nested_types:
            found.update(fields(nested, f"{prefix}{nested.name}."))
        return found

    for method in protocol.SERVICE.methods:
        theirs = service_pb2.DESCRIPTOR.services_by_name["GRPCInferenceService"].methods_by_name[method.name]
        for ours, stock in ((method.input_type, theirs.input_type), (method.output_type, theirs.output_type)):
            assert ours.full_name == stock.full_name
            mine = fields(ours)
            assert mine == {k: v for k, v in fields(stock).items() if k in mine}, ours.full_name


def test_grpc_serves_while_the_http_event_loop_is_blocked(model_repository: Path) -> None:
    """gRPC has threads of its own: with the HTTP event loop held, calls are still answered and images still run
    (through the same batcher, which needs no event loop either)."""
    port = free_port()
    with TestClient(create_app(service_settings(model_repository, grpc_port=port))) as http:
        wait_ready(http)
        held, release = threading.Event(), threading.Event()

        def hold_the_loop() -> None:  # runs on the app's event loop thread, and blocks it
            held.set()
            release.wait(60)

        holder = threading.Thread(target=http.portal.call, args=(hold_the_loop,))
        holder.start()
        try:
            assert held.wait(10)
            with triton.InferenceServerClient(f"127.0.0.1:{port}") as c:
                assert c.is_server_ready(client_timeout=20)
                result = c.infer(TINY, [image_input()], client_timeout=20)
        finally:
            release.set()
            holder.join()
        assert result.as_numpy("lengths").shape == (3, 10)
        assert 'capsnet_inferences_total{graph="capsnet",model="tiny",version="1"} 3.0' in http.get("/metrics").text


def test_a_call_that_ends_while_queued_is_not_run(model_repository: Path) -> None:
    """A call whose deadline passes while its image waits for company in a batch is answered DEADLINE_EXCEEDED,
    and its image is left out of the batch; the next call runs."""
    port = free_port()
    settings = service_settings(model_repository, grpc_port=port, max_batch_size=4, max_queue_delay_ms=1500)
    with TestClient(create_app(settings)) as http:
        wait_ready(http)
        with triton.InferenceServerClient(f"127.0.0.1:{port}") as c:
            status, _ = error_of(lambda: c.infer(TINY, [image_input(IMAGES[:1])], client_timeout=0.3))
            assert status == "StatusCode.DEADLINE_EXCEEDED"
            assert c.infer(TINY, [image_input(IMAGES[:2])]).as_numpy("lengths").shape == (2, 10)
        text = http.get("/metrics").text
    # the second call's images only
    assert 'capsnet_inferences_total{graph="capsnet",model="tiny",version="1"} 2.0' in text
    assert 'capsnet_batch_size_count{graph="capsnet",model="tiny",version="1"} 1.0' in text

"""The model repository extension over gRPC, driven by the stock tritonclient.grpc."""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import grpc
import pytest
import tritonclient.grpc as triton
from fastapi.testclient import TestClient
from grpc_health.v1 import health_pb2, health_pb2_grpc
from tritonclient.utils import InferenceServerException

from service.main import create_app
from tests.service.conftest import EM_LIKE, TINY, service_settings, wait_ready
from tests.service.live_server import free_port


@contextmanager
def grpc_target(repository: Path, **settings: Any) -> Iterator[str]:
    port = free_port()
    with TestClient(create_app(service_settings(repository, grpc_port=port, **settings))) as client:
        wait_ready(client)
        yield f"127.0.0.1:{port}"


def index(client: triton.InferenceServerClient, **kwargs: Any) -> list[tuple[str, str, str]]:
    response = client.get_model_repository_index(as_json=True, **kwargs)
    return [(m["name"], m.get("version", ""), m["state"]) for m in response.get("models", [])]


def failure(call: Any) -> tuple[Any, str]:
    with pytest.raises(InferenceServerException) as info:
        call()
    return info.value.status(), str(info.value.message())


def test_index_load_and_unload_over_grpc(model_repository: Path, tmp_path: Path) -> None:
    shutil.copytree(model_repository / TINY, tmp_path / TINY / "1")
    shutil.copytree(model_repository / EM_LIKE, tmp_path / EM_LIKE)
    with (
        grpc_target(tmp_path, model_control="explicit", load_models=[TINY]) as target,
        triton.InferenceServerClient(target) as client,
    ):
        assert index(client) == [(TINY, "1", "READY"), (EM_LIKE, "", "UNAVAILABLE")]
        client.load_model(EM_LIKE)
        assert client.is_model_ready(EM_LIKE)
        assert index(client, headers=None) == [(TINY, "1", "READY"), (EM_LIKE, "3", "READY")]
        client.unload_model(EM_LIKE)
        assert not _ready_or_missing(client, EM_LIKE)
        shutil.copytree(model_repository / TINY, tmp_path / TINY / "2")
        client.load_model(TINY)
        assert client.get_model_metadata(TINY, as_json=True)["versions"] == ["2"]
        health = health_pb2_grpc.HealthStub(grpc.insecure_channel(target))
        assert health.Check(health_pb2.HealthCheckRequest(service="")).status == health_pb2.HealthCheckResponse.SERVING
        client.unload_model(TINY)  # the default model, and no other serves: the server is no longer ready
        assert health.Check(health_pb2.HealthCheckRequest()).status == health_pb2.HealthCheckResponse.NOT_SERVING
        client.load_model(TINY)
        assert health.Check(health_pb2.HealthCheckRequest()).status == health_pb2.HealthCheckResponse.SERVING
        status, message = failure(lambda: client.load_model("../etc"))
        assert status == "StatusCode.INVALID_ARGUMENT" and message.startswith("'../etc' is not a model name")
        status, message = failure(lambda: client.load_model("nope"))
        assert (status, message) == ("StatusCode.NOT_FOUND", "no model folder 'nope' in the model repository")


def _ready_or_missing(client: triton.InferenceServerClient, name: str) -> bool:
    """is_model_ready over gRPC raises NOT_FOUND for a model that is not loaded: that is "not ready" too."""
    try:
        return bool(client.is_model_ready(name))
    except InferenceServerException as e:
        assert e.status() == "StatusCode.NOT_FOUND"
        return False


def test_repository_calls_need_the_admin_scope_and_a_control_mode(model_repository: Path, tmp_path: Path) -> None:
    tokens = tmp_path / "tokens"
    tokens.write_text("reader\nboss admin\n")
    with (
        grpc_target(model_repository, model_control="poll", auth_tokens_file=tokens) as target,
        triton.InferenceServerClient(target) as client,
    ):
        for token, expected in ((None, "UNAUTHENTICATED"), ("reader", "PERMISSION_DENIED")):
            headers = {"authorization": f"Bearer {token}"} if token else None
            status, _ = failure(lambda h=headers: client.get_model_repository_index(headers=h))
            assert status == f"StatusCode.{expected}"
        boss = {"authorization": "Bearer boss"}
        assert (TINY, "1", "READY") in index(client, headers=boss)
        status, message = failure(lambda: client.unload_model(TINY, headers=boss))  # poll: the folder decides
        assert status == "StatusCode.PERMISSION_DENIED" and "CAPSNET_MODEL_CONTROL=explicit" in message
        assert client.is_model_ready(TINY, headers={"authorization": "Bearer reader"})

"""Model repository, cards, checksums, execution providers, readiness and broken models."""

from __future__ import annotations

import json
import shutil
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from fastapi.testclient import TestClient

from service.main import create_app
from service.runtime import model_dir
from service.runtime.card import CardError, parse_card
from service.runtime.repository import scan_repository
from tests.service.conftest import EM_LIKE, TINY, digit_image, png_bytes, service_settings


def tiny_card(model_repository: Path) -> dict[str, Any]:
    card: dict[str, Any] = json.loads((model_repository / TINY / "model.json").read_text())
    return card


def test_exported_card_parses(model_repository: Path) -> None:
    card = parse_card(tiny_card(model_repository))
    assert card.image_shape == (1, 28, 28) and card.image_size == (28, 28)
    assert card.pose_size == 8 and card.graph_files == ["capsnet.onnx", "decoder.onnx"]


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"format_version": 2}, "format_version 2 is not supported"),
        ({"scores": {"output": "nothing", "kind": "capsule_length"}}, "no output named 'nothing'"),
        ({"pose_shape": [4, 4]}, "poses output shape [-1, 10, 8] != [-1, 10, *pose_shape [4, 4]]"),
        ({"classes": ["a", "b"]}, "scores output 'lengths' must have role 'scores' and shape [-1, 2]"),
        ({"name": "Bad Name"}, "name: String should match pattern"),
        (
            {"input": {"name": "image", "shape": [-1, 784], "datatype": "FP32"}},
            "input must be FP32 images with a dynamic batch dimension ([-1, C, H, W])",
        ),
    ],
)
def test_inconsistent_cards_are_rejected(model_repository: Path, change: dict[str, Any], message: str) -> None:
    with pytest.raises(CardError, match="invalid model card") as info:
        parse_card({**tiny_card(model_repository), **change})
    assert message in str(info.value)


def test_scan_reports_each_broken_model(broken_repository: Path) -> None:
    found = {m.name: m for m in scan_repository(broken_repository)}
    assert sorted(found) == ["altered", "missing", TINY, "unreadable"]
    assert found[TINY].error is None and found[TINY].card is not None
    assert found["altered"].error is not None and found["altered"].error.startswith(
        "capsnet.onnx sha256 mismatch: file "
    )
    assert (
        found["missing"].error == f"decoder.onnx is listed in the card but missing from {broken_repository / 'missing'}"
    )
    assert found["unreadable"].error is not None and found["unreadable"].error.startswith("cannot read model.json: ")


def test_missing_repository_is_an_error(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError, match="is not a directory"):
        scan_repository(tmp_path / "absent")


def test_unlisted_graph_cannot_be_verified(model_repository: Path, tmp_path: Path) -> None:
    shutil.copytree(model_repository / TINY, tmp_path / TINY)
    card = tiny_card(model_repository)
    del card["files"]["decoder.onnx"]
    (tmp_path / TINY / "model.json").write_text(json.dumps(card))
    (entry,) = scan_repository(tmp_path)
    assert entry.error == "decoder.onnx is not listed in the card's files, so its checksum cannot be verified"


def test_broken_models_are_reported_while_the_others_serve(make_client: Any, broken_repository: Path) -> None:
    client = make_client(broken_repository)
    models = {m["name"]: m for m in client.get("/v1/models").json()["models"]}
    assert models[TINY]["ready"] is True
    assert models["altered"]["state"] == "failed" and "sha256 mismatch" in models["altered"]["error"]
    ready = client.get("/health/ready")
    assert ready.status_code == 200
    assert ready.json()["models"] == {"altered": "failed", "missing": "failed", TINY: "ready", "unreadable": "failed"}
    assert client.get("/v2/health/ready").status_code == 400  # the protocol's readiness: every model
    assert client.get("/v2/models/altered/ready").status_code == 400
    assert client.get(f"/v2/models/{TINY}/ready").status_code == 200
    r = client.post("/v1/models/altered/classify", files=[("files", ("a.png", png_bytes(digit_image()), "image/png"))])
    assert r.status_code == 503 and r.headers["retry-after"] == "30"
    assert r.json()["error"].startswith("model 'altered' is not available: capsnet.onnx sha256 mismatch")
    r = client.post("/v2/models/missing/infer", json={"inputs": []})
    assert r.status_code == 503 and set(r.json()) == {"error"}
    metrics = client.get("/metrics").text
    assert "capsnet_models_loaded 1.0" in metrics
    assert 'capsnet_model_ready{model="altered",version="1"} 0.0' in metrics


def test_not_ready_until_loaded(model_repository: Path) -> None:
    client = TestClient(create_app(service_settings(model_repository)))  # lifespan not started: nothing loaded
    r = client.get("/health/ready")
    assert (r.status_code, r.json()) == (503, {"ready": False, "models": {}})
    assert client.get("/health/live").status_code == 200
    assert client.get("/v2/health/live").status_code == 200
    assert client.get("/v2/health/ready").status_code == 400
    r = client.post("/v1/classify", json={"images": []})
    assert r.status_code == 503 and r.headers["retry-after"] == "5"
    assert r.json() == {"error": "models are still loading", "type": "model_not_ready"}


def test_empty_repository_is_not_ready(make_client: Any, tmp_path: Path) -> None:
    client = make_client(tmp_path)
    r = client.get("/health/ready")
    assert r.status_code == 503
    assert r.json()["error"] == f"no model directories (with model.json) in {tmp_path}"
    r = client.post("/v1/classify", json={"images": []})
    assert r.json() == {"error": "no default model: no model in the repository is ready", "type": "model_not_found"}


def test_provider_choice(monkeypatch: pytest.MonkeyPatch) -> None:
    assert model_dir.requested_providers("cpu") == [model_dir.CPU]
    monkeypatch.setattr(model_dir, "gpu_visible", lambda: False)
    assert model_dir.requested_providers("auto") == [model_dir.CPU]
    monkeypatch.setattr(model_dir, "gpu_visible", lambda: True)
    monkeypatch.setattr(model_dir.ort, "get_available_providers", lambda: [model_dir.CUDA, model_dir.CPU])
    assert model_dir.requested_providers("auto") == [model_dir.CUDA, model_dir.CPU]
    monkeypatch.setattr(model_dir.ort, "get_available_providers", lambda: [model_dir.CPU])
    assert model_dir.requested_providers("auto") == [model_dir.CPU]
    with pytest.raises(model_dir.ProviderUnavailable, match="CAPSNET_PROVIDER=cuda but this onnxruntime build"):
        model_dir.requested_providers("cuda")


@pytest.mark.skipif(model_dir.gpu_visible(), reason="this machine has a GPU: forcing CUDA would work")
def test_forced_cuda_without_a_gpu_fails_the_model_clearly(make_client: Any, model_repository: Path) -> None:
    client = make_client(model_repository, provider="cuda")
    models = client.get("/v1/models").json()["models"]
    assert all(m["state"] == "failed" for m in models)
    assert all("CAPSNET_PROVIDER=cuda" in m["error"] for m in models)
    assert client.get("/health/ready").status_code == 503


def test_parallel_runs_use_single_thread_sessions_with_the_same_outputs(
    make_client: Any, model_repository: Path
) -> None:
    serial = make_client(model_repository, intra_op_threads=2, parallel_runs=1).app.state.registry.get(TINY)
    parallel = make_client(model_repository, intra_op_threads=2).app.state.registry.get(TINY)
    assert not serial._narrow and set(parallel._narrow) == {"capsnet", "decoder"}
    images = np.random.default_rng(0).random((24, 1, 28, 28), dtype=np.float32)
    expected = serial.infer_blocking(images)
    narrow = parallel._narrow["capsnet"]({"image": images})
    with ThreadPoolExecutor(8) as pool:  # under load: wide and narrow runs, batched in any grouping
        rows = list(pool.map(lambda i: parallel.infer_blocking(images[i : i + 1]), range(len(images))))
    for name, want in expected.items():
        np.testing.assert_allclose(narrow[name], want, rtol=1e-5, atol=1e-6)
        np.testing.assert_allclose(np.concatenate([r[name] for r in rows]), want, rtol=1e-5, atol=1e-6)


def test_one_intra_op_thread_needs_no_second_session(make_client: Any, model_repository: Path) -> None:
    assert not make_client(model_repository).app.state.registry.get(TINY)._narrow


def test_the_card_can_lower_the_batch_size_never_raise_it(make_client: Any, model_repository: Path) -> None:
    registry = make_client(model_repository).app.state.registry  # CAPSNET_MAX_BATCH_SIZE 8 in the tests
    assert registry.get(EM_LIKE).max_batch_size == 1  # its card's serving.max_batch_size
    assert registry.get(TINY).max_batch_size == 8  # no serving hints: the service's
    assert make_client(model_repository, max_batch_size=1).app.state.registry.get(TINY).max_batch_size == 1


def test_serving_hints_are_checked(model_repository: Path) -> None:
    card = tiny_card(model_repository)
    with pytest.raises(CardError, match="max_batch_size"):
        parse_card({**card, "serving": {"max_batch_size": 0}})
    assert parse_card({**card, "serving": {"max_batch_size": 4}}).serving.max_batch_size == 4  # type: ignore[union-attr]

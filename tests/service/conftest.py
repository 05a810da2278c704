"""Service fixtures: a tiny model repository (exported with training.export.exporter) and clients of the app."""

from __future__ import annotations

import hashlib
import io
import json
import shutil
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from fastapi.testclient import TestClient
from PIL import Image

from service.core.config import Settings
from service.main import create_app

TINY = "tiny"  # dynamic routing, with decoder
NO_DECODER = "tiny-nodecoder"  # dynamic routing, use_decoder=False: the card's decoder is null
EM_LIKE = "tiny-em"  # EM-shaped outputs: activations (N, 10), poses (N, 10, 4, 4), no decoder
TINY_36 = "tiny-36"  # dynamic routing on 36×36 inputs: its card's input shape is [-1, 1, 36, 36]


def export_tiny(out_dir: Path, name: str, **overrides: Any) -> None:
    import torch

    from model.capsnet import CapsNet
    from model.config import CapsNetConfig
    from training.export.exporter import export_module

    torch.manual_seed(0)
    cfg = CapsNetConfig.tiny(**overrides)
    export_module(CapsNet(cfg).eval(), "dynamic", cfg.to_dict(), out_dir / name, name=name, torchscript=False)


def sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def write_em_like(out_dir: Path, name: str = EM_LIKE) -> None:
    """A stand-in with the EM model's interface (docs/model-card.md): two linear maps of the image, no decoder."""
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(0)
    w_act = numpy_helper.from_array(rng.normal(0, 0.05, (784, 10)).astype(np.float32), "w_act")
    w_pose = numpy_helper.from_array(rng.normal(0, 0.05, (784, 160)).astype(np.float32), "w_pose")
    flat_shape = numpy_helper.from_array(np.array([-1, 784], np.int64), "flat_shape")
    pose_shape = numpy_helper.from_array(np.array([-1, 10, 4, 4], np.int64), "pose_shape")
    nodes = [
        helper.make_node("Reshape", ["image", "flat_shape"], ["flat"]),
        helper.make_node("MatMul", ["flat", "w_act"], ["logits"]),
        helper.make_node("Sigmoid", ["logits"], ["activations"]),
        helper.make_node("MatMul", ["flat", "w_pose"], ["pose_flat"]),
        helper.make_node("Reshape", ["pose_flat", "pose_shape"], ["poses"]),
    ]
    graph = helper.make_graph(
        nodes,
        "em_like",
        [helper.make_tensor_value_info("image", TensorProto.FLOAT, ["N", 1, 28, 28])],
        [
            helper.make_tensor_value_info("activations", TensorProto.FLOAT, ["N", 10]),
            helper.make_tensor_value_info("poses", TensorProto.FLOAT, ["N", 10, 4, 4]),
        ],
        initializer=[w_act, w_pose, flat_shape, pose_shape],
    )
    proto = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)])
    proto.ir_version = 9
    onnx.checker.check_model(proto)
    directory = out_dir / name
    directory.mkdir(parents=True)
    onnx.save(proto, directory / "capsnet.onnx")
    card = {
        "format_version": 1,
        "name": name,
        "version": "3",
        "description": "EM-shaped test stand-in",
        "architecture": "em",
        "routing": {"algorithm": "em", "variant": None, "iterations": 3},
        "input": {"name": "image", "shape": [-1, 1, 28, 28], "datatype": "FP32", "range": [0.0, 1.0]},
        "classes": [str(i) for i in range(10)],
        "outputs": [
            {"name": "activations", "shape": [-1, 10], "datatype": "FP32", "role": "scores", "description": ""},
            {"name": "poses", "shape": [-1, 10, 4, 4], "datatype": "FP32", "role": "poses", "description": ""},
        ],
        "scores": {"output": "activations", "kind": "activation"},
        "pose_shape": [4, 4],
        "decoder": None,
        "serving": {"max_batch_size": 1, "why": "as the EM export writes"},
        "metrics": {"mnist_test_error": None},
        "files": {
            "capsnet.onnx": {
                "sha256": sha256(directory / "capsnet.onnx"),
                "bytes": (directory / "capsnet.onnx").stat().st_size,
            }
        },
    }
    (directory / "model.json").write_text(json.dumps(card, indent=2))


@pytest.fixture(scope="session")
def model_repository(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """tiny (with decoder), tiny-nodecoder and tiny-em, every one valid."""
    root = tmp_path_factory.mktemp("repository")
    export_tiny(root, TINY)
    export_tiny(root, NO_DECODER, use_decoder=False)
    write_em_like(root)
    return root


@pytest.fixture(scope="session")
def sized_repository(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """tiny-36 alone: a model whose input is not MNIST's 28×28."""
    root = tmp_path_factory.mktemp("sized")
    export_tiny(root, TINY_36, image_size=36)
    return root


@pytest.fixture(scope="session")
def broken_repository(model_repository: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """tiny (good) next to: a graph altered after export, a missing file, an unreadable card."""
    root = tmp_path_factory.mktemp("broken")
    shutil.copytree(model_repository / TINY, root / TINY)
    shutil.copytree(model_repository / TINY, root / "altered")
    card = json.loads((root / "altered" / "model.json").read_text())
    card["name"] = "altered"
    (root / "altered" / "model.json").write_text(json.dumps(card))
    graph = root / "altered" / "capsnet.onnx"
    data = bytearray(graph.read_bytes())
    data[-1] ^= 0xFF
    graph.write_bytes(bytes(data))
    shutil.copytree(model_repository / TINY, root / "missing")
    (root / "missing" / "model.json").write_text(json.dumps({**card, "name": "missing"}))
    (root / "missing" / "decoder.onnx").unlink()
    (root / "unreadable").mkdir()
    (root / "unreadable" / "model.json").write_text("{not json")
    return root


def service_settings(repository: Path, **overrides: Any) -> Settings:
    base: dict[str, Any] = dict(
        model_repository=repository,
        intra_op_threads=1,
        warmup_runs=1,
        max_batch_size=8,
        default_model=None,
        provider="cpu",
        grpc_port=0,  # tests that speak gRPC ask for a free port
    )
    base.update(overrides)
    return Settings(**base)


def wait_ready(client: TestClient, timeout_s: float = 60.0) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if client.app.state.registry.started:  # type: ignore[attr-defined]
            return
        time.sleep(0.05)
    raise TimeoutError("models did not load")


@pytest.fixture
def make_client() -> Iterator[Any]:
    """make_client(repository, **settings) -> a started TestClient whose models have loaded."""
    stack: list[TestClient] = []

    def make(repository: Path, **overrides: Any) -> TestClient:
        client = TestClient(create_app(service_settings(repository, **overrides)), raise_server_exceptions=False)
        client.__enter__()
        stack.append(client)
        wait_ready(client)
        return client

    yield make
    for client in reversed(stack):
        client.__exit__(None, None, None)


@pytest.fixture(scope="session")
def client(model_repository: Path) -> Iterator[TestClient]:
    """One app over the valid repository, shared by the tests that do not change settings."""
    with TestClient(create_app(service_settings(model_repository)), raise_server_exceptions=False) as c:
        wait_ready(c)
        yield c


def digit_image(size: int = 28, dark_on_light: bool = False) -> np.ndarray:
    """A uint8 image of a bar-and-hook "7"-ish stroke."""
    a = np.zeros((size, size), np.uint8)
    s = size / 28
    a[int(6 * s) : int(8 * s), int(8 * s) : int(20 * s)] = 255
    for r in range(int(8 * s), int(22 * s)):
        c = int(20 * s - (r - 8 * s) * 0.5)
        a[r, max(c - int(s), 0) : c + int(s) + 1] = 255
    return 255 - a if dark_on_light else a


def png_bytes(array: np.ndarray) -> bytes:
    buffer = io.BytesIO()
    Image.fromarray(array).save(buffer, format="PNG")
    return buffer.getvalue()

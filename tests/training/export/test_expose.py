"""Exposing a tensor the graph already computes as a new output (python -m training.export.expose)."""

from __future__ import annotations

import hashlib
import json
import shutil
from pathlib import Path

import numpy as np
import onnx
import pytest
import torch

from model.capsnet import CapsNet
from model.config import CapsNetConfig
from service.contract import create_session, load_model_dir
from training.export import exporter as export
from training.export import expose
from training.export.exporter import verify_model_dir


@pytest.fixture(scope="module")
def original(tmp_path_factory: pytest.TempPathFactory) -> Path:
    torch.manual_seed(0)
    cfg = CapsNetConfig.tiny()
    out = tmp_path_factory.mktemp("zoo") / "tiny"
    export.export_module(CapsNet(cfg).eval(), "dynamic", cfg.to_dict(), out, name="tiny", torchscript=False)
    return out


def own_copy(original: Path, tmp_path: Path) -> Path:
    copy = tmp_path / "tiny"
    shutil.copytree(original, copy)
    return copy


def first_relu(directory: Path) -> str:
    graph = onnx.load(str(directory / "capsnet.onnx")).graph
    return next(node.output[0] for node in graph.node if node.op_type == "Relu")


def test_the_new_output_is_the_tensor_and_nothing_else_changes(original: Path, tmp_path: Path) -> None:
    directory = own_copy(original, tmp_path)
    before = json.loads((directory / "model.json").read_text())
    images = np.random.default_rng(1).random((3, 1, 28, 28), dtype=np.float32)
    names = [o["name"] for o in before["outputs"]]
    old = create_session(directory / "capsnet.onnx", "cpu").run(names, {"image": images})
    tensor = first_relu(directory)
    assert expose.main([str(directory), "--tensor", tensor, "--name", "parts", "--role", "parts",
                        "--description", "first ReLU"]) == 0  # fmt: skip
    card = json.loads((directory / "model.json").read_text())
    assert card["version"] == str(int(before["version"]) + 1)
    assert card["outputs"][:-1] == before["outputs"] and card["outputs"][-1]["role"] == "parts"
    data = (directory / "capsnet.onnx").read_bytes()
    assert card["files"]["capsnet.onnx"] == {"sha256": hashlib.sha256(data).hexdigest(), "bytes": len(data)}
    assert card["export"]["exposed"][0]["tensor"] == tensor
    assert card["metrics"] == before["metrics"] and card["export"]["parity"] == before["export"]["parity"]
    session = create_session(directory / "capsnet.onnx", "cpu")
    *new, parts = session.run([*names, "parts"], {"image": images})
    for a, b in zip(old, new, strict=True):
        np.testing.assert_array_equal(a, b)
    assert list(parts.shape[1:]) == card["outputs"][-1]["shape"][1:] and parts.min() >= 0  # a ReLU's output
    verify_model_dir(directory)
    assert load_model_dir(directory).card is not None  # the service loads it


def test_a_card_the_service_would_refuse_leaves_the_graph_as_it_was(
    original: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    directory = own_copy(original, tmp_path)
    graph, card = (directory / "capsnet.onnx").read_bytes(), (directory / "model.json").read_text()
    made = expose.exposed_card
    monkeypatch.setattr(expose, "exposed_card", lambda *a: {**made(*a), "classes": []})  # an invalid card
    assert expose.main([str(directory), "--tensor", first_relu(directory), "--name", "parts", "--role", "parts",
                        "--description", "d"]) == 2  # fmt: skip
    assert "invalid model card" in capsys.readouterr().err
    assert (directory / "capsnet.onnx").read_bytes() == graph and (directory / "model.json").read_text() == card
    assert not list(directory.glob("*.exposing.onnx"))


def test_refuses_an_unknown_tensor_or_a_taken_name(
    original: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    directory = own_copy(original, tmp_path)
    card = (directory / "model.json").read_text()
    common = ["--role", "parts", "--description", "d"]
    assert expose.main([str(directory), "--tensor", "no_such_tensor", "--name", "parts", *common]) == 2
    assert "the graph computes no tensor 'no_such_tensor'" in capsys.readouterr().err
    assert expose.main([str(directory), "--tensor", first_relu(directory), "--name", "lengths", *common]) == 2
    assert "already has a tensor or output named 'lengths'" in capsys.readouterr().err
    assert (directory / "model.json").read_text() == card  # nothing written
    assert not list(directory.glob("*.exposing.onnx"))


def test_a_changed_output_is_refused_and_the_graph_kept(original: Path, tmp_path: Path) -> None:
    directory = own_copy(original, tmp_path)
    graph = (directory / "capsnet.onnx").read_bytes()
    proto = onnx.load(str(directory / "capsnet.onnx"))
    broken = expose.expose(proto, first_relu(directory), "parts")
    target = next(n for n in broken.graph.node if "lengths" in n.output)
    target.output[0] = "lengths_changed"  # the old output now comes from a different node
    broken.graph.node.append(onnx.helper.make_node("Neg", ["lengths_changed"], ["lengths"]))
    onnx.save(broken, str(tmp_path / "broken.onnx"))
    images = np.random.default_rng(0).random((2, 1, 28, 28), dtype=np.float32)
    with pytest.raises(expose.ExposeError, match="output 'lengths' changed"):
        expose.check_unchanged(directory / "capsnet.onnx", tmp_path / "broken.onnx", "image", ["lengths"], images)
    assert (directory / "capsnet.onnx").read_bytes() == graph

"""ONNX-only evaluation of a model directory: no torch, the card's scores output, refusal of altered files.

The model directory here is built by hand with onnx.helper (no torch): a linear classifier that reads
the synthetic digits' bar position, with EM-style output names, so only the card says which output scores.
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from service.runtime.model_dir import ModelDirError, load_model_dir
from tests.conftest import REPO_ROOT
from training.data.mnist import load_split
from training.fitting import evaluate
from training.fitting.onnx_eval import evaluate_model_dir

EVAL_KEYS = {"test_error", "test_accuracy", "n", "errors", "per_class_error", "confusion_matrix"}


def bar_classifier() -> onnx.ModelProto:
    """image (N, 1, 28, 28) -> activations (N, 10) = brightness of rows 4+2k..5+2k (the synthetic digits' bar),
    decoy (N, 10) = -activations, and poses (N, 10, 1) = the activations as one-dimensional poses."""
    weight = np.zeros((28, 28, 10), dtype=np.float32)
    for k in range(10):
        weight[4 + 2 * k : 6 + 2 * k, 6:22, k] = 1.0
    nodes = [
        helper.make_node("Flatten", ["image"], ["flat"], axis=1),
        helper.make_node("MatMul", ["flat", "weight"], ["activations"]),
        helper.make_node("Neg", ["activations"], ["decoy"]),
        helper.make_node("Reshape", ["activations", "pose_shape"], ["poses"]),
    ]
    graph = helper.make_graph(
        nodes,
        "bar-classifier",
        [helper.make_tensor_value_info("image", TensorProto.FLOAT, ["N", 1, 28, 28])],
        [
            *(helper.make_tensor_value_info(n, TensorProto.FLOAT, ["N", 10]) for n in ("activations", "decoy")),
            helper.make_tensor_value_info("poses", TensorProto.FLOAT, ["N", 10, 1]),
        ],
        [
            numpy_helper.from_array(weight.reshape(784, 10), "weight"),
            numpy_helper.from_array(np.array([-1, 10, 1], dtype=np.int64), "pose_shape"),
        ],
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)], ir_version=10)


def write_model_dir(root: Path, scores_output: str = "activations") -> Path:
    root.mkdir(parents=True)
    data = bar_classifier().SerializeToString()
    (root / "capsnet.onnx").write_bytes(data)
    card: dict[str, Any] = {
        "format_version": 1,
        "name": root.name,
        "architecture": "em",
        "input": {"name": "image", "shape": [-1, 1, 28, 28], "datatype": "FP32"},
        "classes": [str(k) for k in range(10)],
        "outputs": [
            {"name": "activations", "shape": [-1, 10], "role": "scores"},
            {"name": "decoy", "shape": [-1, 10], "role": "scores"},
            {"name": "poses", "shape": [-1, 10, 1], "role": "poses"},
        ],
        "scores": {"output": scores_output, "kind": "activation"},
        "pose_shape": [1],
        "decoder": None,
        "files": {"capsnet.onnx": {"sha256": hashlib.sha256(data).hexdigest(), "bytes": len(data)}},
    }
    (root / "model.json").write_text(json.dumps(card))
    return root


@pytest.fixture
def model_dir(tmp_path: Path) -> Path:
    return write_model_dir(tmp_path / "bars")


def test_evaluates_with_the_scores_output_named_by_the_card(model_dir: Path, synthetic_mnist: Path) -> None:
    result = evaluate_model_dir(model_dir, load_split(synthetic_mnist, "test"), batch_size=5)
    assert set(result) == EVAL_KEYS | {"model", "evaluated_with", "source"}
    assert result["model"] == "bars" and result["evaluated_with"] == "onnxruntime"
    assert result["n"] == 32 and result["errors"] == 0 and result["test_error"] == 0.0
    assert np.trace(np.array(result["confusion_matrix"])) == 32


def test_the_card_not_the_output_order_chooses_the_scores(tmp_path: Path, synthetic_mnist: Path) -> None:
    decoy = write_model_dir(tmp_path / "decoy", scores_output="decoy")
    result = evaluate_model_dir(decoy, load_split(synthetic_mnist, "test"))
    assert result["test_error"] > 0.5


def test_a_corrupted_model_is_refused(model_dir: Path, synthetic_mnist: Path) -> None:
    data = bytearray((model_dir / "capsnet.onnx").read_bytes())
    data[-1] ^= 0x01
    (model_dir / "capsnet.onnx").write_bytes(bytes(data))
    with pytest.raises(ModelDirError, match=r"capsnet\.onnx sha256 mismatch: .* re-export it with capsnet-export"):
        evaluate_model_dir(model_dir, load_split(synthetic_mnist, "test"))
    (model_dir / "capsnet.onnx").write_bytes(bytes(data[:-1]))
    with pytest.raises(ModelDirError, match=r"capsnet\.onnx has \d+ bytes, the card says \d+: the file was altered"):
        evaluate_model_dir(model_dir, load_split(synthetic_mnist, "test"))


@pytest.mark.parametrize(
    ("card", "message"),
    [
        ("{not json", r"cannot read model\.json: Expecting property name"),
        ("[1]", r"cannot read model\.json: a JSON object was expected, found list"),
        ({"format_version": 2}, r"format_version 2 is not supported"),
        ({"files": {}}, r"capsnet\.onnx is not listed in the card's files, so its checksum cannot be verified"),
        ({"name": "other"}, r"card name 'other' differs from its directory name 'bars'"),
    ],
)
def test_a_malformed_card_is_refused(model_dir: Path, card: str | dict[str, Any], message: str) -> None:
    if isinstance(card, dict):
        card = json.dumps({**json.loads((model_dir / "model.json").read_text()), **card})
    (model_dir / "model.json").write_text(card)
    with pytest.raises(ModelDirError, match=message):
        load_model_dir(model_dir)


def test_capsnet_evaluate_model_prints_the_json_and_exits_2_on_a_broken_directory(
    model_dir: Path, synthetic_mnist: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert evaluate.main(["--model", str(model_dir), "--data-dir", str(synthetic_mnist), "--limit", "10"]) == 0
    result = json.loads(capsys.readouterr().out)
    assert result["model"] == "bars" and result["n"] == 10 and result["test_error"] == 0.0
    assert evaluate.main(["--model", str(tmp_path), "--data-dir", str(synthetic_mnist)]) == 2
    assert f"model.json not found in {tmp_path}" in capsys.readouterr().err


class Terminal(io.StringIO):
    """A stderr that says it is a terminal."""

    def isatty(self) -> bool:
        return True


def test_capsnet_evaluate_shows_a_progress_bar_only_on_a_terminal(
    model_dir: Path, synthetic_mnist: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    argv = ["--model", str(model_dir), "--data-dir", str(synthetic_mnist), "--batch-size", "8"]
    assert evaluate.main(argv) == 0
    assert capsys.readouterr().err == ""  # not a terminal: quiet
    terminal = Terminal()
    monkeypatch.setattr(sys, "stderr", terminal)
    assert evaluate.main(argv) == 0
    assert json.loads(capsys.readouterr().out)["n"] == 32  # the JSON alone on stdout
    assert "evaluating: 100%" in terminal.getvalue() and "32/32" in terminal.getvalue()


def test_onnx_evaluation_never_imports_torch(model_dir: Path, synthetic_mnist: Path) -> None:
    code = (
        "import sys, json\n"
        "import training.fitting.onnx_eval\n"
        "from training.fitting.evaluate import main\n"
        f"assert main(['--model', {str(model_dir)!r}, '--data-dir', {str(synthetic_mnist)!r}]) == 0\n"
        "print(json.dumps(sorted(m for m in sys.modules if m == 'torch' or m.startswith('torch.'))))\n"
    )
    env = {**os.environ, "PYTHONPATH": str(REPO_ROOT)}
    done = subprocess.run(
        [sys.executable, "-c", code], cwd=REPO_ROOT, env=env, capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr
    lines = done.stdout.strip().splitlines()
    assert json.loads(lines[0])["model"] == "bars"
    assert json.loads(lines[-1]) == [], "torch was imported"

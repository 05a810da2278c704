"""Int8 quantization of a model directory: the written directory and its card, verification, the service, the CLI."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import onnxruntime as ort
import pytest
import torch
from fastapi.testclient import TestClient

from model.capsnet import CapsNet
from model.config import CapsNetConfig
from service.main import create_app
from service.runtime.model_dir import load_model_dir, sha256_file
from service.runtime.repository import read_model_directory
from tests.service.conftest import service_settings, wait_ready
from training.data.mnist import load_split
from training.export.exporter import export_module
from training.quantize import static as quantize
from training.quantize.static import (
    ParityBounds,
    QuantizeError,
    QuantizeOptions,
    calibration_indices,
    quantize_model_dir,
)

CALIBRATION = 8
LOOSE = ParityBounds(min_agreement=0.0, max_scores=1.0, mean_scores=1.0, max_poses=1.0, mean_poses=1.0,
                     mean_reconstruction=1.0)  # fmt: skip  # an untrained tiny model: only the code is under test


@pytest.fixture(scope="module")
def zoo(mnist_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A repository holding a tiny float32 model (with its test error) and its int8 child."""
    root = tmp_path_factory.mktemp("zoo")
    torch.manual_seed(0)
    cfg = CapsNetConfig.tiny()
    export_module(
        CapsNet(cfg).eval(), "dynamic", cfg.to_dict(), root / "tiny", name="tiny", torchscript=False,
        evaluate_on=load_split(mnist_dir, "test"),
    )  # fmt: skip
    options = QuantizeOptions(calibration_images=CALIBRATION, seed=3)
    quantize_model_dir(
        root / "tiny", root / "tiny-int8", data_dir=mnist_dir, options=options, bounds=LOOSE, command="c"
    )
    return root


@pytest.fixture(scope="module")
def card(zoo: Path) -> dict[str, Any]:
    return json.loads((zoo / "tiny-int8" / "model.json").read_text())


def session(path: Path) -> ort.InferenceSession:
    return ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])


def test_card_records_quantization_parent_and_both_test_errors(zoo: Path, card: dict[str, Any]) -> None:
    parent = json.loads((zoo / "tiny" / "model.json").read_text())
    q = card["quantization"]
    assert (q["method"], q["format"], q["per_channel"]) == ("percentile", "QDQ", True)
    assert q["op_types"] == ["Conv", "Relu", "Gemm"] and q["u_hat_einsum_as_matmul"] == ["node_einsum"]
    assert q["onnxruntime"] == ort.__version__ and q["command"] == "c"
    assert q["calibration"]["images"] == CALIBRATION and q["calibration"]["seed"] == 3
    assert q["calibration"]["indices"] == calibration_indices(64, CALIBRATION, 3).tolist()
    assert len(q["quantized"]) == 5  # both convolutions and the decoder's three Gemms (the ReLU is folded in)
    assert "Einsum" not in q["float32_op_types"] and {"MatMul", "Softmax"} <= set(q["float32_op_types"])
    assert card["parent"] == {
        "name": "tiny",
        "version": parent["version"],
        "capsnet_onnx_sha256": sha256_file(zoo / "tiny" / "capsnet.onnx"),
        "path": os.path.relpath(zoo / "tiny"),  # relative to the working directory: no machine path
    }
    metrics = card["metrics"]
    assert metrics["n"] == 32 and metrics["evaluated_with"] == "onnxruntime"
    assert metrics["mnist_test_error"] == round(metrics["errors"] / 32, 3)  # to the digits 32 images support
    assert metrics["parent"] == {k: parent["metrics"][k] for k in ("mnist_test_error", "n", "errors")}
    parity = card["export"]["parity"]
    assert parity["n"] == 32 and parity["bounds"] == LOOSE.__dict__
    assert set(parity) >= {
        "class_agreement",
        "max_abs_difference",
        "mean_abs_difference",
        "batch_1",
        "batch_3",
        "batch_64",
    }
    for key in ("input", "outputs", "classes", "scores", "pose_shape", "decoder", "architecture", "training"):
        assert card[key] == parent[key], key
    assert card["name"] == "tiny-int8"


def test_files_hash_and_graphs_are_int8_with_float_decoder(zoo: Path, card: dict[str, Any]) -> None:
    assert load_model_dir(zoo / "tiny-int8").raw_card == card
    graph = onnx.load(str(zoo / "tiny-int8" / "capsnet.onnx"))
    ops = {n.op_type for n in graph.graph.node}
    assert {"QuantizeLinear", "DequantizeLinear"} <= ops and not ops & {"Loop", "If", "Scan", "Einsum", "Relu"}
    assert any(i.data_type == onnx.TensorProto.INT8 for i in graph.graph.initializer)
    assert json.loads(dict((p.key, p.value) for p in graph.metadata_props)["capsnet.card"])["name"] == "tiny-int8"
    decoder, parent_decoder = (onnx.load(str(zoo / d / "decoder.onnx")).graph for d in ("tiny-int8", "tiny"))
    assert decoder == parent_decoder  # same graph and weights; only the stamped card differs


@pytest.mark.parametrize("batch", [1, 3, 64])
def test_dynamic_batch_axis(zoo: Path, batch: int) -> None:
    images = np.random.default_rng(0).random((batch, 1, 28, 28), dtype=np.float32)
    lengths, poses, recon, _ = session(zoo / "tiny-int8" / "capsnet.onnx").run(None, {"image": images})
    assert lengths.shape == (batch, 10) and poses.shape[:2] == (batch, 10) and recon.shape == (batch, 1, 28, 28)


def test_service_loads_and_serves_the_int8_model(zoo: Path) -> None:
    entry = read_model_directory(zoo / "tiny-int8")
    assert entry.error is None and entry.card is not None
    with TestClient(create_app(service_settings(zoo)), raise_server_exceptions=False) as client:
        wait_ready(client)
        listed = {m["name"]: m for m in client.get("/v1/models").json()["models"]}
        assert listed["tiny-int8"]["ready"] and listed["tiny-int8"]["has_decoder"]
        image = {"inputs": [{"name": "image", "shape": [1, 1, 28, 28], "datatype": "FP32", "data": [0.5] * 784}]}
        response = client.post("/v2/models/tiny-int8/infer", json=image)
        assert response.status_code == 200, response.text
        assert [o["name"] for o in response.json()["outputs"]] == ["lengths", "poses", "reconstruction", "explanation"]


def test_keep_einsum_leaves_the_u_hat_transform_as_exported(zoo: Path, mnist_dir: Path, tmp_path: Path) -> None:
    options = QuantizeOptions(calibration_images=4, ops=("Conv",), rewrite_u_hat=False)
    card = quantize_model_dir(zoo / "tiny", tmp_path / "kept-int8", data_dir=mnist_dir, options=options, bounds=LOOSE)
    q = card["quantization"]
    assert q["u_hat_einsum_as_matmul"] == [] and q["op_types"] == ["Conv"] and len(q["quantized"]) == 2
    assert "Einsum" in {n.op_type for n in onnx.load(str(tmp_path / "kept-int8" / "capsnet.onnx")).graph.node}


def test_a_broken_bound_refuses_the_model_and_writes_nothing(zoo: Path, mnist_dir: Path, tmp_path: Path) -> None:
    tight = ParityBounds(**{**LOOSE.__dict__, "mean_poses": 1e-12})
    out = tmp_path / "tight-int8"
    with pytest.raises(
        QuantizeError, match=r"poses \(poses\) mean \|difference\| from the parent .* exceeds its bound 1e-12"
    ):
        quantize_model_dir(
            zoo / "tiny", out, data_dir=mnist_dir, options=QuantizeOptions(calibration_images=4), bounds=tight
        )
    assert not out.exists()


def test_calibration_indices_are_distinct_seeded_and_bounded() -> None:
    a = calibration_indices(60000, 512, 0)
    assert len(set(a.tolist())) == 512 and a.tolist() == sorted(a.tolist()) and a.max() < 60000
    assert (a == calibration_indices(60000, 512, 0)).all() and not (a == calibration_indices(60000, 512, 1)).all()
    with pytest.raises(QuantizeError, match="100 calibration images asked for, the training set has 64"):
        calibration_indices(64, 100, 0)


def test_options_are_checked() -> None:
    with pytest.raises(
        QuantizeError, match=r"calibration method 'mean' is not one of \['entropy', 'minmax', 'percentile'\]"
    ):
        QuantizeOptions(method="mean")
    with pytest.raises(QuantizeError, match="calibration images must be >= 1, got 0"):
        QuantizeOptions(calibration_images=0)


def test_cli_writes_a_dry_run_summary(
    zoo: Path, mnist_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "cli-int8"
    loose = [f"--{f.replace('_', '-', 1)}-delta" for f in LOOSE.__dict__ if f != "min_agreement"]
    args = [
        str(zoo / "tiny"),
        "--out",
        str(out),
        "--data-dir",
        str(mnist_dir),
        "--calibration-images",
        "4",
        "--ops",
        "Conv",
        "--keep-einsum",
        "--dry-run",
    ]
    args += ["--min-agreement", "0", *(a for flag in loose for a in (flag, "1"))]
    assert quantize.main(args) == 0
    summary = json.loads(capsys.readouterr().out)
    assert summary["dry_run"] and summary["name"] == "cli-int8" and summary["parent_errors"] is not None
    assert summary["quantized"] == ["node_conv2d", "node_conv2d_1"] and summary["u_hat_einsum_as_matmul"] == []
    assert not out.exists()


@pytest.mark.parametrize(
    ("case", "message"),
    [
        (
            "no-data",
            "capsnet-quantize: error: MNIST data directory {tmp}/missing does not exist or is not a directory\n",
        ),
        (
            "not-a-model",
            "capsnet-quantize: error: model.json not found in {tmp}/empty (is it a model directory?)\n",
        ),
    ],
)
def test_cli_errors_are_one_line_with_exit_2(
    case: str, message: str, zoo: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    (tmp_path / "empty").mkdir()
    parent = tmp_path / "empty" if case == "not-a-model" else zoo / "tiny"
    data = tmp_path / "missing"
    assert quantize.main([str(parent), "--out", str(tmp_path / "x-int8"), "--data-dir", str(data)]) == 2
    assert capsys.readouterr().err == message.format(tmp=tmp_path)


def test_cli_refuses_to_overwrite_the_parent(
    zoo: Path, mnist_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    copy = tmp_path / "tiny"
    shutil.copytree(zoo / "tiny", copy)
    assert quantize.main([str(copy), "--out", str(copy), "--data-dir", str(mnist_dir)]) == 2
    assert "is the parent model directory" in capsys.readouterr().err


def test_bench_alternates_both_models_and_reports_ratios(zoo: Path, capsys: pytest.CaptureFixture[str]) -> None:
    args = ["bench", str(zoo / "tiny"), str(zoo / "tiny-int8"), "--rounds", "2", "--seconds", "0.01", "--threads", "1"]
    assert quantize.main(args) == 0
    result = json.loads(capsys.readouterr().out)
    assert result["threads"] == 1 and set(result["batches"]) == {"1", "32"}
    for row in result["batches"].values():
        assert row["tiny_images_per_second"] > 0 and row["tiny-int8_images_per_second"] > 0
        assert len(row["ratio_per_round"]) == 2 and row["ratio_median"] > 0
        assert row["tiny_cpu_ms_per_image"] > 0 and row["tiny-int8_cpu_ms_per_image"] > 0
        assert row["cpu_ratio_median"] > 0


def test_bench_runs_as_a_module() -> None:
    done = subprocess.run(
        [sys.executable, "-m", "training.benchmarks.quantize", "--help"], capture_output=True, text=True, check=False
    )
    assert done.returncode == 0 and "FIRST SECOND" in done.stdout and "(default: 5)" in done.stdout


def test_bench_rejects_a_directory_without_a_card(
    zoo: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert quantize.main(["bench", str(zoo / "tiny"), str(tmp_path)]) == 2
    assert capsys.readouterr().err.startswith(f"capsnet-quantize bench: error: model.json not found in {tmp_path}")


BUNDLED = Path(__file__).resolve().parents[3] / "model" / "zoo"


@pytest.mark.skipif(not (BUNDLED / "capsnet-mnist-int8").is_dir(), reason="no bundled int8 model in model/zoo")
def test_bundled_int8_model_matches_its_bundled_parent() -> None:
    """Replacing the float32 bundle without re-running capsnet-quantize fails here; the float32 default holds."""
    child = json.loads((BUNDLED / "capsnet-mnist-int8" / "model.json").read_text())
    parent = json.loads((BUNDLED / child["parent"]["name"] / "model.json").read_text())
    assert child["parent"]["capsnet_onnx_sha256"] == parent["files"]["capsnet.onnx"]["sha256"]
    assert child["parent"]["version"] == parent["version"]
    assert child["metrics"]["parent"]["errors"] == parent["metrics"]["errors"]
    assert child["metrics"]["n"] == 10000 and child["metrics"]["errors"] <= parent["metrics"]["errors"] + 3
    assert parent["metrics"]["mnist_test_error"] <= child["metrics"]["mnist_test_error"]  # float32 stays the default


def test_bench_refuses_two_models_of_one_name(zoo: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    shutil.copytree(zoo / "tiny", tmp_path / "tiny")
    assert quantize.main(["bench", str(zoo / "tiny"), str(tmp_path / "tiny")]) == 2
    assert capsys.readouterr().err == (
        "capsnet-quantize bench: error: both model directories hold a model named 'tiny': nothing to compare\n"
    )

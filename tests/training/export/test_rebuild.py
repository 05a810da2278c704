"""Rebuilding a PyTorch model from a model directory's graphs, and re-exporting it (capsnet-export --from-model-dir)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch

from model.capsnet import CapsNet
from model.config import CapsNetConfig
from tests.conftest import REPO_ROOT
from training.data.mnist import MNISTSplit
from training.export import exporter as export
from training.export.exporter import export_from_model_dir
from training.export.graphs import TOLERANCES
from training.export.rebuild import RebuildError, rebuild_model


@pytest.fixture(scope="module")
def original(tmp_path_factory: pytest.TempPathFactory) -> tuple[CapsNet, Path]:
    torch.manual_seed(0)
    cfg = CapsNetConfig.tiny()
    model = CapsNet(cfg).eval()
    out = tmp_path_factory.mktemp("zoo") / "tiny"
    export.export_module(model, "dynamic", cfg.to_dict(), out, name="tiny", torchscript=False)
    return model, out


def test_rebuild_recovers_every_weight(original: tuple[CapsNet, Path]) -> None:
    model, directory = original
    rebuilt, card, parity = rebuild_model(directory)
    assert card["name"] == "tiny"
    want, got = model.state_dict(), rebuilt.state_dict()
    assert sorted(want) == sorted(got)
    for key in want:
        torch.testing.assert_close(got[key], want[key], rtol=0, atol=0)
    assert set(parity) == {f"capsnet.onnx:{o['name']}" for o in card["outputs"]} | {"decoder.onnx:reconstruction"}
    assert max(parity.values()) < 1e-4


def test_reexport_keeps_the_training_record_and_bumps_the_version(
    original: tuple[CapsNet, Path], tmp_path: Path
) -> None:
    _, directory = original
    old = json.loads((directory / "model.json").read_text())
    card = export_from_model_dir(directory, tmp_path / "tiny", name="tiny", test=None, evaluate=False,
                                 torchscript=False)  # fmt: skip
    assert card["version"] == str(int(old["version"]) + 1)
    assert card["training"]["rebuilt_from"]["version"] == old["version"]
    assert card["training"]["rebuilt_from"]["sha256"] == {f: e["sha256"] for f, e in old["files"].items()}
    assert [o["role"] for o in card["outputs"]] == ["scores", "poses", "reconstruction", "explanation"]
    assert card["export"]["parity"]["capsnet.onnx"]["batch_64"]["explanation"] <= 1e-3


def test_cli_from_model_dir(
    original: tuple[CapsNet, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("CAPSNET_DATA_DIR", raising=False)  # about the CLI without MNIST: not the environment's
    _, directory = original
    out = tmp_path / "tiny"
    args = ["--from-model-dir", str(directory), "--out", str(out), "--no-evaluate", "--no-torchscript"]
    assert export.main([*args, "--version", "7"]) == 0
    summary = json.loads(capsys.readouterr().out)
    assert summary["model_dir"] == str(out)
    assert json.loads((out / "model.json").read_text())["version"] == "7"


def test_cli_needs_exactly_one_source(original: tuple[CapsNet, Path], capsys: pytest.CaptureFixture[str]) -> None:
    _, directory = original
    for args in (["--out", "x"], ["best.pt", "--from-model-dir", str(directory), "--out", "x"]):
        with pytest.raises(SystemExit) as exit_info:
            export.main(args)
        assert exit_info.value.code == 2
        assert "give either a checkpoint CKPT or --from-model-dir DIR" in capsys.readouterr().err


def test_rebuild_refuses_a_card_that_does_not_fit_the_graphs(original: tuple[CapsNet, Path], tmp_path: Path) -> None:
    _, directory = original
    copy = tmp_path / "tiny"
    shutil.copytree(directory, copy)
    card = json.loads((copy / "model.json").read_text())
    card["model_config"]["conv1_channels"] += 1
    (copy / "model.json").write_text(json.dumps(card))
    with pytest.raises(RebuildError, match=r"conv1.weight: shape \[\d+, 1, \d+, \d+\] in the graph"):
        rebuild_model(copy)


def test_a_card_older_than_an_output_role_rebuilds_at_the_exporters_tolerance(tmp_path: Path) -> None:
    """A card written before the "parts" role had a tolerance still rebuilds, checked on every output."""
    directory = tmp_path / "capsnet-em-mnist"
    shutil.copytree(REPO_ROOT / "model" / "zoo" / "capsnet-em-mnist", directory)
    card = json.loads((directory / "model.json").read_text())
    del card["export"]["parity"]["tolerance"]["parts"]
    (directory / "model.json").write_text(json.dumps(card))
    bars = np.pad(np.full((8, 1, 20, 4), 255, np.uint8), ((0, 0), (0, 0), (4, 4), (12, 12)))  # eight ones
    _, _, diffs = rebuild_model(directory, MNISTSplit(bars, np.ones(8, np.int64)))
    assert set(diffs) == {"capsnet.onnx:activations", "capsnet.onnx:poses", "capsnet.onnx:parts"}
    assert diffs["capsnet.onnx:parts"] <= TOLERANCES["parts"]

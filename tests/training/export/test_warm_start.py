"""capsnet-train --init-from: a new run whose first weights are a model directory's, and the record of it."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path
from typing import Any

import pytest
import torch

from model.capsnet import CapsNet
from model.config import CapsNetConfig
from service.runtime.model_dir import sha256_file
from training.export.exporter import export_checkpoint, export_module
from training.export.rebuild import RebuildError, warm_start
from training.fitting import train
from training.fitting.train import TrainConfig, mnist_trainer

TINY = dict(preset="tiny", batch_size=16, eval_batch_size=32, device="cpu", seed=1, train_subset=16)


@pytest.fixture(scope="module")
def zoo(tmp_path_factory: pytest.TempPathFactory) -> tuple[CapsNet, Path]:
    """A tiny CapsNet (seeded apart from the runs below) exported to a model directory named `tiny`."""
    torch.manual_seed(123)
    model = CapsNet(CapsNetConfig.tiny()).eval()
    out = tmp_path_factory.mktemp("zoo") / "tiny"
    export_module(model, "dynamic", model.cfg.to_dict(), out, name="tiny", torchscript=False)
    return model, out


def provenance(directory: Path) -> dict[str, Any]:
    card = json.loads((directory / "model.json").read_text())
    return {
        "path": os.path.relpath(directory),  # relative to the working directory: no machine path
        "name": "tiny",
        "version": card["version"],
        "capsnet_onnx_sha256": sha256_file(directory / "capsnet.onnx"),
    }


def test_a_warm_start_begins_with_the_exported_weights_and_fresh_training_state(
    zoo: tuple[CapsNet, Path], mnist_dir: Path, tmp_path: Path
) -> None:
    exported, directory = zoo
    cfg = TrainConfig(epochs=1, lr=0.002, **TINY)  # type: ignore[arg-type]
    cold = mnist_trainer(cfg, str(mnist_dir), None)
    cold_rng = torch.get_rng_state()
    warm = mnist_trainer(cfg, str(mnist_dir), tmp_path / "run", init_from=directory)
    assert torch.equal(torch.get_rng_state(), cold_rng), "the rest of the run is seeded as without --init-from"
    want, got = exported.state_dict(), warm.model.state_dict()
    assert sorted(got) == sorted(want)
    for key in want:
        assert torch.equal(got[key], want[key]), key
    assert not torch.equal(cold.model.state_dict()["conv1.weight"], got["conv1.weight"])
    assert warm.epoch == 0 and warm.history == [] and not warm.optimizer.state
    assert warm.optimizer.param_groups[0]["lr"] == 0.002
    assert warm.task.warm_start and not cold.task.warm_start  # a trained model's loss is at its final settings


def test_the_run_records_where_it_started_and_its_exported_card_says_so(
    zoo: tuple[CapsNet, Path], mnist_dir: Path, tmp_path: Path
) -> None:
    _, directory = zoo
    out = tmp_path / "run"
    trainer = mnist_trainer(TrainConfig(epochs=1, **TINY), str(mnist_dir), out, init_from=directory)  # type: ignore[arg-type]
    trainer.fit()
    want = provenance(directory)
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert rows[0]["init_from"] == want
    last = torch.load(out / "last.pt", weights_only=False)
    assert last["init_from"] == want
    resumed = mnist_trainer(TrainConfig(epochs=2, **TINY), str(mnist_dir), out, resume=str(out / "last.pt"))  # type: ignore[arg-type]
    assert resumed.init_from == want, "a resumed warm start keeps its origin"
    assert resumed.task.warm_start
    card = export_checkpoint(
        out / "last.pt", tmp_path / "warm", data_dir=str(mnist_dir), evaluate=False, torchscript=False
    )
    assert card["training"]["init_from"] == want


def test_a_cold_run_records_no_origin(mnist_dir: Path, tmp_path: Path) -> None:
    trainer = mnist_trainer(TrainConfig(epochs=1, **TINY), str(mnist_dir), tmp_path / "run")  # type: ignore[arg-type]
    trainer.fit()
    assert "init_from" not in trainer.history[0]
    assert "init_from" not in torch.load(tmp_path / "run" / "last.pt", weights_only=False)


def test_cli_dry_run_from_a_model_directory_warns_about_validation(
    zoo: tuple[CapsNet, Path], mnist_dir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    _, directory = zoo
    argv = ["--data-dir", str(mnist_dir), "--preset", "tiny", "--device", "cpu", "--dry-run"]
    assert train.main([*argv, "--init-from", str(directory), "--val-split", "16"]) == 0
    captured = capsys.readouterr()
    assert json.loads(captured.out)["init_from"] == provenance(directory)
    assert (
        f"capsnet-train: warning: --val-split 16 with --init-from: if {directory} was trained on all 60,000 "
        "training images, the held-out ones were seen and val_error is optimistic\n"
    ) in captured.err


def test_cli_refuses_a_model_directory_of_another_model(
    zoo: tuple[CapsNet, Path], mnist_dir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    _, directory = zoo
    argv = ["--data-dir", str(mnist_dir), "--device", "cpu", "--dry-run", "--init-from", str(directory)]
    assert train.main([*argv, "--preset", "tiny", "--routing-iterations", "2"]) == 2
    assert capsys.readouterr().err == (
        f"capsnet-train: error: --init-from {directory} holds a different model from the one this run builds "
        "(routing_iterations 3 there, 2 here): set --arch, --preset, --routing, --routing-iterations and --canvas "
        "to match its card\n"
    )
    assert train.main([*argv, "--preset", "tiny", "--arch", "em"]) == 2
    assert '(architecture "dynamic" there, "em" here)' in capsys.readouterr().err


@pytest.mark.parametrize(
    ("damage", "message"),
    [
        ("missing", "no such directory (give a model directory such as model/zoo/<name>)"),
        ("no card", "model.json not found in"),
        ("altered", "capsnet.onnx has"),
    ],
)
def test_cli_refuses_a_missing_or_invalid_model_directory(
    damage: str,
    message: str,
    zoo: tuple[CapsNet, Path],
    mnist_dir: Path,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    directory = tmp_path / "tiny"
    if damage != "missing":
        shutil.copytree(zoo[1], directory)
    if damage == "no card":
        (directory / "model.json").unlink()
    if damage == "altered":
        with open(directory / "capsnet.onnx", "ab") as f:
            f.write(b"\0")
    argv = ["--data-dir", str(mnist_dir), "--preset", "tiny", "--device", "cpu", "--dry-run"]
    assert train.main([*argv, "--init-from", str(directory)]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"capsnet-train: error: --init-from {directory}: ") and message in err
    assert len(err.splitlines()) == 1 and "Traceback" not in err


def test_cli_refuses_init_from_with_resume(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as e:
        train.main(["--data-dir", str(tmp_path), "--init-from", "model/zoo/x", "--resume", "last.pt"])
    assert e.value.code == 2
    assert (
        "capsnet-train: error: --init-from and --resume cannot be combined: --init-from starts a new run from a "
        "model directory's weights, --resume continues a checkpoint with its own\n"
    ) in capsys.readouterr().err


def test_help_states_the_default(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        train.main(["--help"])
    assert "(default: none, random initialisation)" in " ".join(capsys.readouterr().out.split())


def test_library_refuses_a_quantized_directory(zoo: tuple[CapsNet, Path], tmp_path: Path) -> None:
    directory = tmp_path / "tiny"
    shutil.copytree(zoo[1], directory)
    card = json.loads((directory / "model.json").read_text())
    card["quantization"] = {"method": "minmax"}
    card["parent"] = {"path": "model/zoo/tiny-float"}
    (directory / "model.json").write_text(json.dumps(card))
    config = CapsNetConfig.tiny().to_dict()
    with pytest.raises(RebuildError, match=r"is a quantized model; start from the float32 model \(model/zoo/tiny-f"):
        warm_start(directory, "dynamic", config)

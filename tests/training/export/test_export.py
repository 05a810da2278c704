"""Export: the model directory, its card, unrolled ONNX graphs, parity with PyTorch, TorchScript twin, CLI."""

from __future__ import annotations

import dataclasses
import hashlib
import json
import shutil
from datetime import datetime
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import onnxruntime as ort
import pytest
import torch

from model.capsnet import CapsNet, count_parameters
from model.config import CapsNetConfig, EMCapsNetConfig
from training.data.mnist import file_hashes, load_split, to_float
from training.export import exporter as export
from training.export import graphs as export_graphs
from training.export.exporter import ExportError, export_checkpoint, export_module, verify_model_dir
from training.export.rebuild import rebuild_model
from training.fitting import evaluate
from training.fitting.architectures import ARCHITECTURES
from training.fitting.checkpoint import load_model
from training.fitting.evaluate import evaluate_torch
from training.fitting.onnx_eval import evaluate_model_dir
from training.fitting.train import TrainConfig, mnist_trainer

CARD_FIELDS = {
    "format_version", "name", "version", "description", "architecture", "model_config", "routing", "parameters",
    "input", "classes", "outputs", "scores", "pose_shape", "decoder", "metrics", "training", "export", "files",
}  # fmt: skip


def session(path: Path) -> ort.InferenceSession:
    return ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])


def random_images(n: int, seed: int = 7) -> np.ndarray:
    return np.random.default_rng(seed).random((n, 1, 28, 28), dtype=np.float32)


def walk_for_control_flow(nodes: Any) -> list[str]:
    """An independent walk: every node, every subgraph attribute."""
    found = []
    for node in nodes:
        if node.op_type in {"Loop", "If", "Scan"}:
            found.append(node.op_type)
        for attr in node.attribute:
            subgraphs = [attr.g] if attr.type == onnx.AttributeProto.GRAPH else list(attr.graphs)
            for sub in subgraphs:
                found += walk_for_control_flow(sub.node)
    return found


@pytest.fixture(scope="module")
def tiny() -> CapsNet:
    torch.manual_seed(0)
    return CapsNet(CapsNetConfig.tiny()).eval()


@pytest.fixture(scope="module")
def exported(tiny: CapsNet, tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, Any]]:
    out = tmp_path_factory.mktemp("zoo") / "tiny-capsnet"
    card = export_module(tiny, "dynamic", tiny.cfg.to_dict(), out, name="tiny-capsnet")
    return out, card


@pytest.fixture(scope="module")
def checkpoint(mnist_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """best.pt of one tiny training epoch on synthetic data, exactly as capsnet-train writes it."""
    out = tmp_path_factory.mktemp("run")
    cfg = TrainConfig(preset="tiny", epochs=1, batch_size=16, eval_batch_size=32, device="cpu", seed=1)
    mnist_trainer(cfg, str(mnist_dir), out).fit()
    return out / "best.pt"


def test_directory_holds_every_file_with_its_hash_in_the_card(exported: tuple[Path, dict[str, Any]]) -> None:
    out, card = exported
    assert sorted(p.name for p in out.iterdir()) == ["capsnet.onnx", "capsnet.ts", "decoder.onnx", "model.json"]
    assert json.loads((out / "model.json").read_text()) == card
    assert set(card["files"]) == {"capsnet.onnx", "decoder.onnx", "capsnet.ts"}
    for name, entry in card["files"].items():
        data = (out / name).read_bytes()
        assert entry == {"sha256": hashlib.sha256(data).hexdigest(), "bytes": len(data)}
    assert verify_model_dir(out) == card
    assert not list(out.parent.glob(".*export-*")), "the staging directory is removed"


def test_card_describes_the_model(tiny: CapsNet, exported: tuple[Path, dict[str, Any]]) -> None:
    _, card = exported
    assert set(card) == CARD_FIELDS
    assert card["format_version"] == 1 and card["name"] == "tiny-capsnet" and card["version"] == "1"
    assert card["architecture"] == "dynamic" and CapsNetConfig.from_dict(card["model_config"]) == tiny.cfg
    assert card["routing"] == {"algorithm": "dynamic", "variant": "sabour", "iterations": 3}
    assert card["parameters"] == count_parameters(tiny)
    assert card["input"] == {
        "name": "image", "shape": [-1, 1, 28, 28], "datatype": "FP32", "range": [0.0, 1.0], "layout": "NCHW",
        "normalization": card["input"]["normalization"],
    }  # fmt: skip
    assert card["classes"] == [str(k) for k in range(10)]
    assert [(o["name"], o["shape"], o["role"], o["datatype"]) for o in card["outputs"]] == [
        ("lengths", [-1, 10], "scores", "FP32"),
        ("poses", [-1, 10, 8], "poses", "FP32"),
        ("reconstruction", [-1, 1, 28, 28], "reconstruction", "FP32"),
        ("explanation", [-1, 10, 6, 6], "explanation", "FP32"),
    ]
    assert card["outputs"][-1]["receptive_field"] == {"size": 17, "stride": 2}
    assert all(o["description"] for o in card["outputs"])
    assert card["scores"] == {"output": "lengths", "kind": "capsule_length"}
    assert card["pose_shape"] == [8]
    assert card["decoder"]["file"] == "decoder.onnx"
    assert [(i["name"], i["shape"]) for i in card["decoder"]["inputs"]] == [("poses", [-1, 10, 8]), ("mask", [-1, 10])]
    assert card["decoder"]["output"]["shape"] == [-1, 1, 28, 28]
    assert card["metrics"] == {"mnist_test_error": None, "n": 0, "evaluated_with": None}
    assert card["training"] == {"command": None, "epochs": None, "seed": None, "data_sha256": {}, "history": []}
    exp = card["export"]
    assert exp["onnx_opset"] >= 18 and set(exp["tools"]) == {"torch", "onnx", "onnxruntime", "python"}
    assert exp["git_commit"] is None or len(exp["git_commit"]) == 40
    assert datetime.fromisoformat(exp["exported_at"]).tzinfo is not None


def test_card_records_parity_within_tolerance(exported: tuple[Path, dict[str, Any]]) -> None:
    parity = exported[1]["export"]["parity"]
    assert parity["tolerance"] == {
        "scores": 1e-4,
        "poses": 1e-4,
        "reconstruction": 1e-3,
        "explanation": 1e-3,
        "parts": 1e-3,
    }
    tolerance = {
        "lengths": 1e-4, "poses": 1e-4, "reconstruction": 1e-3, "explanation": 1e-3, "decode.reconstruction": 1e-3,
    }  # fmt: skip
    for file in ("capsnet.onnx", "decoder.onnx", "capsnet.ts"):
        assert set(parity[file]) == {"batch_1", "batch_64"}
        for diffs in parity[file].values():
            assert diffs and all(0 <= d <= tolerance[k] for k, d in diffs.items()), (file, diffs)
    assert set(parity["capsnet.ts"]["batch_64"]) == set(tolerance)


@pytest.mark.parametrize(
    ("file", "inputs", "outputs"),
    [
        ("capsnet.onnx", ["image"], ["lengths", "poses", "reconstruction", "explanation"]),
        ("decoder.onnx", ["poses", "mask"], ["reconstruction"]),
    ],
)
def test_onnx_graph_is_valid_unrolled_and_batch_dynamic(
    exported: tuple[Path, dict[str, Any]], file: str, inputs: list[str], outputs: list[str]
) -> None:
    proto = onnx.load(str(exported[0] / file))
    onnx.checker.check_model(proto, full_check=True)
    assert walk_for_control_flow(proto.graph.node) == []
    assert all(walk_for_control_flow(f.node) == [] for f in proto.functions)
    assert {o.domain: o.version for o in proto.opset_import}.get("", 0) >= 18
    assert [i.name for i in proto.graph.input] == inputs and [o.name for o in proto.graph.output] == outputs
    for value in [*proto.graph.input, *proto.graph.output]:
        assert value.type.tensor_type.shape.dim[0].dim_param, f"{value.name}: batch axis is fixed"


def test_control_flow_walk_finds_a_loop_inside_a_subgraph() -> None:
    inner = onnx.helper.make_graph([onnx.helper.make_node("Loop", [], [], name="routing")], "body", [], [])
    outer = onnx.helper.make_graph(
        [onnx.helper.make_node("If", ["c"], [], then_branch=inner, else_branch=inner)], "g", [], []
    )
    found = export_graphs.control_flow_nodes(onnx.helper.make_model(outer))
    assert sorted(f.split()[0] for f in found) == ["If", "Loop", "Loop"]


@pytest.mark.parametrize("file", ["capsnet.onnx", "decoder.onnx"])
def test_metadata_props_carry_the_card_without_files(exported: tuple[Path, dict[str, Any]], file: str) -> None:
    out, card = exported
    props = {p.key: p.value for p in onnx.load(str(out / file)).metadata_props}
    assert json.loads(props["capsnet.card"]) == {k: v for k, v in card.items() if k != "files"}
    assert props["capsnet.name"] == "tiny-capsnet" and props["capsnet.architecture"] == "dynamic"
    assert props["capsnet.scores_output"] == "lengths" and json.loads(props["capsnet.classes"]) == card["classes"]


@pytest.mark.parametrize("batch", [1, 64])
def test_onnx_runtime_matches_pytorch(tiny: CapsNet, exported: tuple[Path, dict[str, Any]], batch: int) -> None:
    images = random_images(batch)
    with torch.no_grad():
        ref, routing = tiny.explain(torch.from_numpy(images))
    lengths, poses, recon, explanation = session(exported[0] / "capsnet.onnx").run(None, {"image": images})
    assert lengths.shape == (batch, 10) and poses.shape == (batch, 10, 8) and recon.shape == (batch, 1, 28, 28)
    assert explanation.shape == (batch, 10, 6, 6)
    assert np.abs(explanation - routing.numpy()).max() <= 1e-3
    assert np.abs(lengths - ref.lengths.numpy()).max() <= 1e-4
    assert np.abs(poses - ref.poses.numpy()).max() <= 1e-4
    assert np.abs(recon - ref.reconstruction.numpy().reshape(batch, 1, 28, 28)).max() <= 1e-3


def test_decoder_reconstructs_from_any_class_and_edited_poses(
    tiny: CapsNet, exported: tuple[Path, dict[str, Any]]
) -> None:
    out = exported[0]
    images = random_images(8)
    lengths, poses, recon, _ = session(out / "capsnet.onnx").run(None, {"image": images})
    decoder = session(out / "decoder.onnx")
    own = np.eye(10, dtype=np.float32)[lengths.argmax(axis=1)]
    (same,) = decoder.run(None, {"poses": poses, "mask": own})
    assert np.abs(same - recon).max() <= 1e-5, "decoder.onnx with the predicted class = capsnet.onnx reconstruction"
    other = (lengths.argmax(axis=1) + 3) % 10
    edited = poses.copy()
    edited[np.arange(8), other, 0] += 0.25  # the perturbation figure: tweak one pose dimension
    (got,) = decoder.run(None, {"poses": edited, "mask": np.eye(10, dtype=np.float32)[other]})
    with torch.no_grad():
        want = tiny.decode_class(torch.from_numpy(edited), torch.from_numpy(other)).numpy().reshape(8, 1, 28, 28)
    assert np.abs(got - want).max() <= 1e-3


@pytest.mark.filterwarnings("ignore:`torch.jit.load` is deprecated:DeprecationWarning")
def test_torchscript_twin_matches_pytorch_and_carries_the_card(
    tiny: CapsNet, exported: tuple[Path, dict[str, Any]]
) -> None:
    out, card = exported
    extra = {"model.json": ""}
    twin = torch.jit.load(str(out / "capsnet.ts"), _extra_files=extra)
    assert json.loads(extra["model.json"]) == {k: v for k, v in card.items() if k != "files"}
    for batch in (1, 64):
        x = torch.from_numpy(random_images(batch, seed=batch))
        with torch.no_grad():
            ref, (lengths, poses, recon, explanation) = tiny(x), twin(x)
            assert (explanation - tiny.explain(x)[1]).abs().max() <= 1e-3
            assert (lengths - ref.lengths).abs().max() <= 1e-4 and (poses - ref.poses).abs().max() <= 1e-4
            assert (recon.flatten(1) - ref.reconstruction).abs().max() <= 1e-3
            mask = torch.eye(10)[torch.arange(batch) % 10]
            assert (twin.decode(ref.poses, mask).flatten(1) - tiny.decode(ref.poses, mask)).abs().max() <= 1e-3


def test_pt2_programs_match_pytorch_at_any_batch_and_carry_the_card(tiny: CapsNet, tmp_path: Path) -> None:
    """--pt2: torch.export programs of forward and of the decoder, with a dynamic batch axis and the card."""
    (tmp_path / "zoo").mkdir()
    out = tmp_path / "zoo" / "tiny-pt2"
    card = export_module(tiny, "dynamic", tiny.cfg.to_dict(), out, name="tiny-pt2", torchscript=False, pt2=True)
    assert {"capsnet.pt2", "decoder.pt2"} <= set(card["files"]) and "capsnet.ts" not in card["files"]
    assert set(card["export"]["parity"]["capsnet.pt2"]) == {"batch_1", "batch_64"}
    extra = {"model.json": ""}
    program = torch.export.load(str(out / "capsnet.pt2"), extra_files=extra)
    assert json.loads(extra["model.json"]) == {k: v for k, v in card.items() if k != "files"}
    forward = program.module()
    decoder = torch.export.load(str(out / "decoder.pt2")).module()
    for batch in (1, 3, 64):  # 3 was never seen at export: the batch axis is symbolic
        x = torch.from_numpy(random_images(batch, seed=batch))
        with torch.no_grad():
            ref, (lengths, poses, recon, explanation) = tiny(x), forward(x)
            assert (explanation - tiny.explain(x)[1]).abs().max() <= 1e-3
            assert (lengths - ref.lengths).abs().max() <= 1e-4 and (poses - ref.poses).abs().max() <= 1e-4
            assert (recon.flatten(1) - ref.reconstruction).abs().max() <= 1e-3
            mask = torch.eye(10)[torch.arange(batch) % 10]
            got = decoder(ref.poses, mask)
            assert (got.flatten(1) - tiny.decode(ref.poses, mask)).abs().max() <= 1e-3
    verify_model_dir(out)


def test_a_corrupted_file_is_refused_with_a_clear_message(
    exported: tuple[Path, dict[str, Any]], tmp_path: Path
) -> None:
    copy = tmp_path / "tiny-capsnet"
    shutil.copytree(exported[0], copy)
    data = bytearray((copy / "decoder.onnx").read_bytes())
    data[len(data) // 2] ^= 0xFF
    (copy / "decoder.onnx").write_bytes(bytes(data))
    with pytest.raises(ExportError, match=r"tiny-capsnet: decoder\.onnx sha256 mismatch: .* altered after export"):
        verify_model_dir(copy)
    (copy / "decoder.onnx").unlink()
    with pytest.raises(ExportError, match=r"decoder\.onnx is listed in the card but missing"):
        verify_model_dir(copy)
    with pytest.raises(ExportError, match=r"model\.json not found in"):
        verify_model_dir(tmp_path)


def test_a_parity_failure_raises_and_writes_nothing(
    tiny: CapsNet, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(
        export_graphs, "TOLERANCES", {"scores": -1.0, "poses": 1e-4, "reconstruction": 1e-3, "explanation": 1e-3}
    )
    (tmp_path / "zoo").mkdir()
    out = tmp_path / "zoo" / "broken"
    with pytest.raises(
        ExportError, match=r"capsnet\.onnx: lengths differs from PyTorch by .* at batch 1 \(tolerance -1\)"
    ):
        export_module(tiny, "dynamic", tiny.cfg.to_dict(), out, name="broken", torchscript=False)
    assert not out.exists() and list((tmp_path / "zoo").iterdir()) == []


@pytest.mark.slow
def test_a_model_without_decoder_exports_no_decoder_and_replaces_stale_files(
    exported: tuple[Path, dict[str, Any]], tmp_path: Path
) -> None:
    out = tmp_path / "tiny-capsnet"
    shutil.copytree(exported[0], out)
    torch.manual_seed(1)
    model = CapsNet(CapsNetConfig.tiny(use_decoder=False))
    card = export_module(model, "dynamic", model.cfg.to_dict(), out, name="tiny-capsnet", torchscript=False)
    assert card["decoder"] is None and [o["name"] for o in card["outputs"]] == ["lengths", "poses", "explanation"]
    assert sorted(p.name for p in out.iterdir()) == ["capsnet.onnx", "model.json"], (
        "stale decoder.onnx and capsnet.ts go"
    )
    assert [o.name for o in onnx.load(str(out / "capsnet.onnx")).graph.output] == ["lengths", "poses", "explanation"]


def test_an_architecture_without_export_spec_is_refused(
    tiny: CapsNet, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setitem(ARCHITECTURES, "dynamic", dataclasses.replace(ARCHITECTURES["dynamic"], export=None))
    with pytest.raises(ExportError, match=r"architecture 'dynamic' cannot be exported: .* no export spec"):
        export_module(tiny, "dynamic", tiny.cfg.to_dict(), tmp_path / "m", name="m")


@pytest.mark.parametrize(
    ("name", "opset", "message"),
    [("Tiny Net", 18, r"model name 'Tiny Net' is not URL-safe"), ("tiny", 17, r"opset 17 is too old: use 18 or newer")],
)
def test_bad_names_and_old_opsets_are_refused(
    tiny: CapsNet, tmp_path: Path, name: str, opset: int, message: str
) -> None:
    with pytest.raises(ExportError, match=message):
        export_module(tiny, "dynamic", tiny.cfg.to_dict(), tmp_path / name, name=name, opset=opset)
    with pytest.raises(
        ExportError, match=r"model name 'tiny' differs from its directory name 'other'; they must match"
    ):
        export_module(tiny, "dynamic", tiny.cfg.to_dict(), tmp_path / "other", name="tiny")


def test_verification_images_must_have_the_input_shape(tiny: CapsNet, tmp_path: Path) -> None:
    with pytest.raises(ExportError, match=r"verification images have shape \[4, 28, 28\], expected \[N, 1, 28, 28\]"):
        export_module(
            tiny, "dynamic", tiny.cfg.to_dict(), tmp_path / "m", name="m", verify_images=np.zeros((4, 28, 28))
        )


@pytest.mark.slow
def test_cli_exports_a_checkpoint_and_the_model_evaluates_like_the_card(
    checkpoint: Path, mnist_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "zoo" / "capsnet-tiny"
    assert export.main([str(checkpoint), "--out", str(out), "--data-dir", str(mnist_dir), "--no-torchscript"]) == 0
    summary = json.loads(capsys.readouterr().out)
    card = json.loads((out / "model.json").read_text())
    assert summary["model_dir"] == str(out) and summary["name"] == card["name"] == "capsnet-tiny"
    assert set(summary["files"]) == {"capsnet.onnx", "decoder.onnx"} and not (out / "capsnet.ts").exists()
    assert card["export"]["parity"]["images"] == "MNIST test images 0-63"
    metrics = card["metrics"]
    assert (
        metrics["n"] == 32
        and metrics["evaluated_with"] == "onnxruntime"
        and summary["mnist_test_error"] == metrics["mnist_test_error"]
    )
    state = torch.load(checkpoint, weights_only=False)
    training = card["training"]
    assert training["epochs"] == 1 and training["seed"] == 1 and training["history"] == state["history"]
    assert training["data_sha256"] == file_hashes(mnist_dir) and training["command"].split()[0] == state["command"][0]
    assert training["checkpoint"]["file"] == "best.pt" and len(training["checkpoint"]["sha256"]) == 64

    assert evaluate.main(["--model", str(out), "--data-dir", str(mnist_dir)]) == 0
    result = json.loads(capsys.readouterr().out)
    assert result["model"] == "capsnet-tiny" and result["n"] == 32
    assert (
        result["test_error"] == metrics["mnist_test_error"] and result["per_class_error"] == metrics["per_class_error"]
    )
    model, arch, _ = load_model(checkpoint)
    torch_result = evaluate_torch(model, arch, load_split(mnist_dir, "test"), torch.device("cpu"), batch_size=32)
    assert torch_result.to_dict()["confusion_matrix"] == result["confusion_matrix"], (
        "ONNX Runtime predicts like PyTorch"
    )


def test_a_checkpoint_with_a_weight_average_exports_the_average(mnist_dir: Path, tmp_path: Path) -> None:
    cfg = TrainConfig(preset="tiny", epochs=1, batch_size=16, eval_batch_size=32, device="cpu", seed=1, ema=0.5)
    mnist_trainer(cfg, str(mnist_dir), tmp_path / "run").fit()
    state = torch.load(tmp_path / "run" / "best.pt", weights_only=False)
    card = export_checkpoint(
        tmp_path / "run" / "best.pt", tmp_path / "zoo" / "capsnet-ema", data_dir=str(mnist_dir), torchscript=False
    )
    assert card["training"]["train_config"]["ema"] == 0.5
    images = to_float(load_split(mnist_dir, "test").images[:8])
    session = ort.InferenceSession(str(tmp_path / "zoo" / "capsnet-ema" / "capsnet.onnx"))
    (lengths,) = session.run(["lengths"], {"image": images})
    outputs = {}
    for key in ("model", "training_model"):
        model = CapsNet(CapsNetConfig.from_dict(state["model_config"])).eval()
        model.load_state_dict(state[key])
        with torch.no_grad():
            outputs[key] = model(torch.from_numpy(images)).lengths.numpy()
    assert np.allclose(lengths, outputs["model"], atol=1e-5)
    assert not np.allclose(lengths, outputs["training_model"], atol=1e-5)


@pytest.mark.slow
def test_cli_dry_run_verifies_and_writes_nothing(
    checkpoint: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("CAPSNET_DATA_DIR", raising=False)  # about the CLI without MNIST: not the environment's
    out = tmp_path / "capsnet-dry"
    assert export.main([str(checkpoint), "--out", str(out), "--dry-run", "--no-torchscript", "--pt2"]) == 0
    summary = json.loads(capsys.readouterr().out)
    assert summary["dry_run"] is True and summary["model_dir"] is None and summary["n"] == 0
    assert summary["max_abs_difference"]["capsnet.onnx"] <= 1e-3
    assert summary["max_abs_difference"]["capsnet.pt2"] <= 1e-3 and "decoder.pt2" in summary["files"]
    assert not out.exists()


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["missing.pt", "--out", "{tmp}/m"], "checkpoint missing.pt not found"),
        (["{ckpt}", "--out", "{tmp}/m", "--opset", "17"], "opset 17 is too old: use 18 or newer"),
        (["{ckpt}", "--out", "{tmp}/Bad Name"], "model name 'Bad Name' is not URL-safe"),
        (["{ckpt}", "--out", "{tmp}/m", "--name", "n"], "model name 'n' differs from its directory name 'm'"),
        (["{ckpt}", "--out", "{tmp}/m"], "no MNIST test set to evaluate on: pass --data-dir"),
        (["{ckpt}", "--out", "{tmp}/m", "--data-dir", "{tmp}/nowhere"], "does not exist or is not a directory"),
    ],
)
def test_cli_errors_exit_2_with_one_line(
    checkpoint: Path,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
    args: list[str],
    message: str,
) -> None:
    monkeypatch.delenv("CAPSNET_DATA_DIR", raising=False)
    argv = [a.format(tmp=tmp_path, ckpt=checkpoint) for a in args]
    assert export.main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("capsnet-export: error: ") and message in err and "\n" not in err
    assert not (tmp_path / "m").exists()


def test_cli_help_states_every_default() -> None:
    parser = export.build_parser()
    for action in parser._actions:
        if action.option_strings and action.dest not in ("help", "dry_run"):
            assert "(default:" in (action.help or "") or action.required, action.dest


@pytest.mark.mnist
@pytest.mark.slow
def test_export_verifies_and_evaluates_on_real_mnist(checkpoint: Path, real_mnist: Path, tmp_path: Path) -> None:
    card = export_checkpoint(checkpoint, tmp_path / "capsnet-real", data_dir=str(real_mnist), torchscript=False)
    assert card["export"]["parity"]["images"] == "MNIST test images 0-63"
    assert card["metrics"]["n"] == 10_000
    split = load_split(real_mnist, "test")
    result = evaluate_model_dir(tmp_path / "capsnet-real", split, batch_size=1000)
    assert result["test_error"] == card["metrics"]["mnist_test_error"]
    images = to_float(split.images[:64])
    model, _, _ = load_model(checkpoint)
    with torch.no_grad():
        ref = model(torch.from_numpy(images))
    (lengths,) = session(tmp_path / "capsnet-real" / "capsnet.onnx").run(["lengths"], {"image": images})
    assert np.abs(lengths - ref.lengths.numpy()).max() <= 1e-4


def test_em_export_has_no_decoder_and_asks_to_be_served_one_image_per_run(tmp_path: Path) -> None:
    arch = ARCHITECTURES["em"]
    config = arch.make_config("tiny", {})
    torch.manual_seed(0)
    model = arch.build(config).eval()
    out = tmp_path / "tiny-em"
    card = export_module(model, "em", config, out, name="tiny-em")
    assert set(card) == CARD_FIELDS | {"serving"}
    assert card["decoder"] is None and card["pose_shape"] == [4, 4] and card["scores"]["kind"] == "activation"
    assert [(o["name"], o["role"]) for o in card["outputs"]] == [
        ("activations", "scores"), ("poses", "poses"), ("parts", "parts")
    ]  # fmt: skip
    cells = EMCapsNetConfig.from_dict(config).caps2_grid ** 2
    assert card["outputs"][2]["shape"] == [-1, cells, config["caps2_types"]]  # ConvCaps2: cells x types
    assert card["serving"]["max_batch_size"] == 1
    assert "python -m training.benchmarks.speed --arch em" in card["serving"]["why"]
    assert sorted(p.name for p in out.iterdir() if p.suffix == ".onnx") == ["capsnet.onnx"]
    verify_model_dir(out)
    rebuilt, _, parity = rebuild_model(out)  # the routing geometry's constants are rebuilt from the config
    for key, tensor in model.state_dict().items():
        torch.testing.assert_close(rebuilt.state_dict()[key], tensor, rtol=0, atol=0)
    assert set(parity) == {"capsnet.onnx:activations", "capsnet.onnx:poses", "capsnet.onnx:parts"}


def test_parity_tolerance_scales_with_large_outputs_only() -> None:
    big = np.array([[134.0, -2.0]], np.float32)
    small = np.array([[0.5, -0.2]], np.float32)
    # 134 * 1e-4 allows 0.0134 on an unbounded output; a bounded one keeps the absolute 1e-4
    assert export_graphs.max_abs_diffs("g", 1, ["poses"], ["poses"], [big], [big + 0.001])["poses"] > 1e-4
    with pytest.raises(ExportError, match=r"poses differs from PyTorch by 0\.02"):
        export_graphs.max_abs_diffs("g", 1, ["poses"], ["poses"], [big], [big + 0.02])
    with pytest.raises(ExportError, match=r"tolerance 0\.0001"):
        export_graphs.max_abs_diffs("g", 1, ["lengths"], ["scores"], [small], [small + 0.001])

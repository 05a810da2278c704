"""Export a capsule network to a verified model directory: ONNX graphs, TorchScript twin, torch.export programs, card.

The layout and the card are specified in docs/model-card.md. Everything an architecture contributes
comes from its `ExportSpec` in training/fitting/architectures.py, so this module has no per-architecture code.
"""

from __future__ import annotations

import argparse
import copy
import json
import logging
import os
import shlex
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import onnxruntime as ort
import torch
from torch import nn

from model.capsnet import count_parameters
from service.contract import DECODER_FILE, GRAPH_FILE, sha256_file
from training.data.mnist import DATA_DIR_ENV, MNISTSplit, load_split
from training.entry import bundled_repository, cli_error, data_dir_option, sibling_command
from training.export.card import DECODER_INPUTS, INPUT_NAME, CardIdentity, build_card
from training.export.directory import (
    ARTIFACTS,
    DECODER_PROGRAM,
    MIN_OPSET,
    PROGRAM,
    Artifacts,
    check_out_dir,
    check_request,
    write_model_dir,
)
from training.export.directory import (
    verify_model_dir as verify_model_dir,  # re-exported: docs/model-card.md names it here
)
from training.export.graphs import (
    TOLERANCES,
    TORCHSCRIPT,
    VERIFY_BATCHES,
    DecoderGraph,
    ExportError,
    ImageGraph,
    class_masks,
    export_graph,
    export_program,
    to_numpy,
    trace_twin,
    verification_images,
)
from training.export.rebuild import PARITY_IMAGES, rebuild_model
from training.fitting.architectures import ExportSpec, get_architecture
from training.fitting.checkpoint import load_model, training_command
from training.fitting.onnx_eval import evaluate_session
from training.options import add_data_dir

log = logging.getLogger(__name__)

DEFAULT_OPSET = 18


def _export_spec(model: nn.Module, arch: str, model_config: dict[str, Any]) -> ExportSpec:
    entry = get_architecture(arch)
    if entry.export is None:
        raise ExportError(
            f"architecture {arch!r} cannot be exported: "
            "its entry in training/fitting/architectures.py has no export spec"
        )
    spec = entry.export(model, model_config)
    roles = [o.role for o in spec.outputs]
    if roles.count("scores") != 1:
        raise ExportError(
            f"architecture {arch!r}: its export spec must have exactly one scores output, has roles {roles}"
        )
    if spec.decode is not None and "poses" not in roles:
        raise ExportError(f"architecture {arch!r}: a decoder needs a poses output, the outputs have roles {roles}")
    return spec


RECONSTRUCTION = ["reconstruction"]  # the decoder's one output: its name and its role


@dataclass
class _DecoderCheck:
    """The decoder graph with its verification inputs (poses, one-hot masks) and PyTorch's outputs on them."""

    graph: DecoderGraph
    inputs: list[np.ndarray]
    reference: dict[int, list[np.ndarray]]


def _export_decoder(
    model: nn.Module, spec: ExportSpec, poses: np.ndarray, num_classes: int, opset: int, out: Artifacts
) -> _DecoderCheck:
    """decoder.onnx from (poses, one-hot masks cycling through the classes), checked against PyTorch."""
    inputs = [poses, class_masks(len(poses), num_classes)]
    decoder = DecoderGraph(model, spec).eval()
    with torch.no_grad():
        reference = {b: to_numpy(decoder(*(torch.from_numpy(a[:b]) for a in inputs))) for b in VERIFY_BATCHES}
    out.protos[DECODER_FILE], out.parity[DECODER_FILE], _ = export_graph(
        decoder, DECODER_FILE, inputs, list(DECODER_INPUTS), RECONSTRUCTION, RECONSTRUCTION, reference, opset
    )
    return _DecoderCheck(decoder, inputs, reference)


def _onnx_metrics(session: ort.InferenceSession, scores: str, num_classes: int, split: MNISTSplit) -> dict[str, Any]:
    log.info("evaluating %s on %d test images with ONNX Runtime", GRAPH_FILE, len(split))
    return evaluate_session(session, INPUT_NAME, scores, num_classes, split).card_metrics("onnxruntime")


def export_module(
    model: nn.Module,
    arch: str,
    model_config: dict[str, Any],
    out_dir: Path | str,
    *,
    name: str,
    verify_images: np.ndarray | None = None,
    training_info: dict[str, Any] | None = None,
    metrics: dict[str, Any] | None = None,
    torchscript: bool = True,
    pt2: bool = False,
    opset: int = DEFAULT_OPSET,
    version: str = "1",
    seed: int = 0,
    evaluate_on: MNISTSplit | None = None,
    verify_description: str | None = None,
) -> dict[str, Any]:
    """Write and verify a model directory for `model`; return its card.

    Args:
        verify_images: (N, C, H, W) uint8 or float in [0, 1] for the parity checks (repeated up to 64 images);
            None: uniform random images drawn with `seed`.
        verify_description: what the verification images are, for the card (default: how many were given).
        training_info: merged into the card's `training` object.
        metrics: merged into the card's `metrics` object (superseded by `evaluate_on`).
        evaluate_on: a split to evaluate the exported ONNX graph on with ONNX Runtime for the card's metrics.
    """
    check_request(name, opset, out_dir)
    model = copy.deepcopy(model).cpu().eval()
    spec = _export_spec(model, arch, model_config)
    roles: list[str] = [o.role for o in spec.outputs]
    names = [o.name for o in spec.outputs]
    images, images_source = verification_images(verify_images, spec.input_shape, seed)
    out = Artifacts(parity={"images": verify_description or images_source, "tolerance": dict(TOLERANCES)})
    graph = ImageGraph(model, spec).eval()
    with torch.no_grad():
        reference = {b: to_numpy(graph(torch.from_numpy(images[:b]))) for b in VERIFY_BATCHES}
    out.protos[GRAPH_FILE], out.parity[GRAPH_FILE], session = export_graph(
        graph, GRAPH_FILE, [images], [INPUT_NAME], names, roles, reference, opset
    )
    full = reference[max(VERIFY_BATCHES)]
    num_classes = int(full[roles.index("scores")].shape[1])
    decoder = None
    if spec.decode is not None:
        decoder = _export_decoder(model, spec, full[roles.index("poses")], num_classes, opset, out)
    decoder_inputs = decoder.inputs if decoder is not None else []
    if torchscript:
        out.twin, out.parity[TORCHSCRIPT] = trace_twin(graph, images, decoder_inputs, names, roles, reference)
    if pt2:
        out.programs[PROGRAM], out.parity[PROGRAM] = export_program(graph, PROGRAM, [images], names, roles, reference)
        if decoder is not None:
            out.programs[DECODER_PROGRAM], out.parity[DECODER_PROGRAM] = export_program(
                decoder.graph, DECODER_PROGRAM, decoder.inputs, RECONSTRUCTION, RECONSTRUCTION, decoder.reference
            )
    if evaluate_on is not None:
        metrics = _onnx_metrics(session, names[roles.index("scores")], num_classes, evaluate_on)
    identity = CardIdentity(name, version, arch, model_config, count_parameters(model))
    card = build_card(identity, spec, full, decoder_inputs, out.parity, opset, metrics, training_info)
    return write_model_dir(Path(out_dir), card, out)


def _test_split(data_dir: str | None, required: bool) -> MNISTSplit | None:
    """The MNIST test split; None when no data directory is configured and none is required."""
    if data_dir is None and not os.environ.get(DATA_DIR_ENV):
        if required:
            raise ExportError(
                f"no MNIST test set to evaluate on: pass --data-dir (or set ${DATA_DIR_ENV}), or --no-evaluate"
            )
        log.warning("no MNIST data directory: verifying on random images")
        return None
    return load_split(data_dir, "test")


def _training_info(checkpoint: Path, state: dict[str, Any]) -> dict[str, Any]:
    command = state.get("command")
    if isinstance(command, list):
        command = training_command(command)
    train_config = state.get("train_config") or {}
    return {
        "command": shlex.join(command) if isinstance(command, list) else command,
        "epochs": state.get("epoch"),
        "seed": train_config.get("seed"),
        "data_sha256": state.get("data_hashes") or {},
        "history": state.get("history") or [],
        "train_config": train_config,
        "checkpoint": {"file": checkpoint.name, "sha256": sha256_file(checkpoint)},
        **({"init_from": state["init_from"]} if state.get("init_from") else {}),  # a warm start's model directory
    }


def export_checkpoint(
    checkpoint: Path | str,
    out_dir: Path | str,
    *,
    name: str | None = None,
    data_dir: str | None = None,
    evaluate: bool = True,
    opset: int = DEFAULT_OPSET,
    torchscript: bool = True,
    pt2: bool = False,
    version: str = "1",
    seed: int = 0,
) -> dict[str, Any]:
    """Export a training checkpoint; verify on MNIST test images and evaluate on the test set when data is available.

    Args:
        name: the model name (default: the name of out_dir).
        data_dir: MNIST IDX directory (default: $CAPSNET_DATA_DIR); needed when `evaluate` is set.
    """
    name = name or Path(out_dir).resolve().name
    check_request(name, opset, Path(out_dir).resolve())
    path = Path(checkpoint)
    model, arch, state = load_model(path)
    split = _test_split(data_dir, required=evaluate)
    n = max(VERIFY_BATCHES)
    return export_module(
        model, arch.name, state["model_config"], out_dir,
        name=name, training_info=_training_info(path, state), torchscript=torchscript, pt2=pt2, opset=opset,
        version=version,
        seed=seed, evaluate_on=split if evaluate else None,
        verify_images=None if split is None else split.images[:n],
        verify_description=None if split is None else f"MNIST test images 0-{n - 1}",
    )  # fmt: skip


def export_from_model_dir(
    model_dir: str | os.PathLike[str],
    out_dir: str | os.PathLike[str],
    *,
    name: str,
    test: MNISTSplit | None,
    evaluate: bool = True,
    version: str | None = None,
    **export_options: Any,
) -> dict[str, Any]:
    """Rebuild the model of `model_dir` and export it again with today's export spec (e.g. to add an output).

    The card keeps the old training provenance and records where the weights came from; `version`
    defaults to the old version plus one. `out_dir` may be `model_dir` itself: nothing is written
    until the rebuilt model reproduces the old graphs and the new export has verified itself.
    """
    model, card, parity = rebuild_model(model_dir, test)
    old_version = str(card.get("version", "1"))
    training = dict(card.get("training") or {})
    training["rebuilt_from"] = {
        "model": card["name"],
        "version": old_version,
        "sha256": {f: e["sha256"] for f, e in card["files"].items()},
        "images": "uniform random images, seed 0" if test is None else f"MNIST test images 0-{PARITY_IMAGES - 1}",
        "max_abs_difference": parity,
    }
    n = max(VERIFY_BATCHES)
    return export_module(
        model, card["architecture"], card["model_config"], Path(out_dir),
        name=name, training_info=training, metrics=None if evaluate else card.get("metrics"),
        version=version or (str(int(old_version) + 1) if old_version.isdigit() else f"{old_version}.1"),
        evaluate_on=test if evaluate else None,
        verify_images=None if test is None else test.images[:n],
        verify_description=None if test is None else f"MNIST test images 0-{n - 1}",
        **export_options,
    )  # fmt: skip


def _summary(card: dict[str, Any], out_dir: Path, dry_run: bool) -> dict[str, Any]:
    parity = card["export"]["parity"]
    worst = {f: max(max(d.values()) for d in parity[f].values()) for f in ARTIFACTS if f in parity}
    return {
        "model_dir": None if dry_run else str(out_dir),
        "dry_run": dry_run,
        "name": card["name"],
        "parameters": card["parameters"],
        "mnist_test_error": card["metrics"]["mnist_test_error"],
        "n": card["metrics"]["n"],
        "files": {f: e["bytes"] for f, e in card["files"].items()},
        "max_abs_difference": worst,
    }


def next_steps(out: Path, data_dir: str | None) -> list[str]:
    """What to run after an export: evaluate, calibrate the "not a digit" score, serve."""
    data = data_dir_option(data_dir)
    model = shlex.quote(str(out))
    if out.resolve().parent == bundled_repository().resolve():
        serve = "make serve"
    else:
        serve = f"{sibling_command('capsnet-serve')} --model-repository {shlex.quote(str(out.parent))}"
    return [
        f"next: evaluate it:  {sibling_command('capsnet-evaluate')} --model {model}{data}",
        f'      calibrate its "not a digit" score (without it reject_ood=true answers 409):  '
        f"{sibling_command('capsnet-ood')} --model {model}{data} --write-card",
        f"      serve it beside the other models of {out.parent}:  {serve}",
    ]


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="capsnet-export",
        description="Export a training checkpoint to a verified model directory (ONNX graphs, TorchScript twin, "
        "model.json); prints a JSON summary.",
    )
    p.add_argument("checkpoint", metavar="CKPT", nargs="?", help="training checkpoint (.pt) written by capsnet-train")
    p.add_argument(
        "--from-model-dir",
        metavar="DIR",
        default=None,
        help="instead of CKPT: rebuild the PyTorch model from an exported model directory's graphs, check that it "
        "reproduces them, and export it again (keeps the card's training record; version + 1) (default: off)",
    )
    p.add_argument(
        "--out",
        required=True,
        help="model directory to write, e.g. model/zoo/my-capsnet; an existing one only with --force (required)",
    )
    p.add_argument(
        "--force",
        action="store_true",
        help="replace the model directory --out if it exists (default: refuse; export to a new name instead)",
    )
    p.add_argument(
        "--name",
        default=None,
        help="model name, [a-z0-9][a-z0-9._-]*; must equal the name of --out (default: the name of --out)",
    )
    p.add_argument(
        "--version",
        default=None,
        help="model version written to the card (default: 1; with --from-model-dir the old version + 1)",
    )
    add_data_dir(p, "MNIST IDX directory for verification images and the test error")
    p.add_argument(
        "--opset", type=int, default=DEFAULT_OPSET, help=f"ONNX opset, {MIN_OPSET} or newer (default: {DEFAULT_OPSET})"
    )
    p.add_argument(
        "--no-torchscript", action="store_true", help="do not write the TorchScript twin capsnet.ts (default: write it)"
    )
    p.add_argument(
        "--pt2",
        action="store_true",
        help="also write torch.export programs capsnet.pt2 (and decoder.pt2), verified like the others (default: off)",
    )
    p.add_argument(
        "--no-evaluate",
        action="store_true",
        help="skip the test-set evaluation; the card's metrics stay null (default: evaluate)",
    )
    p.add_argument(
        "--dry-run",
        action="store_true",
        help="export and verify in a temporary directory without evaluating, write nothing to --out, exit",
    )
    p.add_argument(
        "--seed",
        type=int,
        default=0,
        help="seed of the random verification images used without MNIST data (default: 0)",
    )
    return p


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if (args.checkpoint is None) == (args.from_model_dir is None):
        parser.error("give either a checkpoint CKPT or --from-model-dir DIR")
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    out = Path(args.out)
    name = args.name or out.resolve().name
    try:
        if not args.dry_run:
            check_out_dir(out, args.force)
        with tempfile.TemporaryDirectory() as tmp:
            target = Path(tmp) / name if args.dry_run else out
            evaluate = not (args.dry_run or args.no_evaluate)
            options = dict(opset=args.opset, torchscript=not args.no_torchscript, pt2=args.pt2, seed=args.seed)
            if args.from_model_dir is not None:
                split = _test_split(args.data_dir, required=evaluate)
                card = export_from_model_dir(
                    args.from_model_dir, target, name=name, test=split, evaluate=evaluate, version=args.version,
                    **options,
                )  # fmt: skip
            else:
                card = export_checkpoint(
                    args.checkpoint, target, name=name, data_dir=args.data_dir, evaluate=evaluate,
                    version=args.version or "1", **options,
                )  # fmt: skip
    except (ValueError, FileNotFoundError) as e:  # ExportError, IDXError and checkpoint errors are ValueErrors
        return cli_error("capsnet-export", e)
    print(json.dumps(_summary(card, out, args.dry_run)))
    if not args.dry_run:
        print("\n".join(next_steps(out, args.data_dir)), file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())

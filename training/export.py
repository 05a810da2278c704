"""Export a capsule network to a verified model directory: ONNX graphs, TorchScript twin, torch.export programs, card.

The layout and the card are specified in docs/model-card.md. Everything an architecture contributes
comes from its `ExportSpec` in training/architectures.py, so this module has no per-architecture code.
"""

from __future__ import annotations

import argparse
import copy
import io
import json
import logging
import os
import platform
import re
import shlex
import shutil
import subprocess
import sys
import tempfile
import warnings
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import onnxruntime as ort
import torch
from torch import nn

from model.capsnet import count_parameters
from training.architectures import ExportSpec, get_architecture
from training.checkpoint import load_model, training_command
from training.data import DATA_DIR_ENV, MNISTSplit, load_split, to_float
from training.onnx_eval import (
    CARD_FILE,
    CARD_FORMAT_VERSION,
    ModelDirError,
    check_model_dir,
    evaluate_session,
    make_session,
    sha256_file,
)
from training.rebuild import export_from_model_dir

log = logging.getLogger(__name__)

CAPSNET_ONNX = "capsnet.onnx"
DECODER_ONNX = "decoder.onnx"
TORCHSCRIPT = "capsnet.ts"
PROGRAM = "capsnet.pt2"  # torch.export program of forward (for AOTInductor / ExecuTorch users)
DECODER_PROGRAM = "decoder.pt2"
ARTIFACTS = (CAPSNET_ONNX, DECODER_ONNX, TORCHSCRIPT, PROGRAM, DECODER_PROGRAM)
DEFAULT_OPSET = 18
MIN_OPSET = 18
CONTROL_FLOW_OPS = frozenset({"Loop", "If", "Scan"})
TOLERANCES: dict[str, float] = {
    "scores": 1e-4,
    "poses": 1e-4,
    "reconstruction": 1e-3,
    "explanation": 1e-3,
}  # max abs difference, by role
VERIFY_BATCHES = (1, 64)
NAME_PATTERN = re.compile(r"[a-z0-9][a-z0-9._-]*")
REPO_ROOT = Path(__file__).resolve().parents[1]
INPUT_NAME = "image"
DECODER_INPUTS = ("poses", "mask")
NOISY_LOGGERS = ("torch.onnx._internal.exporter._registration", "onnx_ir")  # "torchvision is not installed", pass stats


class ExportError(ModelDirError):
    """An export that cannot be written or fails its own verification; the message names the file."""


def verify_model_dir(path: str | os.PathLike[str]) -> dict[str, Any]:
    """Check every file of a model directory against the sha256 in its card; return the card."""
    try:
        return check_model_dir(path)
    except ModelDirError as e:
        raise ExportError(str(e)) from e


class ImageGraph(nn.Module):
    """image (N, C, H, W) -> the spec's outputs; `decode` (poses, mask) -> reconstruction when there is a decoder."""

    def __init__(self, model: nn.Module, spec: ExportSpec) -> None:
        super().__init__()
        self.model = model
        self.spec = spec

    def forward(self, image: torch.Tensor) -> tuple[torch.Tensor, ...]:
        return tuple(self.spec.forward(self.model, image))

    def decode(self, poses: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        if self.spec.decode is None:
            raise RuntimeError("this model has no decoder")
        return self.spec.decode(self.model, poses, mask)


class DecoderGraph(nn.Module):
    """(poses, mask) -> reconstruction: the graph of decoder.onnx."""

    def __init__(self, model: nn.Module, spec: ExportSpec) -> None:
        super().__init__()
        if spec.decode is None:
            raise ValueError("this model has no decoder")
        self.model = model
        self.decode = spec.decode

    def forward(self, poses: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        return self.decode(self.model, poses, mask)


@contextmanager
def _quiet_torch() -> Iterator[None]:
    """Silence the chatter of torch.jit, torch.onnx and onnx_ir internals; our own warnings and errors still show."""
    loggers = [logging.getLogger(name) for name in NOISY_LOGGERS]
    levels = [logger.level for logger in loggers]
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=r".*torch\.jit\.\w+` is deprecated.*")
        warnings.filterwarnings("ignore", message=r".*LeafSpec.*")
        warnings.filterwarnings("ignore", message=r".*The axis name: \w+ will not be used.*")
        for logger in loggers:
            logger.setLevel(logging.ERROR)
        try:
            yield
        finally:
            for logger, level in zip(loggers, levels, strict=True):
                logger.setLevel(level)


def control_flow_nodes(model: onnx.ModelProto) -> list[str]:
    """Loop/If/Scan nodes anywhere in `model`: its graph, subgraphs held in attributes, and local functions."""

    def walk(nodes: Iterable[onnx.NodeProto]) -> Iterator[str]:
        for node in nodes:
            if node.op_type in CONTROL_FLOW_OPS:
                yield f"{node.op_type} {node.name!r}"
            for attr in node.attribute:
                for sub in [attr.g] if attr.HasField("g") else attr.graphs:
                    yield from walk(sub.node)

    return [*walk(model.graph.node), *(found for f in model.functions for found in walk(f.node))]


def _to_onnx(
    module: nn.Module, args: tuple[torch.Tensor, ...], inputs: list[str], outputs: list[str], opset: int
) -> onnx.ModelProto:
    """Export with the dynamo exporter and a dynamic batch axis on every input.

    The onnxscript optimizer is off: it folds `x + 1e-8` into `x`, which drops the EPS of
    `capsule_length` and moves the lengths by up to 1e-4.
    """
    batch = torch.export.Dim("batch")
    with _quiet_torch():
        program = torch.onnx.export(
            module,
            args,
            input_names=inputs,
            output_names=outputs,
            opset_version=opset,
            dynamic_shapes=tuple({0: batch} for _ in args),
            dynamo=True,
            optimize=False,
            verbose=False,
        )
    if program is None:
        raise ExportError("torch.onnx.export returned no program")
    return program.model_proto


def _check_graph(proto: onnx.ModelProto, file: str, inputs: list[str], outputs: list[str], opset: int) -> None:
    try:
        onnx.checker.check_model(proto, full_check=True)
    except (onnx.checker.ValidationError, onnx.shape_inference.InferenceError) as e:
        raise ExportError(f"{file}: onnx.checker rejects the graph: {e}") from e
    loops = control_flow_nodes(proto)
    if loops:
        raise ExportError(f"{file}: routing is not unrolled, the graph has {', '.join(loops)}")
    default_opset = next((o.version for o in proto.opset_import if o.domain in ("", "ai.onnx")), 0)
    if default_opset < opset:
        raise ExportError(f"{file}: opset {default_opset}, expected {opset}")
    found_in, found_out = [i.name for i in proto.graph.input], [o.name for o in proto.graph.output]
    if found_in != inputs or found_out != outputs:
        raise ExportError(f"{file}: inputs {found_in} and outputs {found_out}, expected {inputs} and {outputs}")
    for value in [*proto.graph.input, *proto.graph.output]:
        dim0 = value.type.tensor_type.shape.dim[0]
        if not dim0.dim_param:
            raise ExportError(f"{file}: {value.name} has a fixed batch axis ({dim0.dim_value}); it must be dynamic")


def _max_abs_diffs(
    file: str, batch: int, names: list[str], roles: list[str], expected: list[np.ndarray], got: list[np.ndarray]
) -> dict[str, float]:
    """Max abs difference per output; raise when a shape differs or a difference exceeds its role's tolerance."""
    diffs: dict[str, float] = {}
    for name, role, want, have in zip(names, roles, expected, got, strict=True):
        if have.shape != want.shape:
            raise ExportError(
                f"{file}: {name} has shape {list(have.shape)} at batch {batch}, PyTorch gives {list(want.shape)}"
            )
        diff = float(np.max(np.abs(want.astype(np.float64) - have))) if want.size else 0.0
        tolerance = TOLERANCES[role]
        if not diff <= tolerance:  # also catches NaN
            raise ExportError(
                f"{file}: {name} differs from PyTorch by {diff:.3g} at batch {batch} (tolerance {tolerance:g})"
            )
        diffs[name] = diff
    return diffs


def _numpy(tensors: tuple[torch.Tensor, ...] | torch.Tensor) -> list[np.ndarray]:
    items = (tensors,) if isinstance(tensors, torch.Tensor) else tensors
    return [t.detach().cpu().numpy() for t in items]


def _verification_images(
    images: np.ndarray | None, input_shape: tuple[int, int, int], seed: int
) -> tuple[np.ndarray, str]:
    """max(VERIFY_BATCHES) float32 images in [0, 1] (uint8 scaled, short inputs repeated) and how they were chosen."""
    n = max(VERIFY_BATCHES)
    if images is None:
        rng = np.random.default_rng(seed)
        return rng.random((n, *input_shape), dtype=np.float32), f"uniform random images in [0, 1], seed {seed}"
    if images.ndim != 4 or tuple(images.shape[1:]) != input_shape or len(images) == 0:
        raise ExportError(
            f"verification images have shape {list(images.shape)}, expected [N, {', '.join(map(str, input_shape))}]"
        )
    floats = to_float(images) if images.dtype == np.uint8 else images.astype(np.float32)
    return np.resize(floats, (n, *input_shape)), f"{len(images)} given images"


def _class_masks(n: int, num_classes: int) -> np.ndarray:
    """One-hot masks (n, K) cycling through the classes, so the decoder is checked on every class."""
    return np.eye(num_classes, dtype=np.float32)[np.arange(n) % num_classes]


def _git_state() -> dict[str, Any]:
    def git(*args: str) -> str | None:
        try:
            done = subprocess.run(["git", *args], cwd=REPO_ROOT, capture_output=True, text=True, timeout=10, check=True)
        except (OSError, subprocess.SubprocessError):
            return None
        return done.stdout.strip()

    commit = git("rev-parse", "HEAD")
    status = git("status", "--porcelain", "--untracked-files=no", "--", "model", "training")
    return {"git_commit": commit, "git_dirty": None if status is None else bool(status)}


def _tool_versions() -> dict[str, str]:
    return {
        "torch": torch.__version__,
        "onnx": onnx.__version__,
        "onnxruntime": ort.__version__,
        "python": platform.python_version(),
    }


def _stamp(proto: onnx.ModelProto, card: dict[str, Any]) -> bytes:
    """Carry the card (without `files`) in metadata_props; return the serialized model."""
    del proto.metadata_props[:]
    onnx.helper.set_model_props(
        proto,
        {
            "capsnet.card": json.dumps(card),
            "capsnet.format_version": str(card["format_version"]),
            "capsnet.name": card["name"],
            "capsnet.version": card["version"],
            "capsnet.architecture": card["architecture"],
            "capsnet.classes": json.dumps(card["classes"]),
            "capsnet.scores_output": card["scores"]["output"],
        },
    )
    proto.producer_name = "capsnet-serve"
    proto.doc_string = card["description"]
    return proto.SerializeToString()


def _install(staging: Path, out_dir: Path) -> None:
    """Move the verified files into out_dir (card last) and drop artifacts a previous export left behind."""
    out_dir.mkdir(parents=True, exist_ok=True)
    for name in ARTIFACTS:
        if (staging / name).exists():
            os.replace(staging / name, out_dir / name)
        else:
            (out_dir / name).unlink(missing_ok=True)
    os.replace(staging / CARD_FILE, out_dir / CARD_FILE)


def _check_request(name: str, opset: int, out_dir: Path | str) -> None:
    if not NAME_PATTERN.fullmatch(name):
        raise ExportError(f"model name {name!r} is not URL-safe: use [a-z0-9][a-z0-9._-]*")
    if Path(out_dir).name != name:
        raise ExportError(
            f"model name {name!r} differs from its directory name {Path(out_dir).name!r}; they must match"
        )
    if opset < MIN_OPSET:
        raise ExportError(f"opset {opset} is too old: use {MIN_OPSET} or newer")


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
    _check_request(name, opset, out_dir)
    entry = get_architecture(arch)
    if entry.export is None:
        raise ExportError(
            f"architecture {arch!r} cannot be exported: its entry in training/architectures.py has no export spec"
        )
    model = copy.deepcopy(model).cpu().eval()
    spec = entry.export(model, model_config)
    roles: list[str] = [o.role for o in spec.outputs]
    if roles.count("scores") != 1:
        raise ExportError(
            f"architecture {arch!r}: its export spec must have exactly one scores output, has roles {roles}"
        )
    images, images_source = _verification_images(verify_images, spec.input_shape, seed)
    images_source = verify_description or images_source
    graph = ImageGraph(model, spec).eval()
    parity: dict[str, Any] = {"images": images_source, "tolerance": dict(TOLERANCES)}
    protos: dict[str, onnx.ModelProto] = {}
    with torch.no_grad():
        reference = {b: _numpy(graph(torch.from_numpy(images[:b]))) for b in VERIFY_BATCHES}
    names = [o.name for o in spec.outputs]
    protos[CAPSNET_ONNX], parity[CAPSNET_ONNX], session = _export_graph(
        graph, CAPSNET_ONNX, [images], [INPUT_NAME], names, roles, reference, opset
    )
    full = reference[max(VERIFY_BATCHES)]
    num_classes = int(full[roles.index("scores")].shape[1])
    decoder_inputs: list[np.ndarray] = []
    decoder: DecoderGraph | None = None
    decoder_reference: dict[int, list[np.ndarray]] = {}
    recon = ["reconstruction"]  # the decoder's one output: its name and its role
    if spec.decode is not None:
        if "poses" not in roles:
            raise ExportError(f"architecture {arch!r}: a decoder needs a poses output, the outputs have roles {roles}")
        # decoder.onnx (and decoder.pt2) from (poses, one-hot masks), checked against PyTorch like capsnet.onnx.
        decoder_inputs = [full[roles.index("poses")], _class_masks(len(images), num_classes)]
        decoder = DecoderGraph(model, spec).eval()
        with torch.no_grad():
            decoder_reference = {
                b: _numpy(decoder(*(torch.from_numpy(a[:b]) for a in decoder_inputs))) for b in VERIFY_BATCHES
            }
        protos[DECODER_ONNX], parity[DECODER_ONNX], _ = _export_graph(
            decoder, DECODER_ONNX, decoder_inputs, list(DECODER_INPUTS), recon, recon, decoder_reference, opset
        )
    twin = None
    if torchscript:
        twin, parity[TORCHSCRIPT] = _trace_twin(graph, images, decoder_inputs, names, roles, reference)
    programs: dict[str, torch.export.ExportedProgram] = {}
    if pt2:
        programs[PROGRAM], parity[PROGRAM] = _export_program(graph, PROGRAM, [images], names, roles, reference)
        if decoder is not None:
            programs[DECODER_PROGRAM], parity[DECODER_PROGRAM] = _export_program(
                decoder, DECODER_PROGRAM, decoder_inputs, recon, recon, decoder_reference
            )
    if evaluate_on is not None:
        log.info("evaluating %s on %d test images with ONNX Runtime", CAPSNET_ONNX, len(evaluate_on))
        result = evaluate_session(session, INPUT_NAME, names[roles.index("scores")], num_classes, evaluate_on)
        metrics = {
            "mnist_test_error": result.test_error,
            "n": result.n,
            "errors": result.errors,
            "per_class_error": result.to_dict()["per_class_error"],
            "evaluated_with": "onnxruntime",
        }
    card = _card(
        name=name,
        version=version,
        arch=arch,
        model_config=model_config,
        spec=spec,
        parameters=count_parameters(model),
        outputs=full,
        num_classes=num_classes,
        decoder_inputs=decoder_inputs,
        metrics=metrics,
        training_info=training_info,
        opset=opset,
        parity=parity,
    )
    return _write(Path(out_dir), card, protos, twin, programs)


def _export_graph(
    module: nn.Module,
    file: str,
    arrays: list[np.ndarray],
    inputs: list[str],
    outputs: list[str],
    roles: list[str],
    reference: dict[int, list[np.ndarray]],
    opset: int,
) -> tuple[onnx.ModelProto, dict[str, Any], ort.InferenceSession]:
    """Export `module`, check the graph, and compare ONNX Runtime with PyTorch at every verification batch size."""
    log.info("exporting %s (opset %d)", file, opset)
    example = tuple(torch.from_numpy(a[:2]) for a in arrays)  # batch 2: the batch axis stays symbolic
    try:
        proto = _to_onnx(module, example, inputs, outputs, opset)
    except ExportError:
        raise
    except Exception as e:
        raise ExportError(f"{file}: torch.onnx.export failed: {e}") from e
    _check_graph(proto, file, inputs, outputs, opset)
    session = make_session(proto.SerializeToString())
    parity = {}
    for b in VERIFY_BATCHES:
        got = session.run(outputs, {name: a[:b] for name, a in zip(inputs, arrays, strict=True)})
        parity[f"batch_{b}"] = _max_abs_diffs(file, b, outputs, roles, reference[b], got)
    return proto, parity, session


def _trace_twin(
    graph: ImageGraph,
    images: np.ndarray,
    decoder_inputs: list[np.ndarray],
    names: list[str],
    roles: list[str],
    reference: dict[int, list[np.ndarray]],
) -> tuple[torch.jit.ScriptModule, dict[str, Any]]:
    """Trace `forward` (and `decode`) into TorchScript, reload it from bytes, and compare with PyTorch."""
    log.info("tracing %s", TORCHSCRIPT)
    methods: dict[str, tuple[torch.Tensor, ...]] = {"forward": (torch.from_numpy(images[:2]),)}
    if decoder_inputs:
        methods["decode"] = tuple(torch.from_numpy(a[:2]) for a in decoder_inputs)
    with _quiet_torch(), torch.no_grad():
        try:
            twin = torch.jit.trace_module(graph, methods)
        except Exception as e:
            raise ExportError(f"{TORCHSCRIPT}: torch.jit.trace failed: {e}") from e
        buffer = io.BytesIO()
        torch.jit.save(twin, buffer)
        buffer.seek(0)
        loaded = torch.jit.load(buffer)
        parity: dict[str, Any] = {}
        for b in VERIFY_BATCHES:
            diffs = _max_abs_diffs(
                TORCHSCRIPT, b, names, roles, reference[b], _numpy(loaded(torch.from_numpy(images[:b])))
            )
            if decoder_inputs:
                args = [torch.from_numpy(a[:b]) for a in decoder_inputs]
                want = _numpy(graph.decode(*args))
                got = _numpy(loaded.decode(*args))
                diffs |= _max_abs_diffs(TORCHSCRIPT, b, ["decode.reconstruction"], ["reconstruction"], want, got)
            parity[f"batch_{b}"] = diffs
    return twin, parity


def _export_program(
    module: nn.Module,
    file: str,
    arrays: list[np.ndarray],
    outputs: list[str],
    roles: list[str],
    reference: dict[int, list[np.ndarray]],
) -> tuple[torch.export.ExportedProgram, dict[str, Any]]:
    """torch.export with a dynamic batch axis; saved, reloaded from bytes and compared with PyTorch per batch size."""
    log.info("exporting %s (torch.export)", file)
    example = tuple(torch.from_numpy(a[:2]) for a in arrays)
    batch = torch.export.Dim("batch")
    with _quiet_torch(), torch.no_grad():
        try:
            program = torch.export.export(module, example, dynamic_shapes=tuple({0: batch} for _ in arrays))
        except Exception as e:
            raise ExportError(f"{file}: torch.export failed: {e}") from e
        buffer = io.BytesIO()
        torch.export.save(program, buffer)
        loaded = torch.export.load(io.BytesIO(buffer.getvalue())).module()
        parity: dict[str, Any] = {}
        for b in VERIFY_BATCHES:
            got = _numpy(loaded(*(torch.from_numpy(a[:b]) for a in arrays)))
            parity[f"batch_{b}"] = _max_abs_diffs(file, b, outputs, roles, reference[b], got)
    return program, parity


def _shape(array: np.ndarray) -> list[int]:
    return [-1, *(int(d) for d in array.shape[1:])]


def _card(
    *,
    name: str,
    version: str,
    arch: str,
    model_config: dict[str, Any],
    spec: ExportSpec,
    parameters: int,
    outputs: list[np.ndarray],
    num_classes: int,
    decoder_inputs: list[np.ndarray],
    metrics: dict[str, Any] | None,
    training_info: dict[str, Any] | None,
    opset: int,
    parity: dict[str, Any],
) -> dict[str, Any]:
    """The card without `files` (docs/model-card.md); shapes come from the measured PyTorch outputs."""
    roles = [o.role for o in spec.outputs]
    image_shape = [-1, *spec.input_shape]
    poses = outputs[roles.index("poses")] if "poses" in roles else None
    decoder = None
    if decoder_inputs:
        decoder = {
            "file": DECODER_ONNX,
            "inputs": [
                {"name": n, "shape": _shape(a), "datatype": "FP32"}
                for n, a in zip(DECODER_INPUTS, decoder_inputs, strict=True)
            ],
            "output": {"name": "reconstruction", "shape": image_shape, "datatype": "FP32"},
        }
    return {
        "format_version": CARD_FORMAT_VERSION,
        "name": name,
        "version": version,
        "description": spec.description,
        "architecture": arch,
        "model_config": model_config,
        "routing": spec.routing,
        "parameters": parameters,
        "input": {
            "name": INPUT_NAME,
            "shape": image_shape,
            "datatype": "FP32",
            "range": [0.0, 1.0],
            "layout": "NCHW",
            "normalization": "pixel / 255: white digit on black, as in the MNIST files; no mean or std shift",
        },
        "classes": [str(k) for k in range(num_classes)],
        "outputs": [
            {
                "name": o.name,
                "shape": _shape(a),
                "datatype": "FP32",
                "role": o.role,
                "description": o.description,
                **o.attributes,
            }
            for o, a in zip(spec.outputs, outputs, strict=True)
        ],
        "scores": {"output": spec.outputs[roles.index("scores")].name, "kind": spec.scores_kind},
        "pose_shape": None if poses is None else [int(d) for d in poses.shape[2:]],
        "decoder": decoder,
        "metrics": {"mnist_test_error": None, "n": 0, "evaluated_with": None, **(metrics or {})},
        "training": {
            "command": None,
            "epochs": None,
            "seed": None,
            "data_sha256": {},
            "history": [],
            **(training_info or {}),
        },
        "export": {
            "onnx_opset": opset,
            "tools": _tool_versions(),
            **_git_state(),
            "exported_at": datetime.now(timezone.utc).isoformat(timespec="seconds"),
            "parity": parity,
        },
    }


def _write(
    out_dir: Path,
    card: dict[str, Any],
    protos: dict[str, onnx.ModelProto],
    twin: torch.jit.ScriptModule | None,
    programs: dict[str, torch.export.ExportedProgram] | None = None,
) -> dict[str, Any]:
    """Write every file into a staging directory beside out_dir, hash them into the card, then move them in."""
    out_dir.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{out_dir.name}.export-", dir=out_dir.parent))
    try:
        for file, proto in protos.items():
            (staging / file).write_bytes(_stamp(proto, card))
        if twin is not None:
            with _quiet_torch():
                torch.jit.save(twin, str(staging / TORCHSCRIPT), _extra_files={CARD_FILE: json.dumps(card)})
        for file, program in (programs or {}).items():
            with _quiet_torch():
                torch.export.save(program, str(staging / file), extra_files={CARD_FILE: json.dumps(card)})
        files = {
            f: {"sha256": sha256_file(staging / f), "bytes": (staging / f).stat().st_size}
            for f in ARTIFACTS
            if (staging / f).exists()
        }
        card = {**card, "files": files}
        (staging / CARD_FILE).write_text(json.dumps(card, indent=2) + "\n")
        _install(staging, out_dir)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    log.info("wrote %s: %s", out_dir, ", ".join(f"{f} ({e['bytes']:,} bytes)" for f, e in files.items()))
    return verify_model_dir(out_dir)


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
    _check_request(name, opset, Path(out_dir).resolve())
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
    p.add_argument("--out", required=True, help="model directory to write, e.g. model/zoo/capsnet-mnist (required)")
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
    p.add_argument(
        "--data-dir",
        default=None,
        help="MNIST IDX directory for verification images and the test error (default: $CAPSNET_DATA_DIR)",
    )
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
        print(f"capsnet-export: error: {' '.join(str(e).split())}", file=sys.stderr)
        return 2
    print(json.dumps(_summary(card, out, args.dry_run)))
    return 0


if __name__ == "__main__":
    sys.exit(main())

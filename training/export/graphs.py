"""The graphs of an export (ONNX, TorchScript, torch.export), each checked against PyTorch or refused.

Used by training/export/exporter.py; every failure is an ExportError naming the file.
"""

from __future__ import annotations

import io
import logging
import warnings
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from typing import Any

import numpy as np
import onnx
import onnxruntime as ort
import torch
from torch import nn

from service.contract import ModelDirError, create_session
from training.data.mnist import to_float
from training.fitting.architectures import ExportSpec

log = logging.getLogger(__name__)

TORCHSCRIPT = "capsnet.ts"
CONTROL_FLOW_OPS = frozenset({"Loop", "If", "Scan"})
# max abs difference between ONNX Runtime and PyTorch, by output role
TOLERANCES: dict[str, float] = {
    "scores": 1e-4, "poses": 1e-4, "reconstruction": 1e-3, "explanation": 1e-3, "parts": 1e-3,
}  # fmt: skip
VERIFY_BATCHES = (1, 64)
NOISY_LOGGERS = ("torch.onnx._internal.exporter._registration", "onnx_ir")  # "torchvision is not installed", pass stats


class ExportError(ModelDirError):
    """An export that cannot be written or fails its own verification; the message names the file."""


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
def quiet_torch() -> Iterator[None]:
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


def to_onnx(
    module: nn.Module, args: tuple[torch.Tensor, ...], inputs: list[str], outputs: list[str], opset: int
) -> onnx.ModelProto:
    """Export with the dynamo exporter and a dynamic batch axis on every input.

    The onnxscript optimizer is off: it folds `x + 1e-8` into `x`, which drops the EPS of
    `capsule_length` and moves the lengths by up to 1e-4.
    """
    batch = torch.export.Dim("batch")
    with quiet_torch():
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


def check_onnx_graph(
    proto: onnx.ModelProto,
    file: str,
    inputs: list[str],
    outputs: list[str],
    error: type[ModelDirError] = ExportError,
) -> None:
    """What the service needs of a graph: onnx.checker passes, no control flow, the expected inputs and outputs,
    and a dynamic batch axis on each; else `error` naming the file."""
    try:
        onnx.checker.check_model(proto, full_check=True)
    except (onnx.checker.ValidationError, onnx.shape_inference.InferenceError) as e:
        raise error(f"{file}: onnx.checker rejects the graph: {e}") from e
    loops = control_flow_nodes(proto)
    if loops:
        raise error(f"{file}: routing is not unrolled, the graph has {', '.join(loops)}")
    found_in, found_out = [i.name for i in proto.graph.input], [o.name for o in proto.graph.output]
    if found_in != inputs or found_out != outputs:
        raise error(f"{file}: inputs {found_in} and outputs {found_out}, expected {inputs} and {outputs}")
    for value in [*proto.graph.input, *proto.graph.output]:
        dim0 = value.type.tensor_type.shape.dim[0]
        if not dim0.dim_param:
            raise error(f"{file}: {value.name} has a fixed batch axis ({dim0.dim_value}); it must be dynamic")


def default_opset(proto: onnx.ModelProto) -> int:
    """The version of the default (ai.onnx) domain the graph imports; 0 when it imports none."""
    return next((o.version for o in proto.opset_import if o.domain in ("", "ai.onnx")), 0)


def check_graph(proto: onnx.ModelProto, file: str, inputs: list[str], outputs: list[str], opset: int) -> None:
    """`check_onnx_graph`, and the graph imports at least `opset`."""
    check_onnx_graph(proto, file, inputs, outputs)
    if default_opset(proto) < opset:
        raise ExportError(f"{file}: opset {default_opset(proto)}, expected {opset}")


def max_abs_diffs(
    file: str, batch: int, names: list[str], roles: list[str], expected: list[np.ndarray], got: list[np.ndarray]
) -> dict[str, float]:
    """Max abs difference per output; raise when a shape differs or a difference exceeds its role's tolerance
    (times the output's largest magnitude where that exceeds 1)."""
    diffs: dict[str, float] = {}
    for name, role, want, have in zip(names, roles, expected, got, strict=True):
        if have.shape != want.shape:
            raise ExportError(
                f"{file}: {name} has shape {list(have.shape)} at batch {batch}, PyTorch gives {list(want.shape)}"
            )
        diff = float(np.max(np.abs(want.astype(np.float64) - have))) if want.size else 0.0
        # relative above magnitude 1: EM's pose matrices are unbounded (|M| ~ 100 after training, where float32
        # summation order alone moves the last ~1e-5 of a value); lengths, activations and images are not
        tolerance = TOLERANCES[role] * max(1.0, float(np.max(np.abs(want))) if want.size else 1.0)
        if not diff <= tolerance:  # also catches NaN
            raise ExportError(
                f"{file}: {name} differs from PyTorch by {diff:.3g} at batch {batch} (tolerance {tolerance:g})"
            )
        diffs[name] = diff
    return diffs


def to_numpy(tensors: tuple[torch.Tensor, ...] | torch.Tensor) -> list[np.ndarray]:
    items = (tensors,) if isinstance(tensors, torch.Tensor) else tensors
    return [t.detach().cpu().numpy() for t in items]


def verification_images(
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


def class_masks(n: int, num_classes: int) -> np.ndarray:
    """One-hot masks (n, K) cycling through the classes, so the decoder is checked on every class."""
    return np.eye(num_classes, dtype=np.float32)[np.arange(n) % num_classes]


def export_graph(
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
        proto = to_onnx(module, example, inputs, outputs, opset)
    except ExportError:
        raise
    except Exception as e:
        raise ExportError(f"{file}: torch.onnx.export failed: {e}") from e
    check_graph(proto, file, inputs, outputs, opset)
    session = create_session(proto.SerializeToString())
    parity = {}
    for b in VERIFY_BATCHES:
        got = session.run(outputs, {name: a[:b] for name, a in zip(inputs, arrays, strict=True)})
        parity[f"batch_{b}"] = max_abs_diffs(file, b, outputs, roles, reference[b], got)
    return proto, parity, session


def trace_twin(
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
    with quiet_torch(), torch.no_grad():
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
            diffs = max_abs_diffs(
                TORCHSCRIPT, b, names, roles, reference[b], to_numpy(loaded(torch.from_numpy(images[:b])))
            )
            if decoder_inputs:
                args = [torch.from_numpy(a[:b]) for a in decoder_inputs]
                want = to_numpy(graph.decode(*args))
                got = to_numpy(loaded.decode(*args))
                diffs |= max_abs_diffs(TORCHSCRIPT, b, ["decode.reconstruction"], ["reconstruction"], want, got)
            parity[f"batch_{b}"] = diffs
    return twin, parity


def export_program(
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
    with quiet_torch(), torch.no_grad():
        try:
            program = torch.export.export(module, example, dynamic_shapes=tuple({0: batch} for _ in arrays))
        except Exception as e:
            raise ExportError(f"{file}: torch.export failed: {e}") from e
        buffer = io.BytesIO()
        torch.export.save(program, buffer)
        loaded = torch.export.load(io.BytesIO(buffer.getvalue())).module()
        parity: dict[str, Any] = {}
        for b in VERIFY_BATCHES:
            got = to_numpy(loaded(*(torch.from_numpy(a[:b]) for a in arrays)))
            parity[f"batch_{b}"] = max_abs_diffs(file, b, outputs, roles, reference[b], got)
    return program, parity

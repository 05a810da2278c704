"""The model directory (docs/model-card.md): its file names, the card's schema, hashing, loading and ONNX sessions.

The one owner of the directory contract. Export writes through it; evaluation, the report, the benchmarks
and the service read through it. It imports neither torch nor FastAPI, so training code may import it.
"""

from __future__ import annotations

import hashlib
import json
import logging
import math
import os
import re
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import numpy as np
import onnxruntime as ort
from pydantic import BaseModel, ConfigDict, Field, PrivateAttr, ValidationError, model_validator

from service.runtime.ood import OODCalibration
from service.runtime.ood_pattern import vector_width

logger = logging.getLogger(__name__)

CARD_FILE = "model.json"
GRAPH_FILE = "capsnet.onnx"  # image -> outputs
DECODER_FILE = "decoder.onnx"  # (poses, mask) -> reconstruction, where the architecture has a decoder
CARD_FORMAT_VERSION = 1
SUPPORTED_FORMAT_VERSIONS = (CARD_FORMAT_VERSION,)
ALTERED = "the file was altered after export; re-export it with capsnet-export"


class ModelDirError(ValueError):
    """A model directory that cannot be used: missing or malformed card, missing or altered file."""


CardError = ModelDirError  # the service's name for it


class TensorSpec(BaseModel):
    model_config = ConfigDict(extra="allow")

    name: str
    shape: list[int]
    datatype: str = "FP32"


class InputSpec(TensorSpec):
    range: tuple[float, float] = Field(
        default=(0.0, 1.0), description="[low, high]: the values the model takes; the service refuses others"
    )

    @model_validator(mode="after")
    def _ordered_range(self) -> InputSpec:
        low, high = self.range
        if not (math.isfinite(low) and math.isfinite(high) and low < high):
            raise ValueError(f"input range must be two finite numbers, low < high, got {list(self.range)}")
        return self


class OutputSpec(TensorSpec):
    role: Literal["scores", "poses", "reconstruction", "explanation", "parts"]
    description: str = ""


class ReceptiveField(BaseModel):
    """The input pixels a grid cell of the explanation sees: rows r*stride .. r*stride + size - 1, same for columns."""

    size: int = Field(ge=1)
    stride: int = Field(ge=1)


class ScoresSpec(BaseModel):
    model_config = ConfigDict(extra="allow")

    output: str
    kind: str


class DecoderSpec(BaseModel):
    model_config = ConfigDict(extra="allow")

    file: str
    inputs: list[TensorSpec]
    output: TensorSpec

    def input_named(self, name: str) -> TensorSpec:
        for spec in self.inputs:
            if spec.name == name:
                return spec
        raise ModelDirError(f"decoder has no input named {name!r} (has {[s.name for s in self.inputs]})")


class ServingHints(BaseModel):
    """How the model likes to be served; the service's settings still bound every value."""

    model_config = ConfigDict(extra="allow")

    max_batch_size: int | None = Field(default=None, ge=1)


class FileEntry(BaseModel):
    sha256: str = Field(pattern=r"^[0-9a-f]{64}$")
    bytes: int = Field(ge=0)


class ModelCard(BaseModel):
    """The fields the service relies on; the rest of the card is kept as is and shown by the model endpoints."""

    model_config = ConfigDict(extra="allow", protected_namespaces=())

    format_version: int
    name: str = Field(pattern=r"^[a-z0-9][a-z0-9._-]*$")
    version: str = "1"
    description: str = ""
    architecture: str
    input: InputSpec
    classes: list[str] = Field(min_length=1)
    outputs: list[OutputSpec] = Field(min_length=1)
    scores: ScoresSpec
    pose_shape: list[int] = Field(min_length=1)
    decoder: DecoderSpec | None = None
    serving: ServingHints | None = None
    metrics: dict[str, Any] | None = None
    ood: dict[str, Any] | None = None  # the "not a digit" calibration (service.runtime.ood)
    files: dict[str, FileEntry] = Field(default_factory=dict)
    _ood: OODCalibration | None = PrivateAttr(default=None)

    @model_validator(mode="after")
    def _consistent(self) -> ModelCard:
        if self.format_version not in SUPPORTED_FORMAT_VERSIONS:
            raise ValueError(f"format_version {self.format_version} is not supported ({SUPPORTED_FORMAT_VERSIONS})")
        if self.input.datatype != "FP32" or len(self.input.shape) < 3 or self.input.shape[0] != -1:
            raise ValueError(
                f"input must be FP32 images with a dynamic batch dimension ([-1, C, H, W]), got {self.input}"
            )
        if any(d < 1 for d in self.input.shape[1:]):
            raise ValueError(f"input dimensions after the batch must be fixed, got {self.input.shape}")
        roles = {o.role for o in self.outputs}
        for role in ("scores", "poses"):
            if role not in roles:
                raise ValueError(f"no output with role {role!r}")
        k = len(self.classes)
        scores = self.output_named(self.scores.output)
        if scores.role != "scores" or scores.shape != [-1, k]:
            raise ValueError(f"scores output {scores.name!r} must have role 'scores' and shape [-1, {k}]")
        poses = self.output_for("poses")
        if poses.shape != [-1, k, *self.pose_shape]:
            raise ValueError(f"poses output shape {poses.shape} != [-1, {k}, *pose_shape {self.pose_shape}]")
        self._check_explanation(k)
        self._ood = self._parse_ood()
        if self.decoder is not None:
            if self.decoder.input_named("poses").shape != poses.shape:
                raise ValueError("decoder input 'poses' must have the poses output's shape")
            if self.decoder.input_named("mask").shape != [-1, k]:
                raise ValueError(f"decoder input 'mask' must have shape [-1, {k}]")
            if self.decoder.output.shape[1:] != self.input.shape[1:]:
                raise ValueError("decoder output must have the input image's shape")
        return self

    def _check_explanation(self, k: int) -> None:
        explanation = self.explanation
        if explanation is None:
            return
        if len(explanation.shape) != 4 or explanation.shape[:2] != [-1, k]:
            raise ValueError(f"explanation output shape {explanation.shape} != [-1, {k}, grid rows, grid columns]")
        field = self.receptive_field
        height, width = self.image_size
        rows, columns = explanation.shape[2:]
        if (rows - 1) * field.stride + field.size > height or (columns - 1) * field.stride + field.size > width:
            raise ValueError(f"explanation receptive field {field} of a {rows}x{columns} grid exceeds the input")

    def _parse_ood(self) -> OODCalibration | None:
        if self.ood is None:
            return None
        try:
            calibration = OODCalibration.from_card(self.ood)
        except (KeyError, TypeError, ValueError) as e:
            raise ValueError(f"ood calibration is malformed: {type(e).__name__} {e}") from e
        roles = {o.role for o in self.outputs}
        if calibration.needs_reconstruction and "reconstruction" not in roles:
            raise ValueError("ood calibration uses reconstruction distances but no output has role 'reconstruction'")
        network = calibration.network
        if network is not None:
            pose_size = math.prod(self.pose_shape)  # every card has a poses output (checked above)
            maps: dict[str, int] = {
                o.role: math.prod(o.shape[1:]) for o in self.outputs if o.role in ("explanation", "parts")
            }
            width = vector_width(network.inputs, len(self.classes), pose_size, "reconstruction" in roles, maps)
            if width != network.width:
                raise ValueError(
                    f"ood network takes {network.width} numbers per image, but this model's outputs give {width}"
                )
        return calibration

    @property
    def ood_calibration(self) -> OODCalibration | None:
        """The parsed `ood` object (docs/model-card.md), or None when the model has not been calibrated."""
        return self._ood

    def ood_inputs(
        self, outputs: Mapping[str, np.ndarray]
    ) -> tuple[np.ndarray, np.ndarray | None, np.ndarray | None, np.ndarray | None, np.ndarray | None]:
        """(scores, reconstruction, poses, routing map, parts) of a run's outputs for the "not a digit"
        calibration's `assess`: None for those it does not use. Raises ModelDirError when the model has no
        calibration."""
        calibration = self._ood
        if calibration is None:
            raise ModelDirError(f"model {self.name!r} has no 'not a digit' calibration")

        def role(name: str, needed: bool) -> np.ndarray | None:
            return outputs[self.output_for(name).name] if needed else None

        return (
            outputs[self.scores.output],
            role("reconstruction", calibration.needs_reconstruction),
            role("poses", calibration.needs_poses),
            role("explanation", calibration.needs_explanation),
            role("parts", calibration.needs_parts),
        )

    @property
    def explanation(self) -> OutputSpec | None:
        """The routing-map output (role "explanation"), or None when the model has none."""
        return next((o for o in self.outputs if o.role == "explanation"), None)

    @property
    def receptive_field(self) -> ReceptiveField:
        """The explanation output's receptive field (a ModelDirError when the model has no explanation output)."""
        if self.explanation is None:
            raise ModelDirError(f"model {self.name!r} has no explanation output")
        try:
            return ReceptiveField.model_validate(getattr(self.explanation, "receptive_field", None))
        except ValidationError as e:
            raise ValueError(f"explanation output needs a receptive_field {{size, stride}}: {e}") from e

    def output_named(self, name: str) -> OutputSpec:
        for spec in self.outputs:
            if spec.name == name:
                return spec
        raise ValueError(f"no output named {name!r} (outputs: {[o.name for o in self.outputs]})")

    def output_for(self, role: str) -> OutputSpec:
        return next(o for o in self.outputs if o.role == role)

    @property
    def image_shape(self) -> tuple[int, ...]:
        """One image without the batch dimension, e.g. (1, 28, 28)."""
        return tuple(self.input.shape[1:])

    @property
    def image_size(self) -> tuple[int, int]:
        """An image's (height, width): the last two dimensions of the input, e.g. (28, 28)."""
        height, width = self.input.shape[-2:]
        return height, width

    @property
    def pose_size(self) -> int:
        return math.prod(self.pose_shape)

    @property
    def graph_files(self) -> list[str]:
        return [GRAPH_FILE] + ([self.decoder.file] if self.decoder is not None else [])


def parse_card(data: Any) -> ModelCard:
    try:
        return ModelCard.model_validate(data)
    except ValidationError as e:
        problems = "; ".join(f"{'.'.join(str(p) for p in err['loc']) or 'card'}: {err['msg']}" for err in e.errors())
        raise ModelDirError(f"invalid model card: {problems}") from e


# --- files and hashes ---------------------------------------------------------------------------------------


def sha256_file(path: Path, chunk: int = 1 << 20) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as f:
        while block := f.read(chunk):
            digest.update(block)
    return digest.hexdigest()


def file_entries(directory: Path, names: list[str]) -> dict[str, dict[str, Any]]:
    """The card's `files` object for those of `names` present in `directory`: sha256 and size of each."""
    return {
        name: {"sha256": sha256_file(directory / name), "bytes": (directory / name).stat().st_size}
        for name in names
        if (directory / name).is_file()
    }


def verify_files(path: Path, card: ModelCard) -> None:
    """Every file the card lists must exist with its size and sha256; the graphs the service loads must be listed."""
    for required in card.graph_files:
        if required not in card.files:
            raise ModelDirError(f"{required} is not listed in the card's files, so its checksum cannot be verified")
    for filename, entry in sorted(card.files.items()):
        file = path / filename
        if not file.is_file():
            raise ModelDirError(f"{filename} is listed in the card but missing from {path}")
        size = file.stat().st_size
        if size != entry.bytes:
            raise ModelDirError(f"{filename} has {size} bytes, the card says {entry.bytes}: {ALTERED}")
        actual = sha256_file(file)
        if actual != entry.sha256:
            raise ModelDirError(
                f"{filename} sha256 mismatch: file {actual[:12]}…, card {entry.sha256[:12]}…: {ALTERED}"
            )


# --- reading and writing ------------------------------------------------------------------------------------


def read_card(path: Path) -> dict[str, Any]:
    """The raw card of the model directory `path` (not validated: see load_model_dir)."""
    file = path / CARD_FILE
    if not file.is_file():
        raise ModelDirError(f"{CARD_FILE} not found in {path} (is it a model directory?)")
    try:
        raw = json.loads(file.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise ModelDirError(f"cannot read {CARD_FILE}: {e}") from e
    if not isinstance(raw, dict):
        raise ModelDirError(f"cannot read {CARD_FILE}: a JSON object was expected, found {type(raw).__name__}")
    return raw


@dataclass(frozen=True)
class ModelDir:
    """A model directory whose card is valid and whose files match their checksums."""

    path: Path
    card: ModelCard
    raw_card: dict[str, Any]  # the card as written, with the fields the schema does not name

    @property
    def name(self) -> str:
        return self.card.name

    @property
    def graph(self) -> Path:
        return self.path / GRAPH_FILE

    @property
    def decoder(self) -> Path | None:
        return None if self.card.decoder is None else self.path / self.card.decoder.file


def load_model_dir(path: str | os.PathLike[str], name: str | None = None) -> ModelDir:
    """Read, validate and verify a model directory; every problem raises ModelDirError naming the file.

    The card's name must be `name` (a version folder's model folder), by default the directory's own name.
    """
    root = Path(path)
    raw = read_card(root)
    card = parse_card(raw)
    expected = name or root.resolve().name
    if card.name != expected:
        where = "its model folder's name" if name else "its directory name"
        raise ModelDirError(f"card name {card.name!r} differs from {where} {expected!r}")
    verify_files(root, card)
    return ModelDir(root, card, raw)


# a list of numbers as json.dumps(indent=...) writes it, one per line (never inside a string: those hold no newline)
_NUMBER_LIST = re.compile(r"\[\n\s+(-?\d[\d.eE+-]*(?:,\n\s+-?\d[\d.eE+-]*)*)\n\s*\]")


def card_text(card: dict[str, Any]) -> str:
    """`card` as model.json holds it: JSON indented by two, each list of plain numbers on one line (a matrix one
    row per line), so the "not a digit" quantiles, Gaussians and network stay readable and small."""
    text = json.dumps(card, indent=2)
    return _NUMBER_LIST.sub(lambda m: "[" + re.sub(r",\s+", ", ", m.group(1)) + "]", text) + "\n"


def write_card(path: Path, card: dict[str, Any]) -> None:
    """Write `card` as the directory's model.json (validated first, so no invalid card is ever written)."""
    parse_card(card)
    (path / CARD_FILE).write_text(card_text(card))


# An absolute path inside text: a "/" that starts a word (not in a URL, "1/f" or "and/or"), then its components.
_ABSOLUTE_PATH = re.compile(r"(?<![\w.:/~-])/(?:[\w.@+-]+/)*[\w.@+-]+")


def portable_path(path: str | os.PathLike[str]) -> str:
    """`path` as a card records it: relative to the working directory (the checkout) when it is absolute."""
    text = os.fspath(path)
    return os.path.relpath(text) if os.path.isabs(text) else text


def portable_command(argv: list[str]) -> list[str]:
    """Command-line arguments with every absolute path (`/x`, `--opt=/x`) made relative by `portable_path`."""
    out = []
    for arg in argv:
        option, sep, value = arg.rpartition("=") if arg.startswith("--") else ("", "", arg)
        out.append(option + sep + portable_path(value) if os.path.isabs(value) else arg)
    return out


def without_machine_paths(value: Any) -> Any:
    """`value` (a card, a message) with every absolute path shortened to `…/` and its last two parts."""
    if isinstance(value, str):
        return _ABSOLUTE_PATH.sub(lambda m: "…/" + "/".join(m.group(0).split("/")[-2:]), value)
    if isinstance(value, dict):
        return {k: without_machine_paths(v) for k, v in value.items()}
    if isinstance(value, list):
        return [without_machine_paths(v) for v in value]
    return value


def is_model_dir(path: Path) -> bool:
    return (path / CARD_FILE).is_file()


# --- ONNX Runtime sessions ----------------------------------------------------------------------------------

CUDA = "CUDAExecutionProvider"
CPU = "CPUExecutionProvider"
PROVIDER_CHOICES = ("auto", "cuda", "cpu")
NVIDIA_DEVICE_FILES = (Path("/dev/nvidia0"), Path("/dev/nvidiactl"))


class ProviderUnavailable(RuntimeError):
    """A forced provider cannot be used on this machine."""


def gpu_visible() -> bool:
    """A CUDA device node is present (onnxruntime-gpu lists CUDA as available even on machines without a GPU)."""
    return any(p.exists() for p in NVIDIA_DEVICE_FILES)


def requested_providers(choice: str) -> list[str]:
    """The provider list to try for `auto`, `cuda` or `cpu`."""
    if choice not in PROVIDER_CHOICES:
        raise ValueError(f"provider {choice!r} is not one of {PROVIDER_CHOICES}")
    available = ort.get_available_providers()
    if choice == "cpu":
        return [CPU]
    if choice == "cuda":
        if CUDA not in available:
            raise ProviderUnavailable(f"CAPSNET_PROVIDER=cuda but this onnxruntime build offers only {available}")
        return [CUDA, CPU]
    return [CUDA, CPU] if CUDA in available and gpu_visible() else [CPU]


def provider_summary(choice: str) -> str:
    """For the start-up log: the provider `choice` (auto, cuda or cpu) runs on, and why each other one this
    onnxruntime build offers is not used."""
    try:
        providers = requested_providers(choice)
    except (ProviderUnavailable, ValueError) as e:
        return str(e)
    unused = []
    for name in ort.get_available_providers():
        if name in providers:
            continue
        if name == CUDA:
            why = "CAPSNET_PROVIDER=cpu" if choice == "cpu" else "no GPU visible"
        else:
            why = "the service runs on CUDA or the CPU only"
        unused.append(f"{name} ({why})")
    used = providers[0] + (" with CPU fallback" if len(providers) > 1 else "")
    return f"{used} (CAPSNET_PROVIDER={choice})" + (f"; not used: {', '.join(unused)}" if unused else "")


def preload_cuda_libraries() -> None:
    """Let onnxruntime find CUDA/cuDNN from pip-installed NVIDIA wheels where they are present."""
    preload = getattr(ort, "preload_dlls", None)
    if preload is None:
        return
    try:
        preload()
    except Exception as e:  # the system libraries may still do
        logger.debug("onnxruntime.preload_dlls failed: %s", e)


def default_intra_op_threads() -> int:
    """$OMP_NUM_THREADS where it is set, else 0 (ONNX Runtime's own choice: one per physical core)."""
    threads = os.environ.get("OMP_NUM_THREADS", "")
    return int(threads) if threads.isdigit() else 0


def session_options(
    intra_op_threads: int | None = None,
    *,
    graph_optimization: ort.GraphOptimizationLevel = ort.GraphOptimizationLevel.ORT_ENABLE_ALL,
    allow_spinning: bool = False,
    profile_prefix: str | None = None,
) -> ort.SessionOptions:
    """The one set of session options: sequential execution, full graph optimisation, no idle spinning.

    The keywords are for benchmarks only: a lower optimisation level, spinning threads, or ONNX Runtime's
    profiler writing to `profile_prefix`; the service always takes the defaults.
    """
    options = ort.SessionOptions()
    options.intra_op_num_threads = default_intra_op_threads() if intra_op_threads is None else intra_op_threads
    options.inter_op_num_threads = 1
    options.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
    options.graph_optimization_level = graph_optimization
    # Idle worker threads would otherwise spin and take CPU from the event loop that parses requests.
    options.add_session_config_entry("session.intra_op.allow_spinning", "1" if allow_spinning else "0")
    options.log_severity_level = 3  # errors only
    if profile_prefix is not None:
        options.enable_profiling = True
        options.profile_file_prefix = profile_prefix
    return options


def create_session(
    source: str | os.PathLike[str] | bytes,
    provider: str = "cpu",
    intra_op_threads: int | None = None,
    options: ort.SessionOptions | None = None,
) -> ort.InferenceSession:
    """A session for a graph file or serialized graph on `provider` (auto, cuda or cpu).

    `intra_op_threads` None: $OMP_NUM_THREADS, else ONNX Runtime's default. `options` (from `session_options`)
    replace `session_options(intra_op_threads)`; giving both is an error. With `cuda` forced, a silent fallback
    to the CPU is an error.
    """
    if options is not None and intra_op_threads is not None:
        raise ValueError("create_session: give intra_op_threads or options, not both")
    providers = requested_providers(provider)
    if CUDA in providers:
        preload_cuda_libraries()
    model = source if isinstance(source, bytes) else str(source)
    options = options if options is not None else session_options(intra_op_threads)
    session = ort.InferenceSession(model, sess_options=options, providers=providers)
    actual = session.get_providers()
    if provider == "cuda" and CUDA not in actual:
        name = "the graph" if isinstance(source, bytes) else Path(source).name
        raise ProviderUnavailable(f"CAPSNET_PROVIDER=cuda but {name} fell back to {actual[0]} (no usable GPU)")
    return session


def active_provider(session: ort.InferenceSession) -> str:
    return str(session.get_providers()[0])

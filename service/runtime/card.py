"""The model card (`model.json`, docs/model-card.md) as the service reads it, checked for self-consistency."""

from __future__ import annotations

import math
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, PrivateAttr, ValidationError, model_validator

from service.runtime.ood import OODCalibration

CARD_FILE = "model.json"
GRAPH_FILE = "capsnet.onnx"  # the directory contract: image -> outputs
SUPPORTED_FORMAT_VERSIONS = (1,)


class CardError(ValueError):
    """The card is missing, unreadable or inconsistent."""


class TensorSpec(BaseModel):
    model_config = ConfigDict(extra="allow")

    name: str
    shape: list[int]
    datatype: str = "FP32"


class InputSpec(TensorSpec):
    range: tuple[float, float] = (0.0, 1.0)


class OutputSpec(TensorSpec):
    role: Literal["scores", "poses", "reconstruction", "explanation"]
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
        raise CardError(f"decoder has no input named {name!r} (has {[s.name for s in self.inputs]})")


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
        if calibration.needs_reconstruction and "reconstruction" not in {o.role for o in self.outputs}:
            raise ValueError("ood calibration uses reconstruction distances but no output has role 'reconstruction'")
        return calibration

    @property
    def ood_calibration(self) -> OODCalibration | None:
        """The parsed `ood` object (docs/model-card.md), or None when the model has not been calibrated."""
        return self._ood

    @property
    def explanation(self) -> OutputSpec | None:
        """The routing-map output (role "explanation"), or None when the model has none."""
        return next((o for o in self.outputs if o.role == "explanation"), None)

    @property
    def receptive_field(self) -> ReceptiveField:
        """The explanation output's receptive field (a CardError when the model has no explanation output)."""
        if self.explanation is None:
            raise CardError(f"model {self.name!r} has no explanation output")
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
        raise CardError(f"invalid model card: {problems}") from e

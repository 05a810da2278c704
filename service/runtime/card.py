"""The model card (`model.json`, docs/model-card.md) as the service reads it, checked for self-consistency."""

from __future__ import annotations

import math
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

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
    role: Literal["scores", "poses", "reconstruction"]
    description: str = ""


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
    files: dict[str, FileEntry] = Field(default_factory=dict)

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
        if self.decoder is not None:
            if self.decoder.input_named("poses").shape != poses.shape:
                raise ValueError("decoder input 'poses' must have the poses output's shape")
            if self.decoder.input_named("mask").shape != [-1, k]:
                raise ValueError(f"decoder input 'mask' must have shape [-1, {k}]")
            if self.decoder.output.shape[1:] != self.input.shape[1:]:
                raise ValueError("decoder output must have the input image's shape")
        return self

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

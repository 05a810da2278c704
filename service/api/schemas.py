"""Request and response bodies of the HTTP API, with the examples shown in the OpenAPI schema."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, Field, JsonValue, model_validator

# A 28×28 PNG of a vertical white bar (a "1"), for the OpenAPI examples.
EXAMPLE_PNG_B64 = (
    "iVBORw0KGgoAAAANSUhEUgAAABwAAAAcCAAAAABXZoBIAAAAHElEQVR42mNgGGSAEYX3H1WACZ/OUcnhJTnoAADIzgEk"
    "QAMnJgAAAABJRU5ErkJggg=="
)
# Example responses are the bundled model's (10 classes, 16-D poses); image arrays are shortened to 4×4 (a real
# one has the model's input height × width, 28×28 for MNIST).
EXAMPLE_SCORES: list[JsonValue] = [0.01, 0.02, 0.03, 0.02, 0.01, 0.01, 0.0, 0.98, 0.02, 0.05]
EXAMPLE_PROBABILITIES: list[JsonValue] = [0.01, 0.02, 0.026, 0.02, 0.01, 0.01, 0.0, 0.85, 0.02, 0.04]
EXAMPLE_POSE: list[JsonValue] = [0.12, -0.05, 0.31, 0.02, -0.27, 0.08, 0.19, -0.11]
EXAMPLE_POSE += [0.04, 0.22, -0.16, 0.07, 0.29, -0.03, 0.1, -0.2]  # 16 values: one per pose dimension
EXAMPLE_ZERO_POSE: list[JsonValue] = [0.0] * 16
EXAMPLE_IMAGE: list[JsonValue] = [
    [0.0, 0.0, 0.0, 0.0],
    [0.0, 0.91, 0.12, 0.0],
    [0.0, 0.87, 0.09, 0.0],
    [0.0, 0.0, 0.0, 0.0],
]
EXAMPLE_PREPROCESSING: dict[str, JsonValue] = {
    "source": "file",
    "filename": "seven.png",
    "inverted": True,
    "normalized": True,
}
EXAMPLE_PREDICTION: dict[str, JsonValue] = {  # one image's classification, shared by the response examples
    "index": 0,
    "predicted_class": 7,
    "label": "7",
    "score_kind": "capsule_length",
    "scores": EXAMPLE_SCORES,
    "probabilities": EXAMPLE_PROBABILITIES,
    "top_k": [{"class": 7, "label": "7", "score": 0.98, "probability": 0.85}],
    "preprocessing": EXAMPLE_PREPROCESSING,
    "ood_score": 2.31,
    "in_distribution": True,
}


class ImageInput(BaseModel):
    """One image: encoded file bytes in base64 (PNG, JPEG, GIF, BMP, WebP; a `data:` URL works too),
    or an array of the model's input height × width (28×28 for MNIST) of numbers in [0, 1] or 0–255 (white digit
    on black, already MNIST-like: used as is)."""

    model_config = ConfigDict(extra="forbid")

    data: str | None = Field(default=None, description="base64 of an image file, or a data: URL")
    array: list[list[float]] | None = Field(default=None, description="rows of pixel values in [0, 1] or 0–255")

    @model_validator(mode="after")
    def _exactly_one(self) -> ImageInput:
        if (self.data is None) == (self.array is None):
            raise ValueError("give exactly one of 'data' (base64) or 'array'")
        return self


class ImagesRequest(BaseModel):
    model_config = ConfigDict(
        extra="forbid",
        json_schema_extra={"examples": [{"images": [{"data": EXAMPLE_PNG_B64}]}]},
    )

    images: list[ImageInput] = Field(min_length=1)


DECODE_CHOICES = ("class", "mask")


def decode_request_schema(schema: dict[str, Any]) -> None:
    """The body as the server takes it: exactly one of `class` and `mask`, and neither of them null."""
    properties = schema["properties"]
    for key in DECODE_CHOICES:
        (present,) = [s for s in properties[key].pop("anyOf") if s.get("type") != "null"]
        properties[key] = {**present, **properties[key]}
        properties[key].pop("default")
    schema["oneOf"] = [{"required": [key]} for key in DECODE_CHOICES]
    schema["examples"] = [{"poses": [[0.0] * 16 for _ in range(10)], "class": 7}]


class DecodeRequest(BaseModel):
    """Caller-supplied (e.g. edited) poses for every class, decoded through the mask of one class."""

    model_config = ConfigDict(extra="forbid", populate_by_name=True, json_schema_extra=decode_request_schema)

    poses: list[Any] = Field(description="nested array of the model's poses for one image: (classes, *pose_shape)")
    class_index: int | None = Field(default=None, alias="class", ge=0, description="class whose capsule is decoded")
    mask: list[float] | None = Field(default=None, description="per-class weights instead of a one-hot `class`")

    @model_validator(mode="before")
    @classmethod
    def _no_nulls(cls, data: Any) -> Any:
        """`"class": null` is not leaving it out: the schema says an integer, so null is refused, not ignored."""
        if isinstance(data, dict) and (nulls := [key for key in DECODE_CHOICES if key in data and data[key] is None]):
            raise ValueError(f"'{nulls[0]}' must not be null; give exactly one of 'class' or 'mask'")
        return data

    @model_validator(mode="after")
    def _exactly_one(self) -> DecodeRequest:
        if (self.class_index is None) == (self.mask is None):
            raise ValueError("give exactly one of 'class' or 'mask'")
        return self


class TopK(BaseModel):
    class_: int = Field(serialization_alias="class")
    label: str
    score: float
    probability: float

    model_config = ConfigDict(populate_by_name=True)


class InputInfo(BaseModel):
    source: str = Field(description="file, base64 or array")
    filename: str | None = None
    inverted: bool = Field(description="whether the image was inverted to white-on-black")
    normalized: bool = Field(description="whether MNIST normalization (20/28 box, centre of mass) was applied")
    input: list[list[float]] | None = Field(default=None, description="the (height, width) array the model received")


class OODPartV1(BaseModel):
    name: str = Field(description="the feature, e.g. pose_distance (docs/not-a-digit.md)")
    value: float = Field(description="the feature's value for this image")
    tail_share: float = Field(description="share of the card's reference digits at least as extreme (floored)")
    contribution: float = Field(description="what the part adds to ood_score: weight × -log(tail_share)")
    says: str = Field(description="the part in words, e.g. 'the pose is unlike any 4 in training: ...'")


class Prediction(BaseModel):
    model_config = ConfigDict(populate_by_name=True)

    index: int
    predicted_class: int
    label: str
    score_kind: str = Field(description="capsule_length (dynamic routing) or activation (EM)")
    scores: list[float] = Field(description="per-class scores: capsule lengths, the paper's presence probabilities")
    probabilities: list[float] = Field(description="scores / sum(scores): a distribution that sums to 1")
    top_k: list[TopK]
    preprocessing: InputInfo
    ood_score: float | None = Field(
        default=None,
        description="'not a digit' score: the card's weighted sum of how unusual the image's features are among MNIST "
        "training digits (pose, capsule lengths, reconstruction, routing; docs/not-a-digit.md); null when the "
        "model's card has no `ood` calibration",
    )
    in_distribution: bool | None = Field(
        default=None, description="ood_score <= the card's calibrated threshold; null without a calibration"
    )
    ood_parts: list[OODPartV1] | None = Field(
        default=None,
        exclude_if=lambda v: v is None,
        description="with include_ood_parts=true: each feature's part of ood_score (absent otherwise)",
    )


class ClassifyResponse(BaseModel):
    model_config = ConfigDict(
        protected_namespaces=(),
        json_schema_extra={
            "examples": [
                {
                    "model": "capsnet-mnist",
                    "model_version": "1",
                    "predictions": [EXAMPLE_PREDICTION],
                }
            ]
        },
    )

    model: str
    model_version: str
    predictions: list[Prediction]


class CapsuleResult(Prediction):
    poses: list[Any] = Field(description="every class's pose: (classes, *pose_shape)")
    predicted_pose: list[Any] = Field(description="the predicted class's pose, poses[predicted_class]")


class CapsulesResponse(BaseModel):
    model_config = ConfigDict(
        protected_namespaces=(),
        json_schema_extra={
            "examples": [
                {
                    "model": "capsnet-mnist",
                    "model_version": "1",
                    "pose_shape": [16],
                    "capsules": [
                        {
                            **EXAMPLE_PREDICTION,
                            "poses": [EXAMPLE_POSE if c == 7 else EXAMPLE_ZERO_POSE for c in range(10)],
                            "predicted_pose": EXAMPLE_POSE,
                        }
                    ],
                }
            ]
        },
    )

    model: str
    model_version: str
    pose_shape: list[int]
    capsules: list[CapsuleResult]


class Reconstruction(BaseModel):
    model_config = ConfigDict(populate_by_name=True)

    index: int
    class_: int = Field(serialization_alias="class", description="the class whose capsule was decoded")
    label: str
    predicted_class: int
    image: list[list[float]] = Field(description="the reconstruction, rows of values in [0, 1]")


class ReconstructResponse(BaseModel):
    model_config = ConfigDict(
        protected_namespaces=(),
        json_schema_extra={
            "examples": [
                {
                    "model": "capsnet-mnist",
                    "model_version": "1",
                    "reconstructions": [
                        {"index": 0, "class": 7, "label": "7", "predicted_class": 7, "image": EXAMPLE_IMAGE}
                    ],
                }
            ]
        },
    )

    model: str
    model_version: str
    reconstructions: list[Reconstruction]


class PerturbResponse(BaseModel):
    model_config = ConfigDict(
        protected_namespaces=(),
        populate_by_name=True,
        json_schema_extra={
            "examples": [
                {
                    "model": "capsnet-mnist",
                    "model_version": "1",
                    "class": 7,
                    "label": "7",
                    "predicted_class": 7,
                    "deltas": [-0.25, -0.2, -0.15, -0.1, -0.05, 0.0, 0.05, 0.1, 0.15, 0.2, 0.25],
                    "pose": EXAMPLE_POSE,
                    "images": [[EXAMPLE_IMAGE]],
                }
            ]
        },
    )

    model: str
    model_version: str
    class_: int = Field(serialization_alias="class")
    label: str
    predicted_class: int
    deltas: list[float] = Field(description="the values added to one pose dimension (grid columns)")
    pose: list[float] = Field(description="the class's pose, flattened (grid rows follow its dimensions)")
    images: list[list[list[list[float]]]] = Field(
        description="(dimensions, deltas, height, width); the example shows one dimension and one delta"
    )


class DecodeResponse(BaseModel):
    model_config = ConfigDict(
        protected_namespaces=(),
        json_schema_extra={"examples": [{"model": "capsnet-mnist", "model_version": "1", "image": EXAMPLE_IMAGE}]},
    )

    model: str
    model_version: str
    image: list[list[float]]


class VersionState(BaseModel):
    version: str
    state: str = Field(description="loading, ready, failed or unloading")
    ready: bool
    error: str | None = None


class ModelSummary(BaseModel):
    model_config = ConfigDict(protected_namespaces=())

    name: str
    version: str | None
    state: str
    ready: bool
    error: str | None
    architecture: str | None
    description: str | None
    classes: list[str] | None
    pose_shape: list[int] | None
    has_decoder: bool
    has_explanation: bool = Field(default=False, description="the graph has a routing-map output: /explain works")
    ood_calibrated: bool = Field(default=False, description="the card has a 'not a digit' calibration")
    execution_provider: str | None
    versions: list[VersionState] = Field(
        default_factory=list, description="every loaded version, newest first; `version` is the one serving"
    )


class ModelList(BaseModel):
    model_config = ConfigDict(
        json_schema_extra={
            "examples": [
                {
                    "default_model": "capsnet-mnist",
                    "models": [
                        {
                            "name": "capsnet-mnist",
                            "version": "1",
                            "state": "ready",
                            "ready": True,
                            "error": None,
                            "architecture": "dynamic",
                            "description": "CapsNet with dynamic routing (Sabour et al. 2017) on MNIST",
                            "classes": [str(c) for c in range(10)],
                            "pose_shape": [16],
                            "has_decoder": True,
                            "has_explanation": True,
                            "ood_calibrated": True,
                            "execution_provider": "CPUExecutionProvider",
                            "versions": [{"version": "1", "state": "ready", "ready": True, "error": None}],
                        }
                    ],
                }
            ]
        }
    )

    default_model: str | None
    models: list[ModelSummary]


class ModelDetail(ModelSummary):
    card: dict[str, Any] | None = Field(description="the model's card (model.json) as exported")


# Open Inference Protocol (KServe v2) bodies


class MetadataTensor(BaseModel):
    name: str
    datatype: str
    shape: list[int]


class ServerMetadata(BaseModel):
    name: str
    version: str
    extensions: list[str]


class ModelMetadata(BaseModel):
    model_config = ConfigDict(
        json_schema_extra={
            "examples": [
                {
                    "name": "capsnet-mnist",
                    "versions": ["1"],
                    "platform": "onnxruntime_onnx",
                    "inputs": [{"name": "image", "datatype": "FP32", "shape": [-1, 1, 28, 28]}],
                    "outputs": [
                        {"name": "lengths", "datatype": "FP32", "shape": [-1, 10]},
                        {"name": "poses", "datatype": "FP32", "shape": [-1, 10, 16]},
                        {"name": "reconstruction", "datatype": "FP32", "shape": [-1, 1, 28, 28]},
                    ],
                    "parameters": {"execution_provider": "CPUExecutionProvider", "architecture": "dynamic"},
                }
            ]
        }
    )

    name: str
    versions: list[str]
    platform: str
    inputs: list[MetadataTensor]
    outputs: list[MetadataTensor]
    parameters: dict[str, Any] | None = None


class RequestInput(BaseModel):
    name: str
    shape: list[int]
    datatype: str
    parameters: dict[str, Any] | None = None
    data: list[Any] | None = Field(default=None, description="row-major, flat or nested; absent for binary data")


class RequestOutput(BaseModel):
    name: str
    parameters: dict[str, Any] | None = None


class InferenceRequest(BaseModel):
    model_config = ConfigDict(
        json_schema_extra={
            "examples": [
                {
                    "id": "42",
                    "inputs": [{"name": "image", "shape": [1, 1, 28, 28], "datatype": "FP32", "data": [0.0] * 784}],
                    "outputs": [{"name": "lengths"}],
                }
            ]
        }
    )

    id: str | None = None
    parameters: dict[str, Any] | None = None
    # At least one input (the server's 400 names the model's missing input, so the length is checked there).
    inputs: list[RequestInput] = Field(json_schema_extra={"minItems": 1})
    outputs: list[RequestOutput] | None = None


class ResponseOutput(BaseModel):
    name: str
    shape: list[int]
    datatype: str
    parameters: dict[str, Any] | None = None
    data: list[Any]


class InferenceResponse(BaseModel):
    model_config = ConfigDict(
        protected_namespaces=(),
        json_schema_extra={
            "examples": [
                {
                    "model_name": "capsnet-mnist",
                    "model_version": "1",
                    "id": "42",
                    "outputs": [{"name": "lengths", "shape": [1, 10], "datatype": "FP32", "data": EXAMPLE_SCORES}],
                }
            ]
        },
    )

    model_name: str
    model_version: str | None = None
    id: str | None = None
    parameters: dict[str, Any] | None = None
    outputs: list[ResponseOutput]


class ErrorV2(BaseModel):
    error: str


class ErrorV1(BaseModel):
    error: str
    type: str


EXAMPLE_GRID: list[JsonValue] = [[0.0, 0.4, 0.1], [0.0, 1.9, 0.2], [0.0, 1.2, 0.0]]  # 3×3 here; 6×6 for MNIST


class Explanation(BaseModel):
    model_config = ConfigDict(populate_by_name=True)

    index: int
    class_: int = Field(serialization_alias="class", description="the class whose routing is shown")
    label: str
    predicted_class: int
    share: float = Field(description="the class's part of all routed vote strength (its grid total / all classes')")
    grid: list[list[float]] = Field(
        description="routing map over the PrimaryCaps grid: Σ over capsule types of c_ij·|û_j|i| (6×6 for MNIST)"
    )
    heatmap: list[list[float]] = Field(
        description="the grid mapped onto the input (the model's input height × width): each pixel gets the mean "
        "weight of the grid cells whose receptive field contains it (0 where no cell sees it)"
    )
    preprocessing: InputInfo


class ExplainResponse(BaseModel):
    model_config = ConfigDict(
        protected_namespaces=(),
        json_schema_extra={
            "examples": [
                {
                    "model": "capsnet-mnist",
                    "model_version": "3",
                    "receptive_field": {"size": 17, "stride": 2},
                    "explanations": [
                        {
                            "index": 0,
                            "class": 7,
                            "label": "7",
                            "predicted_class": 7,
                            "share": 0.31,
                            "grid": EXAMPLE_GRID,
                            "heatmap": EXAMPLE_IMAGE,
                            "preprocessing": EXAMPLE_PREPROCESSING,
                        }
                    ],
                }
            ]
        },
    )

    model: str
    model_version: str
    receptive_field: dict[str, int] = Field(description="grid cell (r, c) sees input rows r·stride … r·stride+size−1")
    explanations: list[Explanation]

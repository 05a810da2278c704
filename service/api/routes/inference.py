"""v1 application API: classify, capsules, reconstruct, perturb and decode, for a named or the default model.

Each operation is written once and served at two addresses: `/v1/models/{name}/<op>` and `/v1/<op>` (the
default model); the `addressed_model` dependency tells them apart by the `name` path parameter.
Options go in the query string (`version` picks a model version); images in the body (multipart files or JSON,
see `ImagesRequest`).
(No `from __future__ import annotations` here: FastAPI must resolve the routes' annotations at runtime.)
"""

from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Annotated, Any, Literal

import numpy as np
from fastapi import APIRouter, Depends, Query, Request, Response
from pydantic import BaseModel
from starlette.concurrency import run_in_threadpool

from service.api.deps import MODEL_NAME_PARAMETER, VERSION_PARAMETER, ModelDep, SettingsDep
from service.api.inputs import INVERT_CHOICES, JSON_SLACK_VALUES, Invert, PreprocessOptions, read_images, read_json
from service.api.schemas import (
    CapsuleResult,
    CapsulesResponse,
    ClassifyResponse,
    DecodeRequest,
    DecodeResponse,
    ErrorV1,
    InputInfo,
    OODPartV1,
    PerturbResponse,
    Prediction,
    Reconstruction,
    ReconstructResponse,
    TopK,
)
from service.core.config import Settings
from service.core.errors import InvalidInput, ModelCapabilityError, OutOfDistribution
from service.imaging import array_to_png
from service.runtime.batcher import Rows, Tensors
from service.runtime.card import ModelCard
from service.runtime.model import ServedModel
from service.runtime.ood import OODCalibration

Format = Literal["json", "png"]
MAX_PERTURB_STEPS = 41
DEFAULT_TOP_K = 3  # classes ranked by classify unless top_k says otherwise
DECIMALS = 6  # v1 JSON rounds floats to 6 decimals; v2 returns them exactly

ERRORS: dict[int | str, dict[str, Any]] = {
    code: {"model": ErrorV1, "description": text}
    for code, text in {
        400: "invalid input (bad image, malformed JSON or base64, bad option)",
        404: "unknown model",
        409: "the model cannot do this (no decoder, no explanation output, no ood calibration)",
        413: "body, image or image count over the limit",
        415: "unsupported content type or image format",
        503: "model not ready, overloaded or shutting down (with Retry-After)",
        504: "inference timed out",
    }.items()
}
IMAGES_BODY: dict[str, Any] = {
    "requestBody": {
        "required": True,
        "description": "Images as multipart file parts (any field name; PNG, JPEG, GIF, BMP, WebP), "
        "or JSON with base64 data or raw arrays of the model's input size (its card's `input.shape`: 28×28 for "
        "MNIST; values in [0, 1] or 0–255, white digit on black).",
        "content": {
            "multipart/form-data": {
                "schema": {
                    "type": "object",
                    "properties": {
                        "files": {"type": "array", "items": {"type": "string", "format": "binary"}, "minItems": 1}
                    },
                    "required": ["files"],
                }
            },
            "application/json": {"schema": {"$ref": "#/components/schemas/ImagesRequest"}},
        },
    }
}
DECODE_BODY: dict[str, Any] = {
    "requestBody": {
        "required": True,
        "content": {"application/json": {"schema": {"$ref": "#/components/schemas/DecodeRequest"}}},
    }
}
PNG_RESPONSE: dict[int | str, dict[str, Any]] = {
    200: {"content": {"image/png": {}}, "description": "JSON by default; a PNG with format=png"}
}


DEFAULT_INVERT: Invert = "auto"
DEFAULT_NORMALIZE = True
DEFAULT_OPTIONS = PreprocessOptions(INVERT_CHOICES[DEFAULT_INVERT], DEFAULT_NORMALIZE)  # a request without options


async def preprocess_options(
    invert: Annotated[
        Invert, Query(description="auto: invert dark-on-light images (photos, drawings); true/false: force")
    ] = DEFAULT_INVERT,
    normalize: Annotated[
        bool,
        Query(
            description="MNIST normalization: the digit fitted into 20/28 of the model's input size (20×20 in 28×28), "
            "placed by centre of mass; false for MNIST-like images (only resized)"
        ),
    ] = DEFAULT_NORMALIZE,
) -> PreprocessOptions:
    return PreprocessOptions(INVERT_CHOICES[invert], normalize)


OptionsDep = Annotated[PreprocessOptions, Depends(preprocess_options)]
ClassQuery = Annotated[
    int | None, Query(alias="class", ge=0, description="class to decode; default: the predicted class")
]
FormatQuery = Annotated[Format, Query(description="json: arrays in [0, 1]; png: a grayscale PNG")]
IncludeInputQuery = Annotated[
    bool, Query(description="also return the (height × width) array the model received, e.g. 28×28")
]
RejectOODQuery = Annotated[
    bool,
    Query(
        description="answer 422 instead of a class when any image is not a digit (out of distribution by the "
        "model card's calibrated score); needs a calibrated model"
    ),
]
IncludeOODPartsQuery = Annotated[
    bool,
    Query(
        description="also return each image's ood_parts: every feature of the 'not a digit' score, how unusual it "
        "is among training digits and what it adds to ood_score; needs a calibrated model"
    ),
]
OOD_ERRORS: dict[int | str, dict[str, Any]] = {
    422: {"model": ErrorV1, "description": "reject_ood=true and an image is out of distribution (not a digit)"}
}


def rounded(a: np.ndarray) -> Any:
    return np.round(a.astype(np.float64), DECIMALS).tolist()


def probabilities(scores: np.ndarray) -> np.ndarray:
    """scores / sum(scores) per row (uniform where every score is 0): a distribution derived from the scores."""
    total = scores.sum(axis=-1, keepdims=True)
    uniform = scores.dtype.type(1.0 / scores.shape[-1])  # a scalar of the scores' type: broadcast, not filled
    return np.where(total > 0, scores / np.where(total > 0, total, 1.0), uniform)


def check_class(card: ModelCard, class_index: int | None) -> None:
    if class_index is not None and class_index >= len(card.classes):
        raise InvalidInput(
            f"class {class_index} is out of range: model {card.name!r} has classes 0..{len(card.classes) - 1}"
        )


def assess_ood(
    card: ModelCard, images: np.ndarray, outputs: Tensors, reject: bool
) -> tuple[np.ndarray, np.ndarray] | None:
    """(ood_score (N,), in_distribution (N,)) from the card's calibration, or None without one; with `reject`,
    an OutOfDistribution error naming the first rejected image."""
    calibration = card.ood_calibration
    if calibration is None:
        if reject:
            raise ModelCapabilityError(
                f"model {card.name!r} has no 'not a digit' calibration (its card has no ood object), so it cannot "
                "reject out-of-distribution images; omit reject_ood"
            )
        return None
    score, accepted = ood_scores(card, calibration, images, outputs)
    if reject and not accepted.all():
        bad = [int(i) for i in np.flatnonzero(~accepted)]
        raise OutOfDistribution(
            f"{len(bad)} of {len(images)} images are not digits by the calibrated score of model {card.name!r} "
            f"(image {bad[0]}: ood_score {score[bad[0]]:.3f} > threshold {calibration.threshold:.3f}); "
            "send reject_ood=false to classify them anyway"
        )
    return score, accepted


def ood_scores(
    card: ModelCard, calibration: OODCalibration, images: np.ndarray, outputs: Tensors
) -> tuple[np.ndarray, np.ndarray]:
    """(ood_score, in_distribution) of each image. Outputs that are a caller's rows of a batched run (`Rows`) are
    scored with the whole batch in one vectorised call, once for all of its callers (read-only arrays, shared): the
    batch's inputs hold `images`, which are what the caller submitted."""

    def assess(inputs: np.ndarray, out: Tensors) -> tuple[np.ndarray, np.ndarray]:
        score, accepted = calibration.assess(inputs, *ood_outputs(card, calibration, out))
        score.flags.writeable = accepted.flags.writeable = False
        return score, accepted

    if isinstance(outputs, Rows) and outputs.rows.stop - outputs.rows.start == len(images):
        score, accepted = outputs.batch.derived("ood", lambda inputs, out: assess(inputs[card.input.name], out))
        return score[outputs.rows], accepted[outputs.rows]
    return assess(images, outputs)


def ood_outputs(
    card: ModelCard, calibration: OODCalibration, out: Tensors
) -> tuple[np.ndarray, np.ndarray | None, np.ndarray | None, np.ndarray | None]:
    """(scores, reconstruction, poses, routing map) for the calibration: None for those it does not use."""

    def role(name: str, needed: bool) -> np.ndarray | None:
        return out[card.output_for(name).name] if needed else None

    return (
        out[card.scores.output],
        role("reconstruction", calibration.needs_reconstruction),
        role("poses", calibration.needs_poses),
        role("explanation", calibration.needs_explanation),
    )


def attach_ood_parts(found: Sequence[Prediction], card: ModelCard, images: np.ndarray, outputs: Tensors) -> None:
    """Set each prediction's `ood_parts` (include_ood_parts=true)."""
    for prediction, parts in zip(found, ood_parts(card, images, outputs), strict=True):
        prediction.ood_parts = parts


def ood_parts(card: ModelCard, images: np.ndarray, outputs: Tensors) -> list[list[OODPartV1]]:
    """Each image's parts of the 'not a digit' score, in words naming its predicted class."""
    calibration = card.ood_calibration
    if calibration is None:
        raise ModelCapabilityError(
            f"model {card.name!r} has no 'not a digit' calibration (its card has no ood object), so its score has "
            "no parts; omit include_ood_parts"
        )
    scores, *rest = ood_outputs(card, calibration, outputs)
    labels = [card.classes[c] for c in scores.argmax(axis=1).tolist()]
    return [
        [OODPartV1(**vars(part), says=part.says(label)) for part in parts]
        for parts, label in zip(calibration.parts(calibration.measure(images, scores, *rest)), labels, strict=True)
    ]


def predictions(
    card: ModelCard,
    scores: np.ndarray,
    info: list[InputInfo],
    top_k: int,
    ood: tuple[np.ndarray, np.ndarray] | None = None,
) -> list[Prediction]:
    """Each image's prediction from the batch's scores (N, K): numpy once per batch rather than once per image, and
    plain Python on the rows' lists after that (at concurrency 1 every numpy call runs from caches the model's run
    has evicted). The values are those of the per-image arithmetic, bit for bit."""
    k = scores.shape[1]
    both = np.concatenate([scores, probabilities(scores)], axis=1)  # (N, 2K): each row's scores, then probabilities
    order = np.argsort(-scores, axis=1, kind="stable")[:, :top_k].tolist()
    raw, rounded_rows = both.tolist(), rounded(both)
    raw_scores, raw_probs = [r[:k] for r in raw], [r[k:] for r in raw]
    rounded_scores, rounded_probs = [r[:k] for r in rounded_rows], [r[k:] for r in rounded_rows]
    ood_rows = (ood[0].tolist(), ood[1].tolist()) if ood is not None else None
    results = []
    for i, meta in enumerate(info):
        best = order[i][0]
        top = [
            TopK(
                class_=c,
                label=card.classes[c],
                score=round(raw_scores[i][c], DECIMALS),
                probability=round(raw_probs[i][c], DECIMALS),
            )
            for c in order[i]
        ]
        results.append(
            Prediction(
                index=i,
                predicted_class=best,
                label=card.classes[best],
                score_kind=card.scores.kind,
                scores=rounded_scores[i],
                probabilities=rounded_probs[i],
                top_k=top,
                preprocessing=meta,
                ood_score=None if ood_rows is None else round(ood_rows[0][i], DECIMALS),
                in_distribution=None if ood_rows is None else ood_rows[1][i],
            )
        )
    return results


async def classify_images(
    request: Request, model: ServedModel, card: ModelCard, settings: Settings, options: PreprocessOptions
) -> tuple[list[InputInfo], np.ndarray, Tensors]:
    """The request's images (as the model received them), how each was prepared, and the model's outputs."""
    batch = await read_images(request, card, settings, options)
    return batch.info, batch.array, await model.infer(batch.array)


def attach_inputs(card: ModelCard, info: list[InputInfo], images: np.ndarray) -> None:
    """Add to each image's preprocessing record the (height × width) array the model received."""
    for meta, image in zip(info, images, strict=True):
        meta.input = rounded(image_2d(card, image))


def one_hot(classes: np.ndarray, k: int) -> np.ndarray:
    mask = np.zeros((len(classes), k), np.float32)
    mask[np.arange(len(classes)), classes] = 1.0
    return mask


def image_2d(card: ModelCard, image: np.ndarray) -> np.ndarray:
    return image.reshape(card.image_shape[-2:])


def json_response(body: BaseModel) -> Response:
    """Serialized by pydantic in one step (the route's response_model still documents it)."""
    return Response(body.model_dump_json(by_alias=True), media_type="application/json")


async def png_response(array: np.ndarray) -> Response:
    return Response(await run_in_threadpool(array_to_png, array), media_type="image/png")


async def classify(
    request: Request,
    model: ModelDep,
    settings: SettingsDep,
    options: OptionsDep,
    top_k: Annotated[int, Query(ge=1, description="how many classes to rank")] = DEFAULT_TOP_K,
    include_input: IncludeInputQuery = False,
    reject_ood: RejectOODQuery = False,
    include_ood_parts: IncludeOODPartsQuery = False,
) -> Response:
    """Per image: the predicted class and label, the per-class scores (capsule lengths, the paper's presence
    probabilities), `probabilities` = scores / sum(scores), and the top-k classes."""
    card = model.require_ready()
    check_top_k(card, top_k)
    info, images, outputs = await classify_images(request, model, card, settings, options)
    result = classify_result(card, info, images, outputs, top_k, include_input, reject_ood)
    if include_ood_parts:
        attach_ood_parts(result.predictions, card, images, outputs)
    return json_response(result)


def check_top_k(card: ModelCard, top_k: int) -> None:
    if top_k > len(card.classes):
        raise InvalidInput(f"top_k {top_k} is larger than the {len(card.classes)} classes of model {card.name!r}")


def classify_result(
    card: ModelCard,
    info: list[InputInfo],
    images: np.ndarray,
    outputs: Tensors,
    top_k: int,
    include_input: bool,
    reject_ood: bool,
) -> ClassifyResponse:
    """The classify response for a batch the model has run (shared by the route and service.api.fastpath)."""
    ood = assess_ood(card, images, outputs, reject_ood)
    if include_input:
        attach_inputs(card, info, images)
    found = predictions(card, outputs[card.scores.output], info, top_k, ood)
    return ClassifyResponse(model=card.name, model_version=card.version, predictions=found)


async def capsules(
    request: Request,
    model: ModelDep,
    settings: SettingsDep,
    options: OptionsDep,
    include_input: IncludeInputQuery = False,
    reject_ood: RejectOODQuery = False,
    include_ood_parts: IncludeOODPartsQuery = False,
) -> Response:
    """Per image: every class's pose (10×16 for dynamic routing, 10×4×4 for EM), the scores, and the
    predicted class's pose as `predicted_pose`."""
    card = model.require_ready()
    info, images, outputs = await classify_images(request, model, card, settings, options)
    result = capsules_result(card, info, images, outputs, include_input, reject_ood)
    if include_ood_parts:
        attach_ood_parts(result.capsules, card, images, outputs)
    return json_response(result)


def capsules_result(
    card: ModelCard, info: list[InputInfo], images: np.ndarray, outputs: Tensors, include_input: bool, reject_ood: bool
) -> CapsulesResponse:
    """The capsules response for a batch the model has run (shared by the route and service.api.fastpath)."""
    ood = assess_ood(card, images, outputs, reject_ood)
    if include_input:
        attach_inputs(card, info, images)
    scores, poses = outputs[card.scores.output], outputs[card.output_for("poses").name]
    results = [
        CapsuleResult(**dict(p), poses=rounded(poses[i]), predicted_pose=rounded(poses[i, p.predicted_class]))
        for i, p in enumerate(predictions(card, scores, info, len(card.classes), ood))
    ]
    return CapsulesResponse(model=card.name, model_version=card.version, pose_shape=card.pose_shape, capsules=results)


async def reconstruct(
    request: Request,
    model: ModelDep,
    settings: SettingsDep,
    options: OptionsDep,
    class_index: ClassQuery = None,
    format: FormatQuery = "json",
) -> Response:
    """Decode each image's capsule of the predicted class (or of `class`). `format=png` takes one image."""
    card = model.require_decoder()
    check_class(card, class_index)
    info, _, outputs = await classify_images(request, model, card, settings, options)
    if format == "png" and len(info) != 1:
        raise InvalidInput(f"format=png returns one image but the request has {len(info)}; use format=json")
    predicted = outputs[card.scores.output].argmax(axis=1)
    chosen = predicted if class_index is None else np.full_like(predicted, class_index)
    images = await model.decode(outputs[card.output_for("poses").name], one_hot(chosen, len(card.classes)))
    if format == "png":
        return await png_response(image_2d(card, images[0]))
    reconstructions = [
        Reconstruction(
            index=i,
            class_=int(chosen[i]),
            label=card.classes[int(chosen[i])],
            predicted_class=int(predicted[i]),
            image=rounded(image_2d(card, images[i])),
        )
        for i in range(len(info))
    ]
    return json_response(
        ReconstructResponse(model=card.name, model_version=card.version, reconstructions=reconstructions)
    )


async def perturb(
    request: Request,
    model: ModelDep,
    settings: SettingsDep,
    options: OptionsDep,
    class_index: ClassQuery = None,
    low: Annotated[float, Query(ge=-10, le=10, description="first value added to a dimension")] = -0.25,
    high: Annotated[float, Query(ge=-10, le=10, description="last value added to a dimension")] = 0.25,
    step: Annotated[float, Query(gt=0, le=20, description="spacing of the added values")] = 0.05,
    format: FormatQuery = "json",
) -> Response:
    """For one image, add each of `low, low+step, …, high` to each dimension of the class's pose in turn
    and decode: a grid with one row per dimension and one column per value (PNG: rows × columns of
    tiles of the model's image size)."""
    card = model.require_decoder()
    check_class(card, class_index)
    deltas = perturbation_deltas(low, high, step)
    info, _, outputs = await classify_images(request, model, card, settings, options)
    if len(info) != 1:
        raise InvalidInput(f"perturb takes one image, the request has {len(info)}")
    predicted = int(outputs[card.scores.output][0].argmax())
    chosen = predicted if class_index is None else class_index
    poses = outputs[card.output_for("poses").name][0]  # (K, *pose_shape)
    grid_poses = perturbed_poses(poses, chosen, deltas)  # (P * n, K, *pose_shape)
    mask = one_hot(np.full(len(grid_poses), chosen), len(card.classes))
    images = await model.decode(grid_poses, mask)
    height, width = card.image_shape[-2:]
    grid = images.reshape(card.pose_size, len(deltas), height, width)
    if format == "png":
        return await png_response(grid.transpose(0, 2, 1, 3).reshape(card.pose_size * height, len(deltas) * width))
    return json_response(
        PerturbResponse(
            model=card.name,
            model_version=card.version,
            class_=chosen,
            label=card.classes[chosen],
            predicted_class=predicted,
            deltas=rounded(deltas),
            pose=rounded(poses[chosen].reshape(-1)),
            images=rounded(grid),
        )
    )


async def decode(request: Request, model: ModelDep, format: FormatQuery = "json") -> Response:
    """Decode the given poses (every class, e.g. from `capsules`, with edits) through the mask of `class`
    (one-hot) or through an explicit per-class `mask`."""
    card = model.require_decoder()
    most = len(card.classes) * (card.pose_size + 1) + JSON_SLACK_VALUES  # the poses, and a mask
    body = await read_json(request, DecodeRequest, most, "the model's classes × pose size")
    poses, mask = decode_inputs(card, body)
    images = await model.decode(poses[None], mask[None])
    if format == "png":
        return await png_response(image_2d(card, images[0]))
    return json_response(
        DecodeResponse(model=card.name, model_version=card.version, image=rounded(image_2d(card, images[0])))
    )


@dataclass(frozen=True)
class Operation:
    """One v1 operation: `/v1/<name>` (the default model) and `/v1/models/{name}/<name>` (a named one)."""

    name: str
    endpoint: Callable[..., Awaitable[Response]]
    response_model: type[BaseModel]
    summary: str  # "{which}" becomes "the default model" or "the named model"
    body: dict[str, Any]
    png: bool = False
    ood: bool = False  # takes reject_ood (a 422 when an image is not a digit)


OPERATIONS = (
    Operation("classify", classify, ClassifyResponse, "Classify images with {which}", IMAGES_BODY, ood=True),
    Operation(
        "capsules", capsules, CapsulesResponse, "Capsule poses (instantiation parameters) from {which}", IMAGES_BODY,
        ood=True,
    ),
    Operation(
        "reconstruct", reconstruct, ReconstructResponse, "Reconstruct images through the decoder of {which}",
        IMAGES_BODY, png=True,
    ),
    Operation(
        "perturb", perturb, PerturbResponse,
        "Sabour et al. 2017 Figure 4: vary each pose dimension and decode ({which})", IMAGES_BODY, png=True,
    ),
    Operation(
        "decode", decode, DecodeResponse, "Reconstruct from caller-supplied (edited) poses with {which}", DECODE_BODY,
        png=True,
    ),
)  # fmt: skip
# (path prefix, operation id suffix, which model, OpenAPI path parameters the endpoints do not declare themselves)
ADDRESSES: tuple[tuple[str, str, str, list[dict[str, Any]]], ...] = (
    ("/v1", "default", "the default model", [VERSION_PARAMETER]),
    ("/v1/models/{name}", "named", "the named model", [MODEL_NAME_PARAMETER, VERSION_PARAMETER]),
)


def build_router() -> APIRouter:
    router = APIRouter(tags=["v1"])
    for prefix, suffix, which, parameters in ADDRESSES:
        for op in OPERATIONS:
            router.add_api_route(
                f"{prefix}/{op.name}",
                op.endpoint,
                methods=["POST"],
                response_model=op.response_model,
                operation_id=f"{op.name}_{suffix}",
                summary=op.summary.format(which=which),
                responses={**ERRORS, **(PNG_RESPONSE if op.png else {}), **(OOD_ERRORS if op.ood else {})},
                openapi_extra={**op.body, **({"parameters": parameters} if parameters else {})},
            )
    return router


def perturbation_deltas(low: float, high: float, step: float) -> np.ndarray:
    if high < low:
        raise InvalidInput(f"high ({high:g}) must not be below low ({low:g})")
    span = (high - low) / step  # inf for a subnormal step: compare before converting to int
    if span + 1e-9 >= MAX_PERTURB_STEPS:
        raise InvalidInput(
            f"more than {MAX_PERTURB_STEPS} perturbation steps from {low:g} to {high:g} by {step:g}; "
            f"the limit is {MAX_PERTURB_STEPS}"
        )
    n = int(np.floor(span + 1e-9)) + 1
    return (low + step * np.arange(n)).astype(np.float32)


def perturbed_poses(poses: np.ndarray, chosen: int, deltas: np.ndarray) -> np.ndarray:
    """Poses (K, *pose_shape) -> (P * n, K, *pose_shape): row d*n + j adds deltas[j] to dimension d of `chosen`."""
    k, p, n = poses.shape[0], poses[chosen].size, len(deltas)
    flat = np.repeat(poses.reshape(1, k, p), p * n, axis=0)  # (P*n, K, P)
    rows = np.arange(p * n)
    flat[rows, chosen, rows // n] += deltas[rows % n]
    return flat.reshape(p * n, *poses.shape).astype(np.float32)


def decode_inputs(card: ModelCard, body: DecodeRequest) -> tuple[np.ndarray, np.ndarray]:
    k = len(card.classes)
    expected = [k, *card.pose_shape]
    try:
        poses = np.asarray(body.poses, dtype=np.float32)
    except (ValueError, TypeError) as e:
        raise InvalidInput(f"poses must be a numeric array of shape {expected}: {e}") from e
    if list(poses.shape) != expected:
        raise InvalidInput(f"poses must have shape {expected} for model {card.name!r}, got {list(poses.shape)}")
    if body.mask is not None:
        mask = np.asarray(body.mask, dtype=np.float32)
        if mask.shape != (k,):
            raise InvalidInput(f"mask must have {k} values (one per class), got {mask.size}")
    else:
        assert body.class_index is not None
        check_class(card, body.class_index)
        mask = one_hot(np.array([body.class_index]), k)[0]
    if not (np.isfinite(poses).all() and np.isfinite(mask).all()):
        raise InvalidInput("poses and mask must be finite numbers (no NaN or infinity)")
    return poses, mask


router = build_router()

"""Open Inference Protocol (KServe v2) over REST, as its specification describes.

Health answers 200 (true) or 400 (false) with an empty body; errors are `{"error": "<message>"}`.
Tensors go as JSON (flat or nested, row-major), or with the binary tensor data extension
(`Inference-Header-Content-Length`, as Triton's clients send by default).
(No `from __future__ import annotations` here: FastAPI must resolve the routes' annotations at runtime.)
"""

import json
import math
from collections.abc import AsyncIterator, Callable
from importlib.metadata import PackageNotFoundError, version
from typing import Annotated, Any

import numpy as np
from fastapi import APIRouter, Depends, Path, Request, Response
from fastapi.responses import JSONResponse

from service.api.deps import RegistryDep, SettingsDep, named_model
from service.api.inputs import JSON_SLACK_VALUES, check_json_values, media_type, parse_body
from service.api.schemas import (
    ErrorV2,
    InferenceRequest,
    InferenceResponse,
    MetadataTensor,
    ModelMetadata,
    RequestInput,
    ServerMetadata,
)
from service.core.config import Settings, env_name
from service.core.errors import InvalidInput, PayloadTooLarge, UnsupportedMediaType
from service.runtime.card import ModelCard
from service.runtime.model import ServedModel
from service.runtime.registry import ModelRegistry

router = APIRouter(tags=["v2 (Open Inference Protocol)"])
health_router = APIRouter(tags=["v2 (Open Inference Protocol)"])  # stays open when the others need a token

SERVER_NAME = "capsnet-serve"
PLATFORM = "onnxruntime_onnx"
BINARY_HEADER = "inference-header-content-length"
EXTENSIONS = ["binary_tensor_data"]
NUMPY_DATATYPES = {"FP32": np.dtype("<f4")}
ERRORS: dict[int | str, dict[str, Any]] = {code: {"model": ErrorV2} for code in (400, 404, 413, 415, 503, 504)}
# The GET routes read no body and no image: unknown model or version, or (metadata) a model not ready.
METADATA_ERRORS: dict[int | str, dict[str, Any]] = {code: {"model": ErrorV2} for code in (404, 503)}
READY_RESPONSES: dict[int | str, dict[str, Any]] = {
    200: {"description": "ready (empty body)"},
    400: {"description": "not ready (empty body)"},
    404: {"model": ErrorV2, "description": "unknown model or version"},
}
INFER_BODY: dict[str, Any] = {
    "requestBody": {
        "required": True,
        "content": {"application/json": {"schema": {"$ref": "#/components/schemas/InferenceRequest"}}},
    }
}


def server_version() -> str:
    try:
        return version("capsnet-serve")
    except PackageNotFoundError:
        return "0+unknown"


def model_of_version(registry: ModelRegistry, name: str, model_version: str) -> ServedModel:
    """The given version of the named model (shared by REST and gRPC)."""
    return registry.get(name, model_version)


async def versioned_model(
    registry: RegistryDep,
    name: Annotated[str, Path(description="model name")],
    model_version: Annotated[
        str, Path(description="model version (a version folder's number, or the card's `version`)")
    ],
) -> AsyncIterator[ServedModel]:
    """The version, held (`ServedModel.lease`) until the request has been answered."""
    with model_of_version(registry, name, model_version).lease() as model:
        yield model


@router.get("/v2", summary="Server metadata")
async def server_metadata() -> ServerMetadata:
    return ServerMetadata(name=SERVER_NAME, version=server_version(), extensions=EXTENSIONS)


@health_router.get(
    "/v2/health/live",
    summary="Server live (200 true, 4xx false; empty body)",
    response_class=Response,
    responses={200: {"description": "live (empty body)"}},
)
async def server_live() -> Response:
    return Response(status_code=200)


@health_router.get(
    "/v2/health/ready",
    summary="Server ready: every model ready (200 true, 400 false; empty body)",
    response_class=Response,
    responses={200: {"description": "every model ready (empty body)"}, 400: {"description": "not ready (empty body)"}},
)
async def server_ready(registry: RegistryDep) -> Response:
    return Response(status_code=200 if registry.all_ready else 400)


def model_metadata(model: ServedModel, versions: list[str] | None = None) -> ModelMetadata:
    """The metadata of one version; `versions`: every ready version of the model (default: this one's)."""
    card = model.require_ready()
    return ModelMetadata(
        name=card.name,
        versions=versions or [card.version],
        platform=PLATFORM,
        inputs=[MetadataTensor(name=card.input.name, datatype=card.input.datatype, shape=card.input.shape)],
        outputs=[MetadataTensor(name=o.name, datatype=o.datatype, shape=o.shape) for o in card.outputs],
        parameters={"execution_provider": model.provider or "", "architecture": card.architecture},
    )


def ready_versions(registry: ModelRegistry, name: str) -> list[str]:
    """The serving versions of a model, newest first."""
    return [m.version for m in registry.versions(name) if m.serving]


async def read_infer_body(request: Request) -> tuple[bytes, bytes]:
    """The JSON part of the request and the binary part (empty without the binary tensor data extension)."""
    body = await request.body()
    header_length = request.headers.get(BINARY_HEADER)
    if header_length is None:
        if media_type(request) not in ("application/json", ""):
            raise UnsupportedMediaType(f"unsupported content type {media_type(request)!r}; send application/json")
        json_part, binary = body, b""
    else:
        try:
            n = int(header_length)
        except ValueError:
            n = -1
        if not 0 <= n <= len(body):
            raise InvalidInput(f"{BINARY_HEADER} {header_length!r} is not a length within the {len(body)}-byte body")
        json_part, binary = body[:n], body[n:]
    return json_part, binary


def check_shape(card: ModelCard, tensor: RequestInput, settings: Settings) -> tuple[int, ...]:
    expected = card.input.shape
    shape = tensor.shape
    if len(shape) != len(expected) or any(e != -1 and s != e for s, e in zip(shape, expected, strict=True)):
        raise InvalidInput(f"input {tensor.name!r} has shape {shape}; model {card.name!r} expects {expected}")
    if any(s < 0 for s in shape) or shape[0] < 1:
        raise InvalidInput(f"input {tensor.name!r} has shape {shape}; dimensions must be positive")
    if shape[0] > settings.max_images_per_request:
        raise PayloadTooLarge(
            f"too many images: batch of {shape[0]}, the limit is {settings.max_images_per_request} "
            "(CAPSNET_MAX_IMAGES_PER_REQUEST)"
        )
    return tuple(shape)


def check_tensor(card: ModelCard, tensor: RequestInput, settings: Settings) -> tuple[int, ...]:
    """The tensor's shape, once its datatype and shape are the model's."""
    if tensor.datatype != card.input.datatype:
        raise InvalidInput(
            f"input {tensor.name!r} has datatype {tensor.datatype!r}; model {card.name!r} expects {card.input.datatype}"
        )
    return check_shape(card, tensor, settings)


def input_array(
    card: ModelCard, tensor: RequestInput, binary: bytes, offset: int, settings: Settings
) -> tuple[np.ndarray, int]:
    """The input tensor as float32 of its declared shape, and the binary offset after it."""
    size = (tensor.parameters or {}).get("binary_data_size")
    if size is None:
        return tensor_array(card, tensor, None, settings), offset
    shape = check_tensor(card, tensor, settings)
    if isinstance(size, bool) or not isinstance(size, int):
        raise InvalidInput(f"input {tensor.name!r}: parameter 'binary_data_size' must be an integer, got {size!r}")
    expected = math.prod(shape) * NUMPY_DATATYPES[card.input.datatype].itemsize
    if size != expected or offset + size > len(binary):
        raise InvalidInput(
            f"input {tensor.name!r}: binary_data_size {size} does not match shape {list(shape)} "
            f"({expected} bytes) or the {len(binary) - offset} bytes left"
        )
    return tensor_array(card, tensor, memoryview(binary)[offset : offset + size], settings), offset + size


def tensor_array(
    card: ModelCard, tensor: RequestInput, raw: bytes | memoryview | None, settings: Settings
) -> np.ndarray:
    """The input tensor as float32 of its declared shape, from `raw` (little-endian bytes) or else `tensor.data`:
    its datatype, shape, size and values checked (shared by REST and gRPC)."""
    shape = check_tensor(card, tensor, settings)
    count = math.prod(shape)
    dtype = NUMPY_DATATYPES[card.input.datatype]
    if raw is not None:
        if len(raw) != count * dtype.itemsize:
            raise InvalidInput(
                f"input {tensor.name!r} has {len(raw)} bytes of raw data; shape {list(shape)} of "
                f"{tensor.datatype} needs {count * dtype.itemsize}"
            )
        array = np.frombuffer(raw, dtype=dtype).astype(np.float32)
    else:
        if tensor.data is None:
            raise InvalidInput(f"input {tensor.name!r} has no data")
        try:
            array = np.asarray(tensor.data, dtype=np.float32)
        except (ValueError, TypeError) as e:
            raise InvalidInput(f"input {tensor.name!r}: data must be {tensor.datatype} numbers: {e}") from e
        if array.size != count:
            raise InvalidInput(f"input {tensor.name!r} has {array.size} values; shape {list(shape)} needs {count}")
    check_range(card, tensor.name, array)
    return array.reshape(shape)


def check_range(card: ModelCard, name: str, array: np.ndarray) -> None:
    """Every value finite and within the card's `input.range` (one min and one max: NaN makes both NaN)."""
    low, high = card.input.range
    least, most = float(array.min()), float(array.max())
    if low <= least and most <= high:
        return
    if not np.isfinite(array).all():
        raise InvalidInput(f"input {name!r} contains NaN or infinite values")
    raise InvalidInput(
        f"input {name!r} has values from {least:g} to {most:g}; model {card.name!r} takes values in "
        f"[{low:g}, {high:g}] (its card's input.range)"
    )


def check_bool_parameter(parameters: dict[str, Any] | None, key: str, where: str) -> None:
    """Parameters of the binary tensor data extension are booleans: the string "false" must not mean true."""
    value = (parameters or {}).get(key)
    if value is not None and not isinstance(value, bool):
        raise InvalidInput(f"{where} parameter {key!r} must be true or false, got {value!r}")


def wants_binary(request_parameters: dict[str, Any] | None, output_parameters: dict[str, Any] | None) -> bool:
    if output_parameters and "binary_data" in output_parameters:
        return bool(output_parameters["binary_data"])
    return bool((request_parameters or {}).get("binary_data_output", False))


def infer_response(card: ModelCard, req: InferenceRequest, outputs: dict[str, np.ndarray]) -> Response:
    """The response JSON, with binary outputs appended after it where the client asked for them."""
    requested = req.outputs or []
    params = {o.name: o.parameters for o in requested}
    names = [o.name for o in requested] if requested else [o.name for o in card.outputs]
    tensors, chunks = [], []
    for name in names:
        array = np.ascontiguousarray(outputs[name], dtype=np.float32)
        tensor: dict[str, Any] = {"name": name, "shape": list(array.shape), "datatype": "FP32"}
        if wants_binary(req.parameters, params.get(name)):
            chunks.append(array.astype("<f4").tobytes())
            tensor["parameters"] = {"binary_data_size": len(chunks[-1])}
        else:
            tensor["data"] = array.ravel().tolist()
        tensors.append(tensor)
    body: dict[str, Any] = {"model_name": card.name, "model_version": card.version}
    if req.id is not None:
        body["id"] = req.id
    body["outputs"] = tensors
    if not chunks:
        return JSONResponse(body)
    header = json.dumps(body, separators=(",", ":")).encode()
    return Response(
        header + b"".join(chunks),
        media_type="application/octet-stream",
        headers={"Inference-Header-Content-Length": str(len(header))},
    )


def check_request(card: ModelCard, req: InferenceRequest) -> None:
    names = [t.name for t in req.inputs]
    if len(set(names)) != len(names):
        raise InvalidInput(f"inputs {names} name a tensor more than once")
    unknown = sorted(set(names) - {card.input.name})
    if unknown:
        raise InvalidInput(f"unknown input {unknown[0]!r}; model {card.name!r} expects [{card.input.name!r}]")
    if card.input.name not in names:
        raise InvalidInput(f"missing input {card.input.name!r} for model {card.name!r}")
    known = [o.name for o in card.outputs]
    requested = [o.name for o in req.outputs or []]
    if len(set(requested)) != len(requested):
        raise InvalidInput(f"outputs {requested} name a tensor more than once")
    for output in req.outputs or []:
        if output.name not in known:
            raise InvalidInput(f"unknown output {output.name!r}; model {card.name!r} has outputs {known}")
        check_bool_parameter(output.parameters, "binary_data", f"output {output.name!r}")
    check_bool_parameter(req.parameters, "binary_data_output", "request")


async def infer(request: Request, model: ServedModel, settings: Settings) -> Response:
    card = model.require_ready()
    json_part, binary = await read_infer_body(request)
    most = settings.max_images_per_request * math.prod(card.image_shape) + JSON_SLACK_VALUES
    check_json_values(json_part, most, env_name("max_images_per_request"))
    req = await parse_body(InferenceRequest, json_part)
    check_request(card, req)
    images, end = input_array(card, req.inputs[0], binary, 0, settings)
    if end != len(binary):
        raise InvalidInput(f"{len(binary) - end} bytes of binary data are not claimed by any input")
    outputs = await model.infer(images)
    return infer_response(card, req, outputs)


def add_model_routes(path: str, model_dep: Callable[..., AsyncIterator[ServedModel]], suffix: str) -> None:
    """Model ready, model metadata and inference under `path` (with or without `/versions/{model_version}`)."""
    ModelDep = Annotated[ServedModel, Depends(model_dep)]

    @router.get(
        f"{path}/ready", operation_id=f"model_ready{suffix}", responses=READY_RESPONSES, response_class=Response
    )
    async def ready(model: ModelDep) -> Response:
        """Model ready: 200 (true) or 400 (false), empty body."""
        return Response(status_code=200 if model.ready else 400)

    @router.get(path, operation_id=f"model_metadata{suffix}", responses=METADATA_ERRORS)
    async def metadata(model: ModelDep, registry: RegistryDep) -> ModelMetadata:
        """Model metadata: `versions` lists every ready version, the rest describes this one (the newest without
        `/versions/{v}`); `parameters.execution_provider` names the ONNX Runtime provider it runs on."""
        return model_metadata(model, ready_versions(registry, model.name))

    @router.post(
        f"{path}/infer",
        operation_id=f"infer{suffix}",
        response_model=InferenceResponse,
        responses=ERRORS,
        openapi_extra=INFER_BODY,
    )
    async def infer_route(request: Request, model: ModelDep, settings: SettingsDep) -> Response:
        """Run the model on its input tensor (as the model metadata says: `image`, FP32, [N, 1, 28, 28] for
        the bundled model, values in [0, 1]); `outputs` selects the returned tensors (default: all); `id` is
        echoed."""
        return await infer(request, model, settings)


add_model_routes("/v2/models/{name}", named_model, "")
add_model_routes("/v2/models/{name}/versions/{model_version}", versioned_model, "_versioned")

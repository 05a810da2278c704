"""`inference.GRPCInferenceService`: the Open Inference Protocol's calls over the same models as the REST routes.

Requests are checked by the v2 REST route's own code (`check_request`, `tensor_array`), so both protocols
accept and refuse exactly the same tensors with the same messages. Errors are raised as the service's
errors; the server's interceptor maps them to status codes (`service/grpc/errors.py`). Each call runs on a
thread of the gRPC server's pool and blocks it while its model runs (`ServedModel.infer_blocking`).
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any

import grpc
import numpy as np

from service.api.routes import v2
from service.api.routes.repository import check_parameters
from service.api.schemas import InferenceRequest, RequestInput, RequestOutput
from service.core.config import Settings, env_name
from service.core.errors import InvalidInput, ModelNotFound, PayloadTooLarge
from service.grpc import protocol as pb
from service.runtime.card import ModelCard
from service.runtime.model import ServedModel
from service.runtime.registry import ModelRegistry

# The field of InferTensorContents that carries each datatype's values.
CONTENTS_FIELDS = {
    "BOOL": "bool_contents",
    **dict.fromkeys(("INT8", "INT16", "INT32"), "int_contents"),
    "INT64": "int64_contents",
    **dict.fromkeys(("UINT8", "UINT16", "UINT32"), "uint_contents"),
    "UINT64": "uint64_contents",
    "FP32": "fp32_contents",
    "FP64": "fp64_contents",
    "BYTES": "bytes_contents",
}


def parameter_values(parameters: Any) -> dict[str, Any] | None:
    """A protobuf map<string, InferParameter> as plain values (None when empty), as REST's JSON carries them."""
    values = {
        key: getattr(p, p.WhichOneof("parameter_choice"))
        for key, p in parameters.items()
        if p.WhichOneof("parameter_choice")
    }
    return values or None


def contents_values(tensor: Any, most: int | None = None) -> list[Any] | None:
    """The values in the `contents` field that matches the tensor's datatype; None when that field is empty.
    More than `most` values: a PayloadTooLarge, before they are copied out of the message."""
    field = CONTENTS_FIELDS.get(tensor.datatype)
    contents = getattr(tensor.contents, field) if field else []
    if most is not None and len(contents) > most:
        raise PayloadTooLarge(
            f"input {tensor.name!r} has {len(contents)} values, more than the most a request may need, {most} "
            f"({env_name('max_images_per_request')})"
        )
    return list(contents) or None


def inference_request(request: Any, most_values: int | None = None) -> InferenceRequest:
    """The gRPC request in the REST route's model (raw contents are passed alongside, not in `data`); a tensor of
    more than `most_values` typed values is refused before they are converted."""
    raw = bool(request.raw_input_contents)
    return InferenceRequest(
        id=request.id or None,
        parameters=parameter_values(request.parameters),
        inputs=[
            RequestInput(
                name=t.name,
                shape=list(t.shape),
                datatype=t.datatype,
                parameters=parameter_values(t.parameters),
                data=None if raw else contents_values(t, most_values),
            )
            for t in request.inputs
        ],
        outputs=[RequestOutput(name=o.name, parameters=parameter_values(o.parameters)) for o in request.outputs]
        or None,
    )


def input_images(card: ModelCard, request: Any, req: InferenceRequest, settings: Settings) -> np.ndarray:
    """The model's input from typed `contents` or from `raw_input_contents` (one entry per input, never both)."""
    tensor = req.inputs[0]
    if not request.raw_input_contents:
        if tensor.data is None and tensor.datatype == card.input.datatype:
            field = CONTENTS_FIELDS[card.input.datatype]
            raise InvalidInput(
                f"input {tensor.name!r} has no data: send its values in contents.{field} or its bytes in "
                "raw_input_contents"
            )
        return v2.tensor_array(card, tensor, None, settings)
    if len(request.raw_input_contents) != len(request.inputs):
        raise InvalidInput(
            f"raw_input_contents has {len(request.raw_input_contents)} entries for {len(request.inputs)} inputs: "
            "send one per input, in order"
        )
    if any(t.HasField("contents") and t.contents.ByteSize() for t in request.inputs):
        raise InvalidInput("inputs carry both contents and raw_input_contents: send each tensor's data one way only")
    return v2.tensor_array(card, tensor, request.raw_input_contents[0], settings)


def infer_response(card: ModelCard, req: InferenceRequest, outputs: dict[str, np.ndarray], raw: bool) -> Any:
    """Every requested output (all of the card's when none is named), as raw bytes or typed contents."""
    names = [o.name for o in req.outputs] if req.outputs else [o.name for o in card.outputs]
    response = pb.ModelInferResponse(model_name=card.name, model_version=card.version, id=req.id or "")
    for name in names:
        array = np.ascontiguousarray(outputs[name], dtype=np.float32)
        tensor = response.outputs.add(name=name, datatype="FP32", shape=array.shape)
        if raw:
            response.raw_output_contents.append(array.astype("<f4", copy=False).tobytes())
        else:
            tensor.contents.fp32_contents.extend(array.ravel().tolist())
    return response


class InferenceServicer:
    """The six calls of the protocol; each is a function (request, context) -> response."""

    def __init__(self, registry: ModelRegistry, settings: Settings) -> None:
        self.registry, self.settings = registry, settings

    def model(self, name: str, version: str) -> ServedModel:
        """The named model's version; an empty version means the newest serving one."""
        if not name:
            raise ModelNotFound(f"no model name given; served models: {sorted(self.registry.models)}")
        return self.registry.get(name, version or None)

    def ServerLive(self, request: Any, context: grpc.ServicerContext) -> Any:
        return pb.ServerLiveResponse(live=True)

    def ServerReady(self, request: Any, context: grpc.ServicerContext) -> Any:
        return pb.ServerReadyResponse(ready=self.registry.all_ready)

    def ModelReady(self, request: Any, context: grpc.ServicerContext) -> Any:
        model = self.model(request.name, request.version)
        return pb.ModelReadyResponse(ready=model.ready)

    def ServerMetadata(self, request: Any, context: grpc.ServicerContext) -> Any:
        # The binary tensor data extension is REST's: gRPC has raw_input_contents in the protocol itself.
        return pb.ServerMetadataResponse(name=v2.SERVER_NAME, version=v2.server_version(), extensions=[])

    def ModelMetadata(self, request: Any, context: grpc.ServicerContext) -> Any:
        model = self.model(request.name, request.version)
        metadata = v2.model_metadata(model, v2.ready_versions(self.registry, model.name))
        return pb.ModelMetadataResponse(
            name=metadata.name,
            versions=metadata.versions,
            platform=metadata.platform,
            inputs=[t.model_dump() for t in metadata.inputs],
            outputs=[t.model_dump() for t in metadata.outputs],
        )

    def ModelInfer(self, request: Any, context: grpc.ServicerContext) -> Any:
        with self.model(request.model_name, request.model_version).lease() as model:
            card = model.require_ready()
            req = inference_request(request, self.settings.max_images_per_request * math.prod(card.image_shape))
            v2.check_request(card, req)
            images = input_images(card, request, req, self.settings)
            outputs = model.infer_blocking(images, on_cancel=context.add_callback)
            return infer_response(card, req, outputs, raw=bool(request.raw_input_contents))

    # The model repository extension (Triton's messages); the interceptor has checked the admin scope.

    def RepositoryIndex(self, request: Any, context: grpc.ServicerContext) -> Any:
        self.registry.require_control(change=False)
        rows = self.registry.run_blocking(self.registry.index(ready_only=request.ready))
        return pb.RepositoryIndexResponse(models=[dataclasses.asdict(row) for row in rows])

    def RepositoryModelLoad(self, request: Any, context: grpc.ServicerContext) -> Any:
        self.registry.require_control(change=True)
        check_parameters(parameter_values(request.parameters))
        self.registry.run_blocking(self.registry.load(request.model_name))
        return pb.RepositoryModelLoadResponse()

    def RepositoryModelUnload(self, request: Any, context: grpc.ServicerContext) -> Any:
        self.registry.require_control(change=True)
        check_parameters(parameter_values(request.parameters))
        self.registry.run_blocking(self.registry.unload(request.model_name))
        return pb.RepositoryModelUnloadResponse()

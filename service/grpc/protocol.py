"""The Open Inference Protocol's gRPC messages and methods, built from the compiled `grpc_predict_v2.proto`.

The messages live in a descriptor pool of their own rather than protobuf's default one: stock clients
(tritonclient.grpc, kserve) register the same `inference.*` names in the default pool, and protobuf refuses a
second definition of a name, so the server could not otherwise run in one process with them. The names on
the wire (`/inference.GRPCInferenceService/<method>`) are the protocol's all the same.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import grpc
from google.protobuf import descriptor_pb2, descriptor_pool, message_factory

PROTO_FILE = Path(__file__).with_name("grpc_predict_v2.proto")
DESCRIPTOR_FILE = PROTO_FILE.with_suffix(".binpb")  # written by `make proto` from PROTO_FILE
PACKAGE = "inference"
SERVICE_NAME = f"{PACKAGE}.GRPCInferenceService"


def load_pool(path: Path = DESCRIPTOR_FILE) -> Any:
    """A new descriptor pool holding every file of the FileDescriptorSet at `path`."""
    pool = descriptor_pool.DescriptorPool()
    for file in descriptor_pb2.FileDescriptorSet.FromString(path.read_bytes()).file:
        pool.Add(file)
    return pool


POOL = load_pool()
SERVICE = POOL.FindServiceByName(SERVICE_NAME)


def message(name: str) -> Any:
    """The message class `inference.<name>` (e.g. "ModelInferRequest")."""
    return message_factory.GetMessageClass(POOL.FindMessageTypeByName(f"{PACKAGE}.{name}"))


ServerLiveResponse = message("ServerLiveResponse")
ServerReadyResponse = message("ServerReadyResponse")
ModelReadyRequest = message("ModelReadyRequest")
ModelReadyResponse = message("ModelReadyResponse")
ServerMetadataRequest = message("ServerMetadataRequest")
ServerMetadataResponse = message("ServerMetadataResponse")
ModelMetadataRequest = message("ModelMetadataRequest")
ModelMetadataResponse = message("ModelMetadataResponse")
InferParameter = message("InferParameter")
ModelInferRequest = message("ModelInferRequest")
ModelInferResponse = message("ModelInferResponse")
RepositoryIndexRequest = message("RepositoryIndexRequest")
RepositoryIndexResponse = message("RepositoryIndexResponse")
RepositoryModelLoadRequest = message("RepositoryModelLoadRequest")
RepositoryModelLoadResponse = message("RepositoryModelLoadResponse")
RepositoryModelUnloadRequest = message("RepositoryModelUnloadRequest")
RepositoryModelUnloadResponse = message("RepositoryModelUnloadResponse")
# The model repository extension's methods: they need the admin scope where tokens are on.
REPOSITORY_METHODS = frozenset(
    f"/{SERVICE_NAME}/{name}" for name in ("RepositoryIndex", "RepositoryModelLoad", "RepositoryModelUnload")
)


def method_path(name: str) -> str:
    return f"/{SERVICE_NAME}/{name}"


def service_handler(servicer: object) -> grpc.GenericRpcHandler:
    """The service's methods, each answered by the servicer's coroutine of the same name (request, context)."""
    handlers = {
        m.name: grpc.unary_unary_rpc_method_handler(
            getattr(servicer, m.name),
            request_deserializer=message_factory.GetMessageClass(m.input_type).FromString,
            response_serializer=message_factory.GetMessageClass(m.output_type).SerializeToString,
        )
        for m in SERVICE.methods
    }
    return grpc.method_handlers_generic_handler(SERVICE_NAME, handlers)


def client_method(channel: grpc.aio.Channel, name: str) -> grpc.aio.UnaryUnaryMultiCallable:
    """A callable for one method of the service over an asyncio channel (for clients such as the benchmark)."""
    method = SERVICE.methods_by_name[name]
    return channel.unary_unary(
        method_path(name),
        request_serializer=message_factory.GetMessageClass(method.input_type).SerializeToString,
        response_deserializer=message_factory.GetMessageClass(method.output_type).FromString,
    )

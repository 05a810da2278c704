"""The gRPC server: the inference service and the standard health service, on the uvicorn event loop.

`GrpcServer` is started and stopped by the app's lifespan (service/main.py), so it shares the model
registry (and so the dynamic batchers), the settings' limits, the metrics and the logging of the HTTP
server. One interceptor does, for every call: the bearer-token check (the health service stays open),
the mapping of the service's errors to status codes, and the request metrics.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable
from typing import Any

import grpc
from google.protobuf.message import DecodeError
from grpc_health.v1 import health, health_pb2, health_pb2_grpc

from service.core.auth import bearer_token
from service.core.config import Settings
from service.core.errors import ServiceError
from service.core.metrics import Metrics
from service.grpc import protocol
from service.grpc.errors import grpc_status
from service.grpc.servicer import InferenceServicer
from service.runtime.registry import ModelRegistry

logger = logging.getLogger(__name__)

TokenCheck = Callable[[str | None], bool]
HEALTH_PREFIX = f"/{health.SERVICE_NAME}/"
# Health service names: "" (overall) and the inference service follow readiness; LIVENESS is SERVING while
# the process runs, for a Kubernetes gRPC liveness probe (`grpc: {port: 8001, service: liveness}`).
LIVENESS = "liveness"
READINESS_SERVICES = ("", protocol.SERVICE_NAME)
SERVING = health_pb2.HealthCheckResponse.SERVING
NOT_SERVING = health_pb2.HealthCheckResponse.NOT_SERVING


class MalformedMessage:
    """What a request that protobuf cannot parse becomes, so that the call answers INVALID_ARGUMENT."""

    def __init__(self, error: DecodeError) -> None:
        self.error = error


def tolerant(deserialize: Callable[[bytes], Any] | None) -> Callable[[bytes], Any] | None:
    """The deserializer, returning a MalformedMessage where it would raise (grpc would answer INTERNAL)."""
    if deserialize is None:
        return None

    def parse(data: bytes) -> Any:
        try:
            return deserialize(data)
        except DecodeError as e:
            return MalformedMessage(e)

    return parse


def metadata_value(details: grpc.HandlerCallDetails, key: str) -> str | None:
    return next((str(v) for k, v in details.invocation_metadata or () if k == key), None)


class ServiceInterceptor(grpc.aio.ServerInterceptor):
    """Authentication, error mapping and metrics around every unary call."""

    def __init__(self, metrics: Metrics, check_token: TokenCheck | None) -> None:
        self.metrics, self.check_token = metrics, check_token

    async def intercept_service(
        self,
        continuation: Callable[[grpc.HandlerCallDetails], Awaitable[grpc.RpcMethodHandler]],
        handler_call_details: grpc.HandlerCallDetails,
    ) -> grpc.RpcMethodHandler:
        handler = await continuation(handler_call_details)
        if handler is None or handler.unary_unary is None:  # unknown methods (UNIMPLEMENTED); health Watch
            return handler
        method = handler_call_details.method
        allowed = (
            self.check_token is None
            or method.startswith(HEALTH_PREFIX)
            or self.check_token(bearer_token(metadata_value(handler_call_details, "authorization")))
        )
        return grpc.unary_unary_rpc_method_handler(
            self.wrap(method, handler.unary_unary, allowed),
            request_deserializer=tolerant(handler.request_deserializer),
            response_serializer=handler.response_serializer,
        )

    def wrap(
        self, method: str, behavior: Callable[[Any, grpc.aio.ServicerContext], Awaitable[Any]], allowed: bool
    ) -> Callable[[Any, grpc.aio.ServicerContext], Awaitable[Any]]:
        async def call(request: Any, context: grpc.aio.ServicerContext) -> Any:
            start = time.perf_counter()
            code = grpc.StatusCode.OK
            try:
                if not allowed:
                    code = grpc.StatusCode.UNAUTHENTICATED
                    await context.abort(code, "missing or invalid bearer token: send 'authorization: Bearer <token>'")
                if isinstance(request, MalformedMessage):
                    code = grpc.StatusCode.INVALID_ARGUMENT
                    name = method.rsplit("/", 1)[-1]
                    await context.abort(code, f"malformed {name} request message: {request.error}")
                return await behavior(request, context)
            except ServiceError as e:
                code, trailing = grpc_status(e)
                if e.status >= 500:  # as the HTTP error handlers log them
                    logger.warning("%s -> %s: %s", method, code.name, e.message)
                await context.abort(code, e.message, trailing_metadata=trailing)
            except asyncio.CancelledError:
                code = grpc.StatusCode.CANCELLED
                raise
            except grpc.aio.AbortError:
                raise
            except Exception:
                logger.exception("unhandled error in %s", method)
                code = grpc.StatusCode.INTERNAL
                await context.abort(code, "internal server error")
            finally:
                labels = {"protocol": "grpc", "route": method, "method": "POST"}
                self.metrics.requests.labels(**labels, status=code.name).inc()
                self.metrics.request_latency.labels(**labels).observe(time.perf_counter() - start)

        return call


def listen_address(host: str, port: int) -> str:
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


class GrpcServer:
    """`start` binds `settings.host:settings.grpc_port`; `stop` drains the calls in flight (graceful shutdown)."""

    def __init__(
        self, registry: ModelRegistry, settings: Settings, metrics: Metrics, check_token: TokenCheck | None = None
    ) -> None:
        self.registry, self.settings = registry, settings
        self.health = health.aio.HealthServicer()
        limit = settings.max_body_bytes
        self.server = grpc.aio.server(
            interceptors=[ServiceInterceptor(metrics, check_token)],
            options=[
                ("grpc.max_receive_message_length", limit),  # larger messages: RESOURCE_EXHAUSTED
                ("grpc.so_reuseport", 0),  # a port in use is an error, never a silently shared socket
            ],
        )
        self.server.add_generic_rpc_handlers((protocol.service_handler(InferenceServicer(registry, settings)),))
        health_pb2_grpc.add_HealthServicer_to_server(self.health, self.server)
        self.port: int | None = None

    async def start(self) -> int:
        """Listen and serve; the port bound (the one asked for, or a free one for port 0 in tests)."""
        address = listen_address(self.settings.host, self.settings.grpc_port)
        try:
            self.port = self.server.add_insecure_port(address)
        except RuntimeError as e:
            raise RuntimeError(f"cannot listen for gRPC on {address} (CAPSNET_GRPC_PORT): {e}") from e
        for service in READINESS_SERVICES:
            await self.health.set(service, NOT_SERVING)
        await self.health.set(LIVENESS, SERVING)
        await self.server.start()
        logger.info(
            "gRPC (Open Inference Protocol, grpc.health.v1) listening on %s",
            listen_address(self.settings.host, self.port),
        )
        return self.port

    async def update_health(self) -> None:
        """Readiness follows the registry's: SERVING once loading is over and at least one model serves."""
        for service in READINESS_SERVICES:
            await self.health.set(service, SERVING if self.registry.ready else NOT_SERVING)

    async def stop(self) -> None:
        """Health turns NOT_SERVING, new calls are refused, calls in flight get up to the shutdown timeout."""
        await self.health.enter_graceful_shutdown()
        await self.server.stop(grace=self.settings.shutdown_timeout_s)
        logger.info("gRPC stopped: calls in flight finished")

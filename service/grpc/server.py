"""The gRPC server: the inference service and the standard health service, on threads of their own.

`GrpcServer` is started and stopped by the app's lifespan (service/main.py), so it shares the model
registry (and so the dynamic batchers), the settings' limits, the metrics and the logging of the HTTP
server, but not its event loop: calls are served by grpcio's synchronous server, on a pool of threads
that block while their model runs, so gRPC takes no time from the loop that serves HTTP. One
interceptor does, for every call: the bearer-token check (health stays open: grpc.health.v1 and the
protocol's ServerLive and ServerReady), the mapping of the service's errors to status codes, and the
request metrics.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any, TypeAlias

import grpc
from google.protobuf.message import DecodeError
from grpc_health.v1 import health, health_pb2, health_pb2_grpc
from prometheus_client import Counter, Histogram

from service.core.auth import NOT_ADMIN, bearer_token
from service.core.config import Settings
from service.core.errors import ServiceError
from service.core.metrics import Metrics
from service.grpc import protocol
from service.grpc.errors import Metadata, grpc_status
from service.grpc.servicer import InferenceServicer
from service.runtime.batcher import CallCancelled
from service.runtime.registry import ModelRegistry
from service.runtime.slots import Activity

logger = logging.getLogger(__name__)

TokenCheck = Callable[[str | None], bool]
Behavior = Callable[[Any, grpc.ServicerContext], Any]
HEALTH_PREFIX = f"/{health.SERVICE_NAME}/"
# Health service names: "" (overall) and the inference service follow readiness; LIVENESS is SERVING while
# the process runs, for a Kubernetes gRPC liveness probe (`grpc: {port: 8001, service: liveness}`).
LIVENESS = "liveness"
READINESS_SERVICES = ("", protocol.SERVICE_NAME)
# Open without a token, as REST's /v2/health/* and grpc.health.v1 are: the protocol's own liveness and readiness.
OPEN_METHODS = frozenset(f"/{protocol.SERVICE_NAME}/{call}" for call in ("ServerLive", "ServerReady"))
SERVING = health_pb2.HealthCheckResponse.SERVING
NOT_SERVING = health_pb2.HealthCheckResponse.NOT_SERVING
UNAUTHENTICATED_MESSAGE = "missing or invalid bearer token: send 'authorization: Bearer <token>'"
Verdict: TypeAlias = grpc.StatusCode | None  # why a call is refused before it runs (no token, not admin), None: allowed


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


class Failure(Exception):
    """A call's end in a status other than OK: its code, message and trailing metadata."""

    def __init__(self, code: grpc.StatusCode, message: str, trailing: Metadata = ()) -> None:
        super().__init__(message)
        self.code, self.message, self.trailing = code, message, trailing


class ServiceInterceptor(grpc.ServerInterceptor):
    """Authentication, error mapping and metrics around every unary call."""

    def __init__(
        self,
        metrics: Metrics,
        check_token: TokenCheck | None,
        activity: Activity | None = None,
        check_admin: TokenCheck | None = None,
    ) -> None:
        self.metrics, self.check_token, self.check_admin = metrics, check_token, check_admin
        self.activity = activity or Activity()  # the requests in progress, read by the batchers (RunSlots)
        # Built once per method (and token verdict), not per call: the wrapped handlers and the metrics' children
        # (labels() costs a lock and a validation). A race between two threads only builds one twice.
        self._handlers: dict[tuple[str, Verdict], grpc.RpcMethodHandler] = {}
        self._latency: dict[str, Histogram] = {}
        self._counts: dict[tuple[str, grpc.StatusCode], Counter] = {}

    def intercept_service(
        self,
        continuation: Callable[[grpc.HandlerCallDetails], grpc.RpcMethodHandler | None],
        handler_call_details: grpc.HandlerCallDetails,
    ) -> grpc.RpcMethodHandler | None:
        handler = continuation(handler_call_details)
        if handler is None or handler.unary_unary is None:  # unknown methods (UNIMPLEMENTED); health Watch
            return handler
        method = handler_call_details.method
        verdict = self.verdict(method, handler_call_details)
        wrapped = self._handlers.get((method, verdict))
        if wrapped is None:
            wrapped = self._handlers[method, verdict] = grpc.unary_unary_rpc_method_handler(
                self.wrap(method, handler.unary_unary, verdict),
                request_deserializer=tolerant(handler.request_deserializer),
                response_serializer=handler.response_serializer,
            )
        return wrapped

    def verdict(self, method: str, details: grpc.HandlerCallDetails) -> Verdict:
        """None when the call may run: tokens off, the health service or ServerLive/ServerReady, or a valid token
        (with the admin scope for the repository methods)."""
        if self.check_token is None or method.startswith(HEALTH_PREFIX) or method in OPEN_METHODS:
            return None
        token = bearer_token(metadata_value(details, "authorization"))
        if not self.check_token(token):
            return grpc.StatusCode.UNAUTHENTICATED
        if method in protocol.REPOSITORY_METHODS and not (self.check_admin and self.check_admin(token)):
            return grpc.StatusCode.PERMISSION_DENIED
        return None

    def wrap(self, method: str, behavior: Behavior, verdict: Verdict) -> Behavior:
        def call(request: Any, context: grpc.ServicerContext) -> Any:
            start = time.perf_counter()
            code = grpc.StatusCode.OK
            try:
                with self.activity.request():
                    response = self.answer(method, behavior, verdict, request, context)
                if not context.is_active():  # the client cancelled, or its deadline passed, while the call ran
                    code = grpc.StatusCode.CANCELLED
                return response
            except Failure as failure:
                code = failure.code
                if failure.trailing:
                    context.set_trailing_metadata(failure.trailing)
                context.abort(code, failure.message)  # raises
            finally:
                self.observe(method, code, time.perf_counter() - start)

        return call

    def observe(self, method: str, code: grpc.StatusCode, seconds: float) -> None:
        labels = {"protocol": "grpc", "route": method, "method": "POST"}
        if (method, code) not in self._counts:
            self._counts[method, code] = self.metrics.requests.labels(**labels, status=code.name)
        if method not in self._latency:
            self._latency[method] = self.metrics.request_latency.labels(**labels)
        self._counts[method, code].inc()
        self._latency[method].observe(seconds)

    @staticmethod
    def answer(method: str, behavior: Behavior, verdict: Verdict, request: Any, context: grpc.ServicerContext) -> Any:
        """The response, or a Failure for the status the call must end with (no traceback reaches a client)."""
        if verdict is grpc.StatusCode.UNAUTHENTICATED:
            raise Failure(verdict, UNAUTHENTICATED_MESSAGE)
        if verdict is not None:
            raise Failure(verdict, NOT_ADMIN)
        if isinstance(request, MalformedMessage):
            name = method.rsplit("/", 1)[-1]
            raise Failure(grpc.StatusCode.INVALID_ARGUMENT, f"malformed {name} request message: {request.error}")
        try:
            return behavior(request, context)
        except ServiceError as e:
            code, trailing = grpc_status(e)
            if e.status >= 500:  # as the HTTP error handlers log them
                logger.warning("%s -> %s: %s", method, code.name, e.message)
            raise Failure(code, e.message, trailing) from e
        except CallCancelled as e:
            raise Failure(grpc.StatusCode.CANCELLED, str(e)) from e
        except Exception as e:
            logger.exception("unhandled error in %s", method)
            raise Failure(grpc.StatusCode.INTERNAL, "internal server error") from e


def listen_address(host: str, port: int) -> str:
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


def handler_threads(settings: Settings) -> int:
    """Threads that serve calls: enough for every call the batchers can hold (queued, and a batch running), so
    that a full queue answers UNAVAILABLE rather than leaving calls unread; they start only as load needs them."""
    return settings.max_queue_size + settings.max_batch_size


class GrpcServer:
    """`start` binds `settings.host:settings.grpc_port`; `stop` drains the calls in flight (graceful shutdown)."""

    def __init__(
        self,
        registry: ModelRegistry,
        settings: Settings,
        metrics: Metrics,
        check_token: TokenCheck | None = None,
        check_admin: TokenCheck | None = None,
    ) -> None:
        self.registry, self.settings = registry, settings
        self.health = health.HealthServicer()
        self.pool = ThreadPoolExecutor(max_workers=handler_threads(settings), thread_name_prefix="grpc")
        limit = settings.max_body_bytes
        self.server = grpc.server(
            self.pool,
            interceptors=[ServiceInterceptor(metrics, check_token, registry.slots.activity, check_admin)],
            options=[
                ("grpc.max_receive_message_length", limit),  # larger messages: RESOURCE_EXHAUSTED
                ("grpc.so_reuseport", 0),  # a port in use is an error, never a silently shared socket
            ],
        )
        self.server.add_generic_rpc_handlers((protocol.service_handler(InferenceServicer(registry, settings)),))
        health_pb2_grpc.add_HealthServicer_to_server(self.health, self.server)
        self.port: int | None = None

    def start(self) -> int:
        """Listen and serve; the port bound (the one asked for, or a free one for port 0 in tests)."""
        address = listen_address(self.settings.host, self.settings.grpc_port)
        try:
            self.port = self.server.add_insecure_port(address)
        except RuntimeError as e:
            raise RuntimeError(f"cannot listen for gRPC on {address} (CAPSNET_GRPC_PORT): {e}") from e
        for service in READINESS_SERVICES:
            self.health.set(service, NOT_SERVING)
        self.health.set(LIVENESS, SERVING)
        self.server.start()
        logger.info(
            "gRPC (Open Inference Protocol, grpc.health.v1) listening on %s",
            listen_address(self.settings.host, self.port),
        )
        return self.port

    def update_health(self) -> None:
        """Readiness follows the registry's: SERVING once loading is over and at least one model serves."""
        for service in READINESS_SERVICES:
            self.health.set(service, SERVING if self.registry.ready else NOT_SERVING)

    def stop(self) -> None:
        """Health turns NOT_SERVING, new calls are refused, calls in flight get up to the shutdown timeout (blocks
        until they are done)."""
        self.health.enter_graceful_shutdown()
        self.server.stop(grace=self.settings.shutdown_timeout_s).wait()
        self.pool.shutdown(wait=True)
        logger.info("gRPC stopped: calls in flight finished")

"""The one ASGI layer in front of the routes: request metrics, the count of requests in progress and the body size
limit (pure ASGI: no per-request objects beyond a closure, unlike BaseHTTPMiddleware)."""

from __future__ import annotations

import json
import time

from prometheus_client import Counter, Histogram
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from service.core.config import env_name
from service.core.errors import PayloadTooLarge, error_body
from service.core.metrics import Metrics
from service.runtime.slots import Activity

# Label values come from this set: h11 (uvicorn without httptools) passes any token as a method.
METHODS = frozenset({"GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS", "CONNECT", "TRACE"})
PROTOCOL = "http"  # the `protocol` label of the request metrics (the gRPC server counts as "grpc")


class ServiceMiddleware:
    """Counts requests by route template (not raw path), method and status, labels a client cannot multiply;
    answers 413 for a body over `max_bytes`: at once from Content-Length, or while a chunked body streams in."""

    def __init__(self, app: ASGIApp, metrics: Metrics, max_bytes: int, activity: Activity | None = None) -> None:
        self.app, self.metrics, self.max_bytes = app, metrics, max_bytes
        self.activity = activity or Activity()  # the requests in progress, read by the batchers (RunSlots)
        # The children of the two request metrics per (route template, method, status): a bounded set, as the
        # labels are.
        self._series: dict[tuple[str, str, int], tuple[Counter, Histogram]] = {}

    def too_large(self, size: int | None) -> str:
        told = f" ({size} bytes)" if size is not None else ""
        return f"request body too large{told}: the limit is {self.max_bytes} bytes ({env_name('max_body_bytes')})"

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        start = time.perf_counter()
        status = 500

        async def send_with_status(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
            await send(message)

        try:
            with self.activity.request():
                declared = self.declared_length(scope)
                if declared is not None and declared > self.max_bytes:
                    await self.reject(scope, send_with_status, self.too_large(declared))
                else:
                    await self.app(scope, self.counted(receive), send_with_status)
        finally:
            self.observe(scope, status, time.perf_counter() - start)

    @staticmethod
    def declared_length(scope: Scope) -> int | None:
        for name, value in scope["headers"]:
            if name == b"content-length":
                return int(value) if value.isdigit() else None
        return None

    def counted(self, receive: Receive) -> Receive:
        received = 0

        async def counted_receive() -> Message:
            nonlocal received
            message = await receive()
            if message["type"] == "http.request":
                received += len(message.get("body", b""))
                if received > self.max_bytes:
                    raise PayloadTooLarge(self.too_large(None))
            return message

        return counted_receive

    def observe(self, scope: Scope, status: int, seconds: float) -> None:
        route = getattr(scope.get("route"), "path", None) or "unmatched"
        method = scope["method"] if scope["method"] in METHODS else "other"
        key = (route, method, status)
        series = self._series.get(key)
        if series is None:  # labels() costs a lock and a validation: once per label set, not per request
            series = self._series[key] = (
                self.metrics.requests.labels(protocol=PROTOCOL, route=route, method=method, status=str(status)),
                self.metrics.request_latency.labels(protocol=PROTOCOL, route=route, method=method),
            )
        count, latency = series
        count.inc()
        latency.observe(seconds)

    @staticmethod
    async def reject(scope: Scope, send: Send, message: str) -> None:
        body = json.dumps(error_body(scope["path"], message, PayloadTooLarge.type)).encode()
        headers = [
            (b"content-type", b"application/json"),
            (b"content-length", str(len(body)).encode()),
            (b"connection", b"close"),
        ]
        await send({"type": "http.response.start", "status": 413, "headers": headers})
        await send({"type": "http.response.body", "body": body})

"""Pure ASGI middleware (cheaper than BaseHTTPMiddleware): request metrics and the body size limit."""

from __future__ import annotations

import json
import time

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from service.core.errors import PayloadTooLarge, error_body
from service.core.metrics import Metrics

# Label values come from this set: h11 (uvicorn without httptools) passes any token as a method.
METHODS = frozenset({"GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS", "CONNECT", "TRACE"})


class MetricsMiddleware:
    """Counts requests by route template (not raw path), method and status: labels a client cannot multiply."""

    def __init__(self, app: ASGIApp, metrics: Metrics) -> None:
        self.app, self.metrics = app, metrics

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
            await self.app(scope, receive, send_with_status)
        finally:
            route = getattr(scope.get("route"), "path", None) or "unmatched"
            method = scope["method"] if scope["method"] in METHODS else "other"
            labels = {"protocol": "http", "route": route, "method": method}
            self.metrics.requests.labels(**labels, status=str(status)).inc()
            self.metrics.request_latency.labels(**labels).observe(time.perf_counter() - start)


class BodyLimitMiddleware:
    """413 for a body over `max_bytes`: at once from Content-Length, or while a chunked body streams in."""

    def __init__(self, app: ASGIApp, max_bytes: int) -> None:
        self.app, self.max_bytes = app, max_bytes

    def message(self, size: int | None) -> str:
        told = f" ({size} bytes)" if size is not None else ""
        return f"request body too large{told}: the limit is {self.max_bytes} bytes (CAPSNET_MAX_BODY_BYTES)"

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        declared = dict(scope["headers"]).get(b"content-length")
        if declared is not None and declared.isdigit() and int(declared) > self.max_bytes:
            await self.reject(scope, send, self.message(int(declared)))
            return
        received = 0

        async def counted_receive() -> Message:
            nonlocal received
            message = await receive()
            if message["type"] == "http.request":
                received += len(message.get("body", b""))
                if received > self.max_bytes:
                    raise PayloadTooLarge(self.message(None))
            return message

        await self.app(scope, counted_receive, send)

    async def reject(self, scope: Scope, send: Send, message: str) -> None:
        body = json.dumps(error_body(scope["path"], message, PayloadTooLarge.type)).encode()
        headers = [
            (b"content-type", b"application/json"),
            (b"content-length", str(len(body)).encode()),
            (b"connection", b"close"),
        ]
        await send({"type": "http.response.start", "status": 413, "headers": headers})
        await send({"type": "http.response.body", "body": body})

"""The HTTP connection's own limits, which uvicorn's httptools protocol lacks: the size and field count of a request
head, the time to send its head and its body, the time a fresh connection may stay silent, and the number of open
connections.

`guarded_protocol(limits)` is the protocol class the server runs (service.main.http_server): uvicorn's httptools
protocol with the one-write responses of `service.api.coalesce`, and these checks. A request that breaks one is
answered at once (431, 408 or 503, JSON, `Connection: close`) and its connection closed (a body sent too slowly:
408 unless the route has answered already); each refusal is counted by reason and logged at debug level. The
keep-alive timeout between requests is uvicorn's own (`timeout_keep_alive`), set to the same idle timeout. A request
that arrives in one read, the usual case, arms no timer; the checks on it are a length sum over its headers.
"""

from __future__ import annotations

import json
import logging
from asyncio import TimerHandle, Transport
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, ClassVar

import httptools
from uvicorn.protocols.http.httptools_impl import STATUS_LINE

from service.api.coalesce import CoalescingHttpToolsProtocol
from service.core.config import Settings, env_name

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class ConnectionLimits:
    """The limits of `guarded_protocol`, and `refused(reason)`, called once per refused connection."""

    max_head_bytes: int
    max_headers: int
    head_timeout_s: float
    body_timeout_s: float
    idle_timeout_s: float
    max_connections: int
    refused: Callable[[str], None] = lambda reason: None

    @classmethod
    def from_settings(cls, settings: Settings, refused: Callable[[str], None] | None = None) -> ConnectionLimits:
        return cls(
            max_head_bytes=settings.http_max_header_bytes,
            max_headers=settings.http_max_headers,
            head_timeout_s=settings.http_head_timeout_s,
            body_timeout_s=settings.http_body_timeout_s,
            idle_timeout_s=settings.http_idle_timeout_s,
            max_connections=settings.http_max_connections,
            **({"refused": refused} if refused is not None else {}),
        )


@dataclass(frozen=True)
class Refusal:
    status: int
    reason: str  # the metric's label and the error's type
    message: str


class HeadRefused(Exception):
    """Raised from a parser callback to stop parsing a head that breaks a limit (httptools re-raises it wrapped)."""


class GuardedHttpToolsProtocol(CoalescingHttpToolsProtocol):
    """CoalescingHttpToolsProtocol with the limits of `limits` (see the module docstring)."""

    limits: ClassVar[ConnectionLimits]

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.timeout_keep_alive = self.limits.idle_timeout_s  # type: ignore[assignment]  # uvicorn's, between requests
        self.head_bytes: int | None = None  # bytes of the request head being read (counted per read); None: no head
        self.body_pending = False  # a request's head is read, its body not yet
        self.read_timer: TimerHandle | None = None  # the head's or the body's deadline, while one is being read
        self.refusal: Refusal | None = None  # why a parser callback stopped the parse

    def connection_made(self, transport: Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        limit = self.limits.max_connections
        if len(self.connections) > limit:
            self.refuse(
                Refusal(503, "too_many_connections", f"too many open connections: the limit is {limit} "
                        f"({env_name('http_max_connections')}); retry later")
            )  # fmt: skip
            return
        # A connection that never sends a byte is closed as an idle one between requests would be.
        self.timeout_keep_alive_task = self.loop.call_later(self.timeout_keep_alive, self.timeout_keep_alive_handler)

    def connection_lost(self, exc: Exception | None) -> None:
        self.cancel_read_timer()
        super().connection_lost(exc)

    def data_received(self, data: bytes) -> None:
        """uvicorn's, with the head's size and time checked; a malformed request is logged at debug level."""
        self._unset_keepalive_if_required()
        reading_head = self.head_bytes is not None
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserCallbackError:
            if self.refusal is None:
                raise
            self.refuse(self.refusal)
            return
        except httptools.HttpParserUpgrade:
            if self._should_upgrade():
                self.handle_websocket_upgrade()
            else:
                self._unsupported_upgrade_warning()
            return
        except httptools.HttpParserError as e:
            logger.debug("invalid HTTP request from %s: %s", self.client, e)
            self.limits.refused("invalid_request")
            self.send_400_response("Invalid HTTP request received.")
            return
        if self.body_pending and self.read_timer is None:
            self.read_timer = self.loop.call_later(self.limits.body_timeout_s, self.body_timed_out)
        if self.head_bytes is None:
            return
        if reading_head:  # this whole read belongs to the head (a head that began within it is counted from the next)
            self.head_bytes += len(data)
            if self.head_bytes > self.limits.max_head_bytes:
                self.refuse(self.head_too_large(self.head_bytes))
                return
        if self.read_timer is None:
            self.read_timer = self.loop.call_later(self.limits.head_timeout_s, self.head_timed_out)

    def on_message_begin(self) -> None:
        super().on_message_begin()
        self.head_bytes = 0

    def on_headers_complete(self) -> None:
        self.head_bytes = None
        self.cancel_read_timer()
        if len(self.headers) > self.limits.max_headers:
            self.refusal = Refusal(
                431, "too_many_headers", f"too many header fields: {len(self.headers)}, the limit is "
                f"{self.limits.max_headers} ({env_name('http_max_headers')})"
            )  # fmt: skip
            raise HeadRefused
        size = len(self.url) + sum(len(name) + len(value) + 4 for name, value in self.headers)
        if size > self.limits.max_head_bytes:
            self.refusal = self.head_too_large(size)
            raise HeadRefused
        super().on_headers_complete()
        self.body_pending = True

    def on_message_complete(self) -> None:
        self.body_pending = False
        self.cancel_read_timer()
        super().on_message_complete()

    def head_too_large(self, size: int) -> Refusal:
        return Refusal(
            431, "header_too_large", f"request head too large: {size} bytes or more, the limit is "
            f"{self.limits.max_head_bytes} ({env_name('http_max_header_bytes')})"
        )  # fmt: skip

    def head_timed_out(self) -> None:
        self.read_timer = None
        timeout = self.limits.head_timeout_s
        self.refuse(
            Refusal(408, "head_timeout", f"request head not complete within {timeout:g} s "
                    f"({env_name('http_head_timeout_s')})")
        )  # fmt: skip

    def body_timed_out(self) -> None:
        self.read_timer = None
        timeout = self.limits.body_timeout_s
        answered = self.cycle is None or self.cycle.response_started  # the route answered without the whole body
        self.refuse(
            Refusal(408, "body_timeout", f"request body not complete within {timeout:g} s "
                    f"({env_name('http_body_timeout_s')})"),
            answer=not answered,
        )  # fmt: skip

    def cancel_read_timer(self) -> None:
        if self.read_timer is not None:
            self.read_timer.cancel()
            self.read_timer = None

    def refuse(self, refusal: Refusal, answer: bool = True) -> None:
        """Answer `refusal` (with `answer`, unless a response is being written on this connection) and close the
        connection."""
        self.cancel_read_timer()
        self.head_bytes, self.body_pending = None, False
        logger.debug("refused a connection from %s: %s", self.client, refusal.message)
        self.limits.refused(refusal.reason)
        if self.transport.is_closing():
            return
        writing = self.cycle is not None and self.cycle.response_started and not self.cycle.response_complete
        if answer and not writing:
            body = json.dumps({"error": refusal.message, "type": refusal.reason}).encode()
            head = [STATUS_LINE[refusal.status]]
            head += [name + b": " + value + b"\r\n" for name, value in self.server_state.default_headers]
            head.append(b"content-type: application/json\r\ncontent-length: %d\r\n" % len(body))
            if refusal.status == 503:
                head.append(b"retry-after: 1\r\n")
            self.transport.write(b"".join([*head, b"connection: close\r\n\r\n", body]))
        self.transport.close()


def guarded_protocol(limits: ConnectionLimits) -> type[GuardedHttpToolsProtocol]:
    """The protocol class for uvicorn's `http` option, bound to `limits`."""
    return type("GuardedHttpToolsProtocol", (GuardedHttpToolsProtocol,), {"limits": limits})

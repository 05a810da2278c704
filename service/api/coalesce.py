"""uvicorn's httptools protocol, but a response's head leaves in one write with its body.

uvicorn writes the status line and headers on `http.response.start` and the body on `http.response.body`: two
sends on the socket per response, and the client wakes up twice. Each request cycle here writes through a
`HeadHoldingTransport`, which keeps the head back until the body's first write and sends both at once. A head
is never held past the end of the event-loop iteration that wrote it (a streamed body, a HEAD response without
one), so nothing waits and the bytes keep their order; closing the connection sends it first.
"""

from __future__ import annotations

import asyncio
from typing import Any

from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

CONTINUE = b"HTTP/1.1 100 "  # the interim "100 Continue" answer, which goes out at once


class HeadHoldingTransport:
    """One request cycle's view of the connection's transport: its first write (the response head) is held until
    the next write or the end of the loop iteration, whichever comes first; everything else is the transport's."""

    __slots__ = ("_armed", "_held", "_loop", "_transport")

    def __init__(self, transport: asyncio.Transport, loop: asyncio.AbstractEventLoop) -> None:
        self._transport, self._loop = transport, loop
        self._armed = True  # the next write (but an interim 100 Continue) is the response head
        self._held: bytes | None = None

    def write(self, data: bytes) -> None:
        if self._armed and not data.startswith(CONTINUE):
            self._armed = False
            self._held = data
            self._loop.call_soon(self.flush)
            return
        if self._held is not None:
            data, self._held = self._held + data, None
        self._transport.write(data)

    def flush(self) -> None:
        """Send a head still held (no body followed it in the same loop iteration)."""
        if self._held is not None:
            held, self._held = self._held, None
            self._transport.write(held)

    def close(self) -> None:
        self.flush()
        self._transport.close()

    def __getattr__(self, name: str) -> Any:  # is_closing, get_extra_info, …: the transport's own
        return getattr(self._transport, name)


class CoalescingHttpToolsProtocol(HttpToolsProtocol):
    """HttpToolsProtocol whose request cycles write through a HeadHoldingTransport (see the module docstring)."""

    def on_headers_complete(self) -> None:
        previous = self.cycle
        super().on_headers_complete()
        if self.cycle is not previous:  # a new request cycle (not an upgrade), its task not started yet
            self.cycle.transport = HeadHoldingTransport(self.transport, self.loop)  # type: ignore[assignment]

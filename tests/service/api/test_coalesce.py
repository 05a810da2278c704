"""A response's head leaves in one write with its body, never later than the loop iteration that wrote it."""

from __future__ import annotations

import asyncio
import socket

import pytest
import uvicorn

from service.api.coalesce import CoalescingHttpToolsProtocol, HeadHoldingTransport
from service.core.config import Settings
from service.main import create_app, serve


class RecordingTransport:
    def __init__(self) -> None:
        self.writes: list[bytes] = []
        self.closed = False

    def write(self, data: bytes) -> None:
        assert not self.closed, "write after close"
        self.writes.append(data)

    def close(self) -> None:
        self.closed = True

    def is_closing(self) -> bool:
        return self.closed


HEAD = b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\n"


def held(transport: RecordingTransport, loop: asyncio.AbstractEventLoop) -> HeadHoldingTransport:
    return HeadHoldingTransport(transport, loop)  # type: ignore[arg-type]


def test_head_and_body_leave_in_one_write() -> None:
    asyncio.run(_test_head_and_body_leave_in_one_write())


async def _test_head_and_body_leave_in_one_write() -> None:
    inner = RecordingTransport()
    transport = held(inner, asyncio.get_running_loop())
    transport.write(HEAD)
    assert inner.writes == []
    transport.write(b"{}")
    assert inner.writes == [HEAD + b"{}"]
    await asyncio.sleep(0)  # the pending flush finds nothing left to send
    transport.write(b"more")
    assert inner.writes == [HEAD + b"{}", b"more"]


def test_a_head_without_a_body_leaves_at_the_end_of_the_iteration() -> None:
    asyncio.run(_test_a_head_without_a_body_leaves_at_the_end_of_the_iteration())


async def _test_a_head_without_a_body_leaves_at_the_end_of_the_iteration() -> None:
    inner = RecordingTransport()
    transport = held(inner, asyncio.get_running_loop())
    transport.write(HEAD)  # e.g. a HEAD response, or a body streamed later
    await asyncio.sleep(0)
    assert inner.writes == [HEAD]


def test_closing_sends_the_held_head_first() -> None:
    asyncio.run(_test_closing_sends_the_held_head_first())


async def _test_closing_sends_the_held_head_first() -> None:
    inner = RecordingTransport()
    transport = held(inner, asyncio.get_running_loop())
    transport.write(HEAD)
    transport.close()
    assert inner.writes == [HEAD] and inner.closed and transport.is_closing()
    await asyncio.sleep(0)
    assert inner.writes == [HEAD]


def test_100_continue_goes_out_at_once_and_the_head_is_still_held() -> None:
    asyncio.run(_test_100_continue_goes_out_at_once_and_the_head_is_still_held())


async def _test_100_continue_goes_out_at_once_and_the_head_is_still_held() -> None:
    inner = RecordingTransport()
    transport = held(inner, asyncio.get_running_loop())
    transport.write(b"HTTP/1.1 100 Continue\r\n\r\n")
    assert inner.writes == [b"HTTP/1.1 100 Continue\r\n\r\n"]
    transport.write(HEAD)
    transport.write(b"{}")
    assert inner.writes == [b"HTTP/1.1 100 Continue\r\n\r\n", HEAD + b"{}"]


def test_the_server_runs_on_the_coalescing_protocol(monkeypatch: pytest.MonkeyPatch) -> None:
    """serve() hands uvicorn the protocol class; the live-server tests then exercise it on every response."""
    seen: dict[str, object] = {}

    def run(self: uvicorn.Server, sockets: list[socket.socket] | None = None) -> None:
        seen["http"] = self.config.http
        for sock in sockets or []:
            sock.close()

    monkeypatch.setattr(uvicorn.Server, "run", run)
    with pytest.raises(SystemExit):  # the recording run never starts the server: serve() exits 1, as it says
        settings = Settings(port=0, grpc_port=0)
        serve(settings, create_app(settings))
    assert isinstance(seen["http"], type) and issubclass(seen["http"], CoalescingHttpToolsProtocol)

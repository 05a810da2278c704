"""The HTTP connection's limits (service.api.connection), through the real server: uvicorn on a socket, in-process."""

from __future__ import annotations

import contextlib
import json
import socket
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import httpx
import pytest

from service.main import create_app, http_server, listening_socket
from tests.service.conftest import TINY, service_settings

HEAD_TIMEOUT_S = 0.5
IDLE_TIMEOUT_S = 0.5
MAX_CONNECTIONS = 4
MAX_HEADER_BYTES = 4096
MAX_HEADERS = 20


@contextmanager
def serving(repository: Path, **settings: Any) -> Iterator[tuple[str, int]]:
    """`http_server` (the protocol `capsnet-serve` runs) on a free port in a thread; yields (host, port) once ready."""
    settings = service_settings(repository, default_model=TINY, host="127.0.0.1", port=0, **settings)
    app = create_app(settings)
    server = http_server(settings, app)
    sock = listening_socket("127.0.0.1", 0)
    port = sock.getsockname()[1]
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    try:
        deadline = time.monotonic() + 60
        while not (server.started and app.state.registry.started):
            assert time.monotonic() < deadline, "the server did not start"
            time.sleep(0.05)
        yield "127.0.0.1", port
    finally:
        server.should_exit = True
        thread.join(30)


@pytest.fixture(scope="module")
def address(model_repository: Path) -> Iterator[tuple[str, int]]:
    limits = dict(
        http_head_timeout_s=HEAD_TIMEOUT_S,
        http_idle_timeout_s=IDLE_TIMEOUT_S,
        http_max_connections=MAX_CONNECTIONS,
        http_max_header_bytes=MAX_HEADER_BYTES,
        http_max_headers=MAX_HEADERS,
    )
    with serving(model_repository, **limits) as served:
        yield served


def exchange(address: tuple[str, int], data: bytes, timeout_s: float = 10.0) -> tuple[bytes, float]:
    """Send `data` on a new connection; (everything the server sent until it closed, seconds that took)."""
    with socket.create_connection(address, timeout=timeout_s) as sock:
        start = time.monotonic()
        with contextlib.suppress(BrokenPipeError, ConnectionResetError):  # refused while sending: read the answer
            sock.sendall(data)
        return read_all(sock), time.monotonic() - start


def read_all(sock: socket.socket) -> bytes:
    chunks = []
    with contextlib.suppress(ConnectionResetError):
        while chunk := sock.recv(65536):
            chunks.append(chunk)
    return b"".join(chunks)


def refusal(answer: bytes) -> tuple[int, dict[str, str], dict[str, Any]]:
    """(status, headers, JSON body) of a response that closes its connection."""
    head, _, body = answer.partition(b"\r\n\r\n")
    status_line, *lines = head.decode("latin-1").split("\r\n")
    headers = {k.lower(): v.strip() for k, _, v in (line.partition(":") for line in lines)}
    return int(status_line.split()[1]), headers, json.loads(body)


def get(path: str = "/health/live", *headers: bytes) -> bytes:
    return b"GET " + path.encode() + b" HTTP/1.1\r\nHost: test\r\n" + b"".join(h + b"\r\n" for h in headers) + b"\r\n"


def test_a_plain_request_is_served_with_nosniff_and_no_server_banner(address: tuple[str, int]) -> None:
    answer, _ = exchange(address, get("/health/live", b"Connection: close"))
    head = answer.partition(b"\r\n\r\n")[0].lower()
    assert head.startswith(b"http/1.1 200 ")
    assert b"\r\nx-content-type-options: nosniff" in head
    assert b"\r\nserver:" not in head


def test_a_request_head_over_the_byte_limit_is_refused_431(address: tuple[str, int]) -> None:
    status, headers, body = refusal(exchange(address, get("/health/live", b"X-Big: " + b"a" * MAX_HEADER_BYTES))[0])
    assert status == 431 and headers["connection"] == "close" and headers["x-content-type-options"] == "nosniff"
    assert body["type"] == "header_too_large"
    assert f"the limit is {MAX_HEADER_BYTES} (CAPSNET_HTTP_MAX_HEADER_BYTES)" in body["error"]


def test_a_head_that_never_ends_is_refused_once_it_passes_the_limit(address: tuple[str, int]) -> None:
    """A 4 MB header value with no end: refused from its first reads, not buffered to the end."""
    answer, seconds = exchange(address, b"GET / HTTP/1.1\r\nX-Big: " + b"a" * (4 << 20))
    status, _, body = refusal(answer)
    assert status == 431 and body["type"] == "header_too_large" and seconds < 5


def test_too_many_header_fields_are_refused_431(address: tuple[str, int]) -> None:
    fields = [b"X-%d: 1" % i for i in range(MAX_HEADERS + 1)]
    status, _, body = refusal(exchange(address, get("/health/live", *fields))[0])
    assert status == 431 and body == {
        "error": f"too many header fields: {MAX_HEADERS + 2}, the limit is {MAX_HEADERS} (CAPSNET_HTTP_MAX_HEADERS)",
        "type": "too_many_headers",
    }


def test_a_head_sent_too_slowly_is_refused_408(address: tuple[str, int]) -> None:
    answer, seconds = exchange(address, b"GET /health/li")
    status, headers, body = refusal(answer)
    assert status == 408 and headers["connection"] == "close"
    assert body == {
        "error": f"request head not complete within {HEAD_TIMEOUT_S:g} s (CAPSNET_HTTP_HEAD_TIMEOUT_S)",
        "type": "head_timeout",
    }
    assert HEAD_TIMEOUT_S * 0.9 < seconds < HEAD_TIMEOUT_S + 3


def test_a_connection_that_sends_nothing_is_closed_after_the_idle_timeout(address: tuple[str, int]) -> None:
    answer, seconds = exchange(address, b"")
    assert answer == b"" and IDLE_TIMEOUT_S * 0.9 < seconds < IDLE_TIMEOUT_S + 3


def test_a_keep_alive_connection_serves_requests_then_closes_when_idle(address: tuple[str, int]) -> None:
    with socket.create_connection(address, timeout=10) as sock:
        for _ in range(2):
            sock.sendall(get())
            assert sock.recv(65536).startswith(b"HTTP/1.1 200 ")
        start = time.monotonic()
        assert read_all(sock) == b"" and time.monotonic() - start < IDLE_TIMEOUT_S + 3


def test_connections_over_the_cap_are_answered_503_and_closed(address: tuple[str, int]) -> None:
    held = [socket.create_connection(address, timeout=10) for _ in range(MAX_CONNECTIONS)]
    try:
        time.sleep(0.1)  # the server has accepted them
        status, headers, body = refusal(exchange(address, get())[0])
        assert status == 503 and headers["retry-after"] == "1" and body["type"] == "too_many_connections"
        assert f"the limit is {MAX_CONNECTIONS} (CAPSNET_HTTP_MAX_CONNECTIONS)" in body["error"]
    finally:
        for sock in held:
            sock.close()
    time.sleep(0.1)
    assert exchange(address, get("/health/live", b"Connection: close"))[0].startswith(b"HTTP/1.1 200 ")


def test_refusals_are_counted_by_reason_and_logged_without_traceback(
    address: tuple[str, int], caplog: pytest.LogCaptureFixture
) -> None:
    with caplog.at_level("DEBUG"):
        exchange(address, get("/", b"X-Big: " + b"a" * MAX_HEADER_BYTES))
        exchange(address, b"NOT HTTP\r\n\r\n")
    metrics = httpx.get(f"http://{address[0]}:{address[1]}/metrics").text
    for reason in ("header_too_large", "invalid_request"):
        assert f'capsnet_http_connections_refused_total{{reason="{reason}"}}' in metrics
    refused = [r for r in caplog.records if r.name == "service.api.connection"]
    assert refused and all(r.levelname == "DEBUG" and r.exc_info is None for r in refused)


def test_a_body_sent_too_slowly_is_refused_408(model_repository: Path) -> None:
    with serving(model_repository, http_body_timeout_s=0.5) as address:
        head = (
            b"POST /v1/classify HTTP/1.1\r\nHost: test\r\nContent-Type: application/json\r\nContent-Length: 100\r\n\r\n"
        )
        answer, seconds = exchange(address, head + b'{"images": [')
        status, headers, body = refusal(answer)
        assert (status, headers["connection"]) == (408, "close") and 0.45 < seconds < 3.5
        assert body == {
            "error": "request body not complete within 0.5 s (CAPSNET_HTTP_BODY_TIMEOUT_S)",
            "type": "body_timeout",
        }
        with socket.create_connection(address, timeout=10) as sock:  # a body sent in pieces, in time, is served
            sock.sendall(head.replace(b"100", b"2").replace(b"classify", b"decode") + b"{")
            time.sleep(0.2)
            sock.sendall(b"}\r\n")
            assert sock.recv(65536).startswith(b"HTTP/1.1 400 ")


def test_a_slow_body_after_the_route_answered_only_closes_the_connection(model_repository: Path) -> None:
    """The route answered (415, without reading the body): the late body's timeout closes, adding no second answer."""
    with serving(model_repository, http_body_timeout_s=0.5) as address:
        head = b"POST /v1/classify HTTP/1.1\r\nHost: test\r\nContent-Type: text/plain\r\nContent-Length: 100\r\n\r\n"
        answer, seconds = exchange(address, head + b"abc")
        assert answer.startswith(b"HTTP/1.1 415 ") and answer.count(b"HTTP/1.1 ") == 1 and seconds < 3.5

"""Multipart bodies parsed in memory into (field name, filename, bytes): no temporary files, no form objects.

The body has already been read whole (the service's body limit bounds it), so each part is a slice of it; the
messages for malformed bodies are Starlette's, so clients see the same errors as from `request.form()`. A body
in the plain form that clients send (no preamble, `Name: value` header lines) is split with a few `find`s
(`plain_parts`); any other goes through python-multipart's parser (`parse_parts`), which answers every body
the same way as before, so the split only ever changes the speed.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from python_multipart.exceptions import FormParserError
from python_multipart.multipart import (
    DEFAULT_MAX_HEADER_COUNT,
    DEFAULT_MAX_HEADER_SIZE,
    TOKEN_CHARS,
    MultipartParser,
    parse_options_header,
)


class MalformedMultipart(ValueError):
    """The body is not valid multipart/form-data; str() says why."""


@dataclass
class Part:
    name: str
    filename: str | None  # None: a form field, not a file
    data: bytearray = field(default_factory=bytearray)


def _decode(value: bytes) -> str:
    try:
        return value.decode("utf-8")
    except UnicodeDecodeError:
        return value.decode("latin-1")


class _Collector:
    """python-multipart callbacks that collect the parts."""

    def __init__(self) -> None:
        self.parts: list[Part] = []
        self._header_name = b""
        self._header_value = b""
        self._disposition = b""

    def on_part_begin(self) -> None:
        self._disposition = b""

    def on_header_field(self, data: bytes, start: int, end: int) -> None:
        self._header_name += data[start:end]

    def on_header_value(self, data: bytes, start: int, end: int) -> None:
        self._header_value += data[start:end]

    def on_header_end(self) -> None:
        if self._header_name.lower() == b"content-disposition":
            self._disposition = self._header_value
        self._header_name = self._header_value = b""

    def on_headers_finished(self) -> None:
        _, options = parse_options_header(self._disposition)
        if b"name" not in options:
            raise MalformedMultipart('The Content-Disposition header field "name" must be provided.')
        filename = options.get(b"filename")
        self.parts.append(Part(_decode(options[b"name"]), None if filename is None else _decode(filename)))

    def on_part_data(self, data: bytes, start: int, end: int) -> None:
        self.parts[-1].data += data[start:end]


def parse_multipart(content_type: str, body: bytes) -> list[Part]:
    """Every part of a multipart/form-data `body`, in order.

    Raises:
        MalformedMultipart: no boundary in `content_type`, or a body that does not parse.
    """
    _, params = parse_options_header(content_type)
    boundary = params.get(b"boundary")
    if not boundary:
        raise MalformedMultipart("Missing boundary in multipart.")
    parts = plain_parts(boundary, body)
    return parts if parts is not None else parse_parts(boundary, body)


def parse_parts(boundary: bytes, body: bytes) -> list[Part]:
    """Every part of `body` by python-multipart's parser (any body; MalformedMultipart when it does not parse)."""
    collector = _Collector()
    parser = MultipartParser(
        boundary,
        {
            "on_part_begin": collector.on_part_begin,
            "on_header_field": collector.on_header_field,
            "on_header_value": collector.on_header_value,
            "on_header_end": collector.on_header_end,
            "on_headers_finished": collector.on_headers_finished,
            "on_part_data": collector.on_part_data,
        },
    )
    try:
        parser.write(body)
        parser.finalize()
    except FormParserError as e:
        raise MalformedMultipart("Invalid multipart data.") from e
    return collector.parts


def plain_parts(boundary: bytes, body: bytes) -> list[Part] | None:
    """The parts of a body in the plain form, as `parse_parts` gives them; None for a body in any other form.

    Plain: `--boundary CRLF`, then parts separated by `CRLF --boundary CRLF` and closed by `CRLF --boundary--`
    (and at most a CRLF); each part has `Name: value` header lines (token names, values free of CR and LF, within
    python-multipart's limits of count and size), a named Content-Disposition among them, a blank line, data.
    """
    dash = b"--" + boundary
    delimiter = b"\r\n" + dash
    if not body.startswith(dash + b"\r\n"):
        return None
    parts, start = [], len(dash) + 2
    while (end := body.find(delimiter, start)) >= 0:
        part = _plain_part(body, start, end)
        if part is None:
            return None
        parts.append(part)
        after = end + len(delimiter)
        if body.startswith(b"--", after):
            return parts if body[after + 2 :] in (b"", b"\r\n") else None
        if not body.startswith(b"\r\n", after):
            return None
        start = after + 2
    return None


def _plain_part(body: bytes, start: int, end: int) -> Part | None:
    """The part in body[start:end] if its headers are plain (see `plain_parts`), else None."""
    head_end = body.find(b"\r\n\r\n", start, end)
    if head_end <= start:
        return None
    lines = body[start:head_end].split(b"\r\n")
    if len(lines) > DEFAULT_MAX_HEADER_COUNT:
        return None
    disposition = None
    for line in lines:
        name, colon, value = line.partition(b":")
        if not colon or not name or name.translate(None, TOKEN_CHARS) or len(line) > DEFAULT_MAX_HEADER_SIZE:
            return None
        if b"\r" in value or b"\n" in value:
            return None
        if name.lower() == b"content-disposition":
            disposition = value.lstrip(b" ")
    if disposition is None:
        return None
    _, options = parse_options_header(disposition)
    if b"name" not in options:
        return None
    filename = None if b"filename" not in options else _decode(options[b"filename"])
    return Part(_decode(options[b"name"]), filename, bytearray(body[head_end + 4 : end]))

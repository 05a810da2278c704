"""Multipart bodies parsed in memory into (field name, filename, bytes): no temporary files, no form objects.

The body has already been read whole (the service's body limit bounds it), so each part is a slice of it; the
messages for malformed bodies are Starlette's, so clients see the same errors as from `request.form()`.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from python_multipart.exceptions import FormParserError
from python_multipart.multipart import MultipartParser, parse_options_header


class MalformedMultipart(ValueError):
    """The body is not valid multipart/form-data; str() says why."""


class TooManyParts(ValueError):
    """The body has more parts than allowed (counted by their delimiters, before any part is parsed)."""

    def __init__(self, parts: int) -> None:
        super().__init__(f"{parts} parts")
        self.parts = parts


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


def parse_multipart(content_type: str, body: bytes, max_parts: int | None = None) -> list[Part]:
    """Every part of a multipart/form-data `body`, in order.

    Raises:
        MalformedMultipart: no boundary in `content_type` (or one the parser refuses), or a body that does not parse.
        TooManyParts: more than `max_parts` delimiters in the body (checked before parsing it).
    """
    _, params = parse_options_header(content_type)
    boundary = params.get(b"boundary")
    if not boundary:
        raise MalformedMultipart("Missing boundary in multipart.")
    if max_parts is not None and (parts := body.count(b"--" + boundary) - 1) > max_parts:
        raise TooManyParts(parts)
    single = single_part(boundary, body)
    return [single] if single is not None else _parse(boundary, body)


def single_part(boundary: bytes, body: bytes) -> Part | None:
    """The one part of the plainest body (one part; its only headers a Content-Disposition and perhaps a
    Content-Type; no preamble, padding or epilogue), found with a few `bytes.find`s; None for any other body, which
    python-multipart then reads. Its state machine walks the part's headers a byte at a time in Python, a lone
    request's cost that cold caches after a model run multiply (docs/serving-performance.md);
    tests/service/api/test_multipart.py checks that whatever this returns is what python-multipart returns."""
    opening, closing = b"--" + boundary + b"\r\n", b"\r\n--" + boundary + b"--\r\n"
    if not (body.startswith(opening) and body.endswith(closing)):
        return None
    head_end = body.find(b"\r\n\r\n", len(opening))
    data_end = len(body) - len(closing)
    if head_end < 0 or head_end + 4 > data_end or b"\r\n--" + boundary in body[len(opening) : data_end]:
        return None  # no blank line after the headers, or more than one part
    disposition = None
    for line in body[len(opening) : head_end].split(b"\r\n"):
        name, colon, value = line.partition(b":")
        name = name.lower()
        if not colon or name not in (b"content-disposition", b"content-type"):
            return None
        if name == b"content-disposition":
            if disposition is not None:
                return None
            disposition = value
    _, options = parse_options_header(disposition)
    if b"name" not in options:
        return None
    filename = options.get(b"filename")
    name_text = _decode(options[b"name"])
    return Part(name_text, None if filename is None else _decode(filename), bytearray(body[head_end + 4 : data_end]))


def _parse(boundary: bytes, body: bytes) -> list[Part]:
    """Every part, by python-multipart."""
    collector = _Collector()
    try:
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
    except FormParserError as e:  # e.g. a boundary longer than the parser takes
        raise MalformedMultipart(f"bad boundary: {e}") from e
    try:
        parser.write(body)
        parser.finalize()
    except FormParserError as e:
        raise MalformedMultipart("Invalid multipart data.") from e
    return collector.parts

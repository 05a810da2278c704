"""Multipart parsing in memory: parts keep their bytes, a body without a boundary is malformed."""

from __future__ import annotations

import pytest

from service.api.multipart import MalformedMultipart, parse_multipart

B = b"xYz"
PNG = b"\x89PNG\r\n\x1a\n" + bytes(range(256)) + b"\r\n--xY" + b"\r\n-" + b"--xYz-"  # boundary-like bytes inside


def part(disposition: bytes, data: bytes, *headers: bytes) -> bytes:
    return b"\r\n".join([b"Content-Disposition: " + disposition, *headers, b"", data])


def body(*parts: bytes, end: bytes = b"\r\n") -> bytes:
    return b"--" + B + b"\r\n" + (b"\r\n--" + B + b"\r\n").join(parts) + b"\r\n--" + B + b"--" + end


FILE = part(b'form-data; name="files"; filename="digit.png"', PNG, b"Content-Type: image/png")


def test_a_file_keeps_its_bytes_and_boundary_like_content() -> None:
    (got,) = parse_multipart("multipart/form-data; boundary=xYz", body(FILE))
    assert (got.name, got.filename, bytes(got.data)) == ("files", "digit.png", PNG)


def test_missing_boundary_is_malformed() -> None:
    with pytest.raises(MalformedMultipart, match=r"^Missing boundary in multipart\.$"):
        parse_multipart("multipart/form-data", body(FILE))

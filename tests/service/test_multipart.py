"""Multipart parsing: the plain-form split gives exactly python-multipart's parts, or steps aside."""

from __future__ import annotations

import pytest

from service.api.multipart import MalformedMultipart, Part, parse_multipart, parse_parts, plain_parts

B = b"xYz"
PNG = b"\x89PNG\r\n\x1a\n" + bytes(range(256)) + b"\r\n--xY" + b"\r\n-" + b"--xYz-"  # boundary-like bytes inside


def part(disposition: bytes, data: bytes, *headers: bytes) -> bytes:
    return b"\r\n".join([b"Content-Disposition: " + disposition, *headers, b"", data])


def body(*parts: bytes, end: bytes = b"\r\n") -> bytes:
    return b"--" + B + b"\r\n" + (b"\r\n--" + B + b"\r\n").join(parts) + b"\r\n--" + B + b"--" + end


FILE = part(b'form-data; name="files"; filename="digit.png"', PNG, b"Content-Type: image/png")
PLAIN = {
    "one file": body(FILE),
    "no final CRLF": body(FILE, end=b""),
    "three files": body(FILE, part(b'form-data; name="files"; filename="b.png"', b""), FILE),
    "a form field": body(part(b'form-data; name="top_k"', b"3")),
    "utf-8 and latin-1 names": body(
        part('form-data; name="f"; filename="chiffre-é.png"'.encode(), b"x"),
        part('form-data; name="f"; filename="chiffre-é.png"'.encode("latin-1"), b"y"),
    ),
    "lower-case header, spaces": body(
        b'content-disposition:    form-data; name="files"; filename="a.png"  \r\nX-Extra: 1\r\n\r\n' + PNG
    ),
    "two dispositions, the last counts": body(
        part(b'form-data; name="first"', b"v", b'Content-Disposition: form-data; name="second"; filename="s"')
    ),
}
NOT_PLAIN = {
    "preamble": b"preamble\r\n" + body(FILE),
    "leading CRLF": b"\r\n" + body(FILE),
    "epilogue": body(FILE, end=b"\r\nepilogue"),
    "padding after a delimiter": body(FILE).replace(b"--xYz\r\n", b"--xYz  \r\n", 1),
    "no close delimiter": body(FILE)[: -len(b"\r\n--xYz--\r\n")],
    "truncated": body(FILE)[:40],
    "no name": body(part(b'form-data; filename="a.png"', b"x")),
    "no disposition": body(b"Content-Type: image/png\r\n\r\nx"),
    "no headers": body(b"\r\nx"),
    "bad header name": body(part(b'form-data; name="f"', b"x", b"Bad Header: 1")),
    "header without colon": body(part(b'form-data; name="f"', b"x", b"NoColon")),
    "lone CR in a header": body(part(b'form-data; name="f"', b"x", b"X-A: 1\r2")),
    "lone LF in a header": body(part(b'form-data; name="f"', b"x", b"X-A: 1\n2")),
    "too many headers": body(part(b'form-data; name="f"', b"x", *(b"X-%d: 1" % i for i in range(8)))),
    "a long header": body(part(b'form-data; name="f"', b"x", b"X-A: " + b"a" * 5000)),
    "an empty body": b"",
}


def outcome(parse: object) -> list[tuple[str, str | None, bytes]] | str:
    try:
        parts: list[Part] = parse()  # type: ignore[operator]
    except MalformedMultipart as e:
        return f"error: {e}"
    return [(p.name, p.filename, bytes(p.data)) for p in parts]


@pytest.mark.parametrize("name", PLAIN)
def test_plain_bodies_are_split_as_python_multipart_parses_them(name: str) -> None:
    data = PLAIN[name]
    split = plain_parts(B, data)
    assert split is not None, "the plain form must take the fast split"
    assert outcome(lambda: split) == outcome(lambda: parse_parts(B, data))
    assert outcome(lambda: parse_multipart(f"multipart/form-data; boundary={B.decode()}", data)) == outcome(
        lambda: split
    )


@pytest.mark.parametrize("name", NOT_PLAIN)
def test_other_bodies_go_to_python_multipart(name: str) -> None:
    data = NOT_PLAIN[name]
    assert plain_parts(B, data) is None
    content_type = f"multipart/form-data; boundary={B.decode()}"
    assert outcome(lambda: parse_multipart(content_type, data)) == outcome(lambda: parse_parts(B, data))


def test_a_file_keeps_its_bytes_and_boundary_like_content() -> None:
    (got,) = parse_multipart("multipart/form-data; boundary=xYz", PLAIN["one file"])
    assert (got.name, got.filename, bytes(got.data)) == ("files", "digit.png", PNG)


def test_missing_boundary_is_malformed() -> None:
    with pytest.raises(MalformedMultipart, match=r"^Missing boundary in multipart\.$"):
        parse_multipart("multipart/form-data", PLAIN["one file"])

"""Multipart parsing in memory: parts keep their bytes, a body without a boundary is malformed."""

from __future__ import annotations

import random

import pytest

from service.api.multipart import MalformedMultipart, Part, _parse, parse_multipart, single_part

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


def fuzzed_body(rng: random.Random) -> bytes:
    """A multipart body for boundary B, mostly plain, with the variations clients and attackers send."""
    b = B.decode()
    names = ["Content-Disposition", "content-disposition", "CONTENT-DISPOSITION", "Content-Type", "X-Extra"]
    names += ["Content Disposition", "Content-Disposition ", ""]
    dispositions = [
        'form-data; name="files"; filename="d.png"',
        'form-data; name="files"',
        'form-data; filename="d.png"',
        '  form-data; name="a b"; filename="x\\"y.png"',
        "\tform-data; name=files",
        "form-data",
    ]
    data_pieces = [b"\x89PNG\r\n\x1a\n", b"\r\n", f"--{b}".encode(), f"\r\n--{b}".encode(), f"\r\n--{b}--".encode()]
    data_pieces += [b"\r\n\r\n", b"abc", bytes(range(256)), b"-", b"\r"]

    def one_part() -> bytes:
        headers = [f"{rng.choice(names[:3] if rng.random() < 0.9 else names)}: {rng.choice(dispositions)}"]
        if rng.random() < 0.5:
            headers.insert(rng.randrange(2), f"{rng.choice(names[3:5] if rng.random() < 0.9 else names)}: image/png")
        if rng.random() < 0.1:
            headers.append(f"{names[0]}: {dispositions[0]}")
        pieces = data_pieces if rng.random() < 0.3 else data_pieces[:2] + data_pieces[5:]  # boundary-like or not
        data = b"".join(rng.choice(pieces) for _ in range(rng.randrange(6)))
        return "\r\n".join(headers).encode() + b"\r\n\r\n" + data

    parts = [one_part() for _ in range(1 if rng.random() < 0.8 else 2)]
    opening = rng.choice([f"--{b}\r\n"] * 20 + [f"preamble\r\n--{b}\r\n", f"--{b} \r\n", f"--{b}\n", f"-{b}\r\n"])
    closing = rng.choice([f"\r\n--{b}--\r\n"] * 20 + [f"\r\n--{b}--", f"\r\n--{b}--\r\nepilogue", f"\r\n--{b}\r\n", ""])
    return opening.encode() + f"\r\n--{b}\r\n".encode().join(parts) + closing.encode()


def test_the_plain_body_shortcut_agrees_with_python_multipart() -> None:
    rng, taken = random.Random(7), 0
    for _ in range(4000):
        data = fuzzed_body(rng)
        single = single_part(B, data)
        try:
            full: list[Part] | None = _parse(B, data)
        except MalformedMultipart:
            full = None
        if single is not None:
            taken += 1
            assert full == [single], data
    assert taken > 500  # the shortcut took a good share of the bodies, the full parser the rest


def test_the_shortcut_leaves_everything_but_one_plain_part_to_the_full_parser() -> None:
    two = body(FILE, FILE)
    assert single_part(B, body(FILE)) is not None
    for other in (two, b"preamble\r\n" + body(FILE), body(FILE, end=b""), body(FILE) + b"epilogue"):
        assert single_part(B, other) is None
    assert len(parse_multipart("multipart/form-data; boundary=xYz", two)) == 2

"""Every bad input gets a 4xx JSON error that names the problem, and the service keeps serving."""

from __future__ import annotations

import base64
import io
import logging
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from fastapi.testclient import TestClient
from PIL import Image

from tests.service.conftest import EM_LIKE, NO_DECODER, TINY, digit_image, png_bytes

SERVED = [TINY, EM_LIKE, NO_DECODER]
LIMIT_BYTES = 200_000
LIMIT_PIXELS = 1_000_000
LIMIT_IMAGES = 4
LIMIT_IMAGE_BYTES = 5_000


@pytest.fixture
def limited(make_client: Any, model_repository: Path) -> TestClient:
    client: TestClient = make_client(
        model_repository,
        max_body_bytes=LIMIT_BYTES,
        max_image_pixels=LIMIT_PIXELS,
        max_images_per_request=LIMIT_IMAGES,
        max_image_bytes=LIMIT_IMAGE_BYTES,
    )
    return client


def upload(client: TestClient, data: bytes, name: str = "x.png", path: str = "/v1/classify") -> Any:
    return client.post(path, files=[("files", (name, data, "application/octet-stream"))])


def still_serving(client: TestClient) -> None:
    r = client.post("/v1/classify", files=[("files", ("ok.png", png_bytes(digit_image()), "image/png"))])
    assert r.status_code == 200, r.text


def error(status: int, message: str, error_type: str) -> tuple[int, dict[str, str]]:
    return status, {"error": message, "type": error_type}


def result(r: Any) -> tuple[int, Any]:
    return r.status_code, r.json()


def encoded(image: Image.Image, fmt: str, **kwargs: Any) -> bytes:
    buffer = io.BytesIO()
    image.save(buffer, format=fmt, **kwargs)
    return buffer.getvalue()


# Image files


def test_not_an_image(client: TestClient) -> None:
    assert result(upload(client, b"hello, this is text", "notes.txt")) == error(
        400, "file 0 (notes.txt): not a recognised image (PNG, JPEG, GIF, BMP or WebP expected)", "invalid_input"
    )
    still_serving(client)


def test_truncated_image(client: TestClient) -> None:
    png = png_bytes(digit_image(256))
    status, body = result(upload(client, png[: len(png) // 2], "cut.png"))
    assert status == 400 and body["type"] == "invalid_input"
    assert body["error"].startswith("file 0 (cut.png): image is truncated or corrupt")
    still_serving(client)


def test_zero_bytes(client: TestClient) -> None:
    assert result(upload(client, b"", "empty.png")) == error(
        400, "file 0 (empty.png): image is empty (0 bytes)", "invalid_input"
    )


def test_unsupported_image_format(client: TestClient) -> None:
    tiff = encoded(Image.fromarray(digit_image()), "TIFF")
    assert result(upload(client, tiff, "d.tiff")) == error(
        415,
        "file 0 (d.tiff): unsupported image format TIFF (PNG, JPEG, GIF, BMP or WebP expected)",
        "unsupported_media_type",
    )


def test_decompression_bomb_is_refused_before_decoding(limited: TestClient) -> None:
    bomb = encoded(Image.new("L", (2000, 2000)), "PNG", optimize=True)  # 4 M pixels in a few kB
    assert len(bomb) < 50_000
    assert result(upload(limited, bomb, "bomb.png")) == error(
        413,
        f"file 0 (bomb.png): image has 4000000 pixels, more than the limit of {LIMIT_PIXELS} "
        "(CAPSNET_MAX_IMAGE_PIXELS)",
        "payload_too_large",
    )
    still_serving(limited)


def test_image_over_the_byte_limit(limited: TestClient) -> None:
    """CAPSNET_MAX_IMAGE_BYTES bounds each encoded image (a file part, or base64 once decoded) before decoding."""
    noise = np.random.default_rng(0).integers(0, 256, (100, 100), np.uint8)  # incompressible: ~10 kB as PNG
    big = png_bytes(noise)
    assert len(big) > LIMIT_IMAGE_BYTES
    message = f"image is {len(big)} bytes, more than the limit of {LIMIT_IMAGE_BYTES} (CAPSNET_MAX_IMAGE_BYTES)"
    assert result(upload(limited, big, "noise.png")) == error(
        413, f"file 0 (noise.png): {message}", "payload_too_large"
    )
    body = {"images": [{"data": base64.b64encode(big).decode()}]}
    assert result(limited.post("/v1/classify", json=body)) == error(413, f"images[0]: {message}", "payload_too_large")
    assert upload(limited, png_bytes(digit_image())).status_code == 200


@pytest.mark.parametrize("fmt", ["JPEG", "GIF", "BMP", "WEBP"])
def test_every_supported_format_is_accepted(client: TestClient, fmt: str) -> None:
    image = Image.fromarray(digit_image()).convert("RGB" if fmt == "JPEG" else "L")
    assert upload(client, encoded(image, fmt), f"d.{fmt.lower()}").status_code == 200


# The request itself


def test_wrong_content_type(client: TestClient) -> None:
    r = client.post("/v1/classify", content=b"abc", headers={"content-type": "text/plain"})
    assert result(r) == error(
        415,
        "unsupported content type 'text/plain'; send multipart/form-data (image files) "
        "or application/json ({'images': [...]})",
        "unsupported_media_type",
    )


def test_missing_content_type(client: TestClient) -> None:
    r = client.post("/v1/classify", content=b"abc")
    assert r.status_code == 415
    assert r.json()["error"].startswith("unsupported content type '(none)'")


@pytest.mark.parametrize("path", ["/v1/models/nope/classify", "/v1/models/nope"])
def test_unknown_model(client: TestClient, path: str) -> None:
    r = client.post(path, json={}) if path.endswith("classify") else client.get(path)
    assert result(r) == error(404, f"model 'nope' not found; served models: {sorted(SERVED)}", "model_not_found")


def test_malformed_json(client: TestClient) -> None:
    r = client.post("/v1/classify", content=b'{"images": [', headers={"content-type": "application/json"})
    assert result(r) == error(400, "malformed JSON: Expecting value: line 1 column 13 (char 12)", "invalid_input")


@pytest.mark.parametrize("path", ["/v1/classify", f"/v1/models/{TINY}/decode"])
def test_json_nested_too_deeply(client: TestClient, path: str) -> None:
    deep = b"[" * 100_000 + b"]" * 100_000  # deeper than the parser's recursion limit
    r = client.post(path, content=b'{"images": ' + deep + b"}", headers={"content-type": "application/json"})
    assert result(r) == error(400, "malformed JSON: nested too deeply", "invalid_input")
    still_serving(client)


def test_json_of_the_wrong_structure(client: TestClient) -> None:
    assert result(client.post("/v1/classify", json={"pictures": []})) == error(
        400, "invalid request body: images: Field required; pictures: Extra inputs are not permitted", "invalid_input"
    )
    assert result(client.post("/v1/classify", json={"images": []})) == error(
        400, "invalid request body: images: List should have at least 1 item after validation, not 0", "invalid_input"
    )
    assert result(client.post("/v1/classify", json={"images": [{}]})) == error(
        400,
        "invalid request body: images.0: Value error, give exactly one of 'data' (base64) or 'array'",
        "invalid_input",
    )


def test_malformed_base64(client: TestClient) -> None:
    r = client.post("/v1/classify", json={"images": [{"data": "not*base64"}]})
    status, body = result(r)
    assert status == 400 and body["error"].startswith("images[0]: malformed base64: ")
    r = client.post("/v1/classify", json={"images": [{"data": "data:image/png;base64"}]})
    assert result(r) == error(400, "images[0]: malformed data: URL (no comma)", "invalid_input")


@pytest.mark.parametrize(
    ("data", "message"),
    [
        ("ab!d", "images[0]: malformed base64: Only base64 data is allowed"),
        (
            "abcde",
            "images[0]: malformed base64: 5 characters before the padding cannot encode whole bytes (truncated?)",
        ),
        ("QQ==QQ==", "images[0]: malformed base64: Excess data after padding"),
        ("data:image/png;base64,ab!d", "images[0]: malformed base64: Only base64 data is allowed"),
    ],
)
def test_malformed_base64_exact_messages(client: TestClient, data: str, message: str) -> None:
    r = client.post("/v1/classify", json={"images": [{"data": data}]})
    assert result(r) == error(400, message, "invalid_input")


@pytest.mark.parametrize(
    ("url", "status", "message", "error_type"),
    [
        (
            "data:text/plain;base64,aGVsbG8=",
            415,
            "images[0]: data: URL has media type 'text/plain'; send an image (image/png, …)",
            "unsupported_media_type",
        ),
        (
            "data:;base64,aGVsbG8=",  # no media type: RFC 2397 says text/plain
            415,
            "images[0]: data: URL has media type 'text/plain'; send an image (image/png, …)",
            "unsupported_media_type",
        ),
        (
            "data:application/pdf;base64,JVBERi0=",
            415,
            "images[0]: data: URL has media type 'application/pdf'; send an image (image/png, …)",
            "unsupported_media_type",
        ),
        (
            "data:image/png,%89PNG",
            400,
            "images[0]: only base64 data: URLs are accepted (data:image/png;base64,…)",
            "invalid_input",
        ),
        (
            "data:image/svg+xml;charset=utf-8,<svg/>",
            400,
            "images[0]: only base64 data: URLs are accepted (data:image/svg+xml;base64,…)",
            "invalid_input",
        ),
    ],
)
def test_data_url_media_type_and_encoding(
    client: TestClient, url: str, status: int, message: str, error_type: str
) -> None:
    r = client.post("/v1/classify", json={"images": [{"data": url}]})
    assert result(r) == error(status, message, error_type)


def test_base64_of_a_non_image(client: TestClient) -> None:
    r = client.post("/v1/classify", json={"images": [{"data": base64.b64encode(b"text").decode()}]})
    assert result(r) == error(
        400, "images[0]: not a recognised image (PNG, JPEG, GIF, BMP or WebP expected)", "invalid_input"
    )


def test_array_of_the_wrong_shape(client: TestClient) -> None:
    r = client.post("/v1/classify", json={"images": [{"array": np.zeros((27, 28)).tolist()}]})
    assert result(r) == error(400, "images[0].array: pixels must be a 28×28 array, got shape [27, 28]", "invalid_input")


@pytest.mark.parametrize("value", ["NaN", "Infinity", "-Infinity"])
def test_array_with_nan_or_infinity(client: TestClient, value: str) -> None:
    row = "[" + ",".join([value] + ["0"] * 27) + "]"
    body = '{"images": [{"array": [' + ",".join([row] * 28) + "]}]}"
    r = client.post("/v1/classify", content=body.encode(), headers={"content-type": "application/json"})
    assert result(r) == error(
        400, "images[0].array: pixels must be finite numbers, got NaN or infinity", "invalid_input"
    )
    still_serving(client)


def test_array_out_of_range(client: TestClient) -> None:
    r = client.post("/v1/classify", json={"images": [{"array": np.full((28, 28), -1.0).tolist()}]})
    assert result(r) == error(
        400, "images[0].array: pixels must lie in [0, 1] or [0, 255], got values from -1 to -1", "invalid_input"
    )


def test_too_many_images(limited: TestClient) -> None:
    png = png_bytes(digit_image())
    files = [("files", (f"{i}.png", png, "image/png")) for i in range(LIMIT_IMAGES + 1)]
    assert result(limited.post("/v1/classify", files=files)) == error(
        413,
        f"too many images: {LIMIT_IMAGES + 1} in one request, the limit is {LIMIT_IMAGES} "
        "(CAPSNET_MAX_IMAGES_PER_REQUEST)",
        "payload_too_large",
    )
    r = limited.post("/v1/classify", json={"images": [{"data": base64.b64encode(png).decode()}] * (LIMIT_IMAGES + 1)})
    assert r.status_code == 413


def test_no_images(client: TestClient) -> None:
    r = client.post("/v1/classify", files={"ignored": (None, "")}, data={})
    assert r.status_code == 400
    r = client.post("/v1/classify", content=b"--b--\r\n", headers={"content-type": "multipart/form-data; boundary=b"})
    assert result(r) == error(400, "no images in the request", "invalid_input")


@pytest.mark.parametrize(
    ("content_type", "body", "message"),
    [
        ("multipart/form-data", b"x", "Missing boundary in multipart."),
        ("multipart/form-data; boundary=abc", b"--abc\r\nno headers\r\n--abc--", "Invalid multipart data."),
        (
            "multipart/form-data; boundary=abc",
            b'--abc\r\nContent-Disposition: form-data; filename="a.png"\r\n\r\nxyz\r\n--abc--\r\n',
            'The Content-Disposition header field "name" must be provided.',
        ),
    ],
)
def test_malformed_multipart(client: TestClient, content_type: str, body: bytes, message: str) -> None:
    r = client.post("/v1/classify", content=body, headers={"content-type": content_type})
    assert result(r) == error(400, f"malformed multipart body: {message}", "invalid_input")


def test_form_fields_are_refused(client: TestClient) -> None:
    r = client.post(
        "/v1/classify", data={"top_k": "3"}, files=[("files", ("a.png", png_bytes(digit_image()), "image/png"))]
    )
    assert result(r) == error(
        400, "unexpected form field 'top_k': send images as file parts; options go in the query string", "invalid_input"
    )


def test_body_over_the_limit_by_content_length(limited: TestClient) -> None:
    size = LIMIT_BYTES + 1
    r = limited.post("/v1/classify", content=b"x" * size, headers={"content-type": "application/json"})
    assert result(r) == error(
        413,
        f"request body too large ({size} bytes): the limit is {LIMIT_BYTES} bytes (CAPSNET_MAX_BODY_BYTES)",
        "payload_too_large",
    )
    still_serving(limited)


def test_body_over_the_limit_while_streaming(limited: TestClient) -> None:
    def chunks() -> Iterator[bytes]:
        for _ in range(30):
            yield b"x" * 10_000

    r = limited.post("/v1/classify", content=chunks(), headers={"content-type": "application/json"})
    assert result(r) == error(
        413, f"request body too large: the limit is {LIMIT_BYTES} bytes (CAPSNET_MAX_BODY_BYTES)", "payload_too_large"
    )
    still_serving(limited)


def disconnect_mid_body(client: TestClient, path: str) -> list[dict[str, Any]]:
    """Send half of a multipart upload straight to the ASGI app, then the client's disconnect; what the app sent."""
    boundary = "b"
    part = f'--{boundary}\r\nContent-Disposition: form-data; name="files"; filename="a.png"\r\n\r\n'
    body = part.encode() + png_bytes(digit_image()) + f"\r\n--{boundary}--\r\n".encode()
    headers = [(b"content-type", f"multipart/form-data; boundary={boundary}".encode())]
    headers += [(b"content-length", str(len(body)).encode()), (b"host", b"test")]
    scope = {
        "type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1", "method": "POST", "scheme": "http",
        "path": path, "raw_path": path.encode(), "query_string": b"", "root_path": "", "headers": headers,
        "client": ("127.0.0.1", 1), "server": ("test", 80), "state": {},
    }  # fmt: skip
    messages = [{"type": "http.request", "body": body[: len(body) // 2], "more_body": True}]
    sent: list[dict[str, Any]] = []

    async def receive() -> dict[str, Any]:
        return messages.pop(0) if messages else {"type": "http.disconnect"}

    async def send(message: dict[str, Any]) -> None:
        sent.append(message)

    async def run() -> None:
        await client.app(scope, receive, send)  # raises if anything escapes the app

    client.portal.call(run)
    return sent


@pytest.mark.parametrize("path", ["/v1/classify", f"/v1/models/{TINY}/classify", f"/v2/models/{TINY}/infer"])
def test_a_client_that_leaves_mid_upload_is_no_server_error(
    client: TestClient, path: str, caplog: pytest.LogCaptureFixture
) -> None:
    """Through the fast path or a route alike: 499 in the metrics and an info line, no traceback and no 500."""
    caplog.set_level(logging.INFO, logger="service")
    sent = disconnect_mid_body(client, path)
    assert [m["status"] for m in sent if m["type"] == "http.response.start"] == [499]
    assert [r.getMessage() for r in caplog.records if r.levelno >= logging.INFO] == [
        f"POST {path}: the client disconnected before sending the whole body"
    ]
    template = path if not path.startswith("/v1/models/") else "/v1/models/{name}/classify"
    template = "/v2/models/{name}/infer" if path.startswith("/v2/") else template
    assert f'route="{template}",status="499"' in client.get("/metrics").text
    still_serving(client)


# Options


@pytest.mark.parametrize(
    ("query", "message"),
    [
        ("top_k=0", "query parameter 'top_k': Input should be greater than or equal to 1"),
        ("top_k=x", "query parameter 'top_k': Input should be a valid integer, unable to parse string as an integer"),
        ("top_k=11", "top_k 11 is larger than the 10 classes of model 'tiny'"),
        ("invert=maybe", "query parameter 'invert': Input should be 'auto', 'true' or 'false'"),
    ],
)
def test_bad_classify_options(client: TestClient, query: str, message: str) -> None:
    r = client.post(f"/v1/classify?{query}", files=[("files", ("a.png", png_bytes(digit_image()), "image/png"))])
    assert result(r) == error(400, message, "invalid_input")


@pytest.mark.parametrize(
    ("path", "message"),
    [
        ("reconstruct?class=10", "class 10 is out of range: model 'tiny' has classes 0..9"),
        ("reconstruct?class=-1", "query parameter 'class': Input should be greater than or equal to 0"),
        ("reconstruct?format=gif", "query parameter 'format': Input should be 'json' or 'png'"),
        ("perturb?low=0.3&high=0.1", "high (0.1) must not be below low (0.3)"),
        ("perturb?step=0.001", "more than 41 perturbation steps from -0.25 to 0.25 by 0.001; the limit is 41"),
        ("perturb?step=1e-320", "more than 41 perturbation steps from -0.25 to 0.25 by 9.99989e-321; the limit is 41"),
        ("perturb?step=0", "query parameter 'step': Input should be greater than 0"),
        ("perturb?step=inf", "query parameter 'step': Input should be less than or equal to 20"),
    ],
)
def test_bad_reconstruction_options(client: TestClient, path: str, message: str) -> None:
    r = client.post(f"/v1/{path}", json={"images": [{"array": (digit_image() / 255).tolist()}]})
    assert result(r) == error(400, message, "invalid_input")


def test_png_and_perturb_take_one_image(client: TestClient) -> None:
    two = {"images": [{"array": (digit_image() / 255).tolist()}] * 2}
    assert result(client.post("/v1/reconstruct?format=png", json=two)) == error(
        400, "format=png returns one image but the request has 2; use format=json", "invalid_input"
    )
    assert result(client.post("/v1/perturb", json=two)) == error(
        400, "perturb takes one image, the request has 2", "invalid_input"
    )


@pytest.mark.parametrize(
    ("body", "message"),
    [
        ({"poses": [[0.0] * 8] * 9, "class": 1}, "poses must have shape [10, 8] for model 'tiny', got [9, 8]"),
        ({"poses": [[0.0] * 8] * 10, "class": 10}, "class 10 is out of range: model 'tiny' has classes 0..9"),
        ({"poses": [[0.0] * 8] * 10, "mask": [1.0] * 9}, "mask must have 10 values (one per class), got 9"),
        ({"poses": [[0.0] * 8] * 10}, "invalid request body: body: Value error, give exactly one of 'class' or 'mask'"),
        (
            {"poses": [[0.0] * 8] * 10, "class": None, "mask": [1.0] * 10},
            "invalid request body: body: Value error, 'class' must not be null; give exactly one of 'class' or 'mask'",
        ),
        ({"poses": [["a"] * 8] * 10, "class": 1}, None),
    ],
)
def test_bad_decode_requests(client: TestClient, body: dict[str, Any], message: str | None) -> None:
    status, got = result(client.post(f"/v1/models/{TINY}/decode", json=body))
    assert status == 400 and got["type"] == "invalid_input"
    if message is None:
        assert got["error"].startswith("poses must be a numeric array of shape [10, 8]")
    else:
        assert got["error"] == message


def test_decode_rejects_nan(client: TestClient) -> None:
    rows = ",".join(["[" + ",".join(["NaN"] + ["0"] * 7) + "]"] * 10)
    body = ('{"poses": [' + rows + '], "class": 1}').encode()
    r = client.post("/v1/decode", content=body, headers={"content-type": "application/json"})
    assert result(r) == error(400, "poses and mask must be finite numbers (no NaN or infinity)", "invalid_input")


def test_unknown_route_and_method(client: TestClient) -> None:
    assert result(client.get("/v1/nothing")) == error(
        404, "no route for GET at this path; see /docs for the routes", "not_found"
    )
    r = client.get("/v1/classify")
    assert result(r) == error(405, "method GET is not allowed at this path; use POST", "method_not_allowed")
    assert r.headers["allow"] == "POST"
    r = client.post("/v1/models")
    assert result(r) == error(405, "method POST is not allowed at this path; use GET", "method_not_allowed")
    assert r.headers["allow"] == "GET"


def test_metrics_labels_cannot_be_multiplied_by_clients(make_client: Any, model_repository: Path) -> None:
    client = make_client(model_repository)
    for i in range(3):
        client.get(f"/random-{i}")
        client.post(f"/v1/models/random-{i}/classify")
        client.request(f"BREW{i}", "/v1/models")
    text = client.get("/metrics").text
    assert "random-" not in text and "BREW" not in text
    assert 'capsnet_http_requests_total{method="GET",protocol="http",route="unmatched",status="404"} 3.0' in text
    assert (
        'capsnet_http_requests_total{method="POST",protocol="http",route="/v1/models/{name}/classify",status="404"} 3.0'
        in text
    )
    assert 'capsnet_http_requests_total{method="other",protocol="http",route="/v1/models",status="405"} 3.0' in text

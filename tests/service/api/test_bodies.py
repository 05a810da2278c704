"""Request bodies built to cost the server: every limit is checked before the work it bounds, a body is parsed once,
large JSON is parsed off the event loop, and a malformed body is a 4xx, never a 500."""

from __future__ import annotations

import asyncio
import io
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from fastapi.testclient import TestClient
from PIL import Image

from service.api import inputs, multipart
from service.api.inputs import INLINE_JSON_BYTES
from tests.service.conftest import TINY, digit_image, png_bytes

PNG = png_bytes(digit_image())
TINY_IMAGES_BODY = b'{"images":[' + b",".join([b'{"data":""}'] * 650_000) + b"]}"  # 8 MB of tiny entries
LIMIT = "the limit is 64 (CAPSNET_MAX_IMAGES_PER_REQUEST)"


@pytest.fixture
def calls(monkeypatch: pytest.MonkeyPatch) -> Callable[[Any, str], list[bool]]:
    """calls(module, name): spy on a function; the list gets, per call, whether it ran on an event loop's thread."""

    def spy(module: Any, name: str) -> list[bool]:
        seen: list[bool] = []
        original = getattr(module, name)

        def wrapper(*args: Any, **kwargs: Any) -> Any:
            try:
                asyncio.get_running_loop()
                seen.append(True)
            except RuntimeError:
                seen.append(False)
            return original(*args, **kwargs)

        monkeypatch.setattr(module, name, wrapper)
        return seen

    return spy


def multipart_body(boundary: bytes, parts: int) -> bytes:
    part = b"--" + boundary + b'\r\nContent-Disposition: form-data; name="f"; filename="x.png"\r\n\r\n\r\n'
    return part * parts + b"--" + boundary + b"--\r\n"


@pytest.mark.parametrize("fast_path", [True, False])
def test_a_boundary_the_parser_refuses_is_a_400_counted_under_its_route(
    make_client: Callable[..., TestClient], model_repository: Path, fast_path: bool
) -> None:
    client = make_client(model_repository, default_model=TINY, fast_path=fast_path)
    boundary = "b" * 257
    r = client.post("/v1/classify", content=b"x", headers={"content-type": f"multipart/form-data; boundary={boundary}"})
    assert (r.status_code, r.json()) == (
        400,
        {
            "error": "malformed multipart body: bad boundary: Boundary length 257 exceeds maximum of 256",
            "type": "invalid_input",
        },
    )
    metrics = client.get("/metrics").text
    assert 'route="/v1/classify",status="400"' in metrics and 'route="unmatched"' not in metrics


def test_json_images_over_the_count_are_refused_before_the_body_is_parsed(
    client: TestClient, calls: Callable[[Any, str], list[bool]]
) -> None:
    parsed = calls(inputs, "parse_json")
    json_type = {"content-type": "application/json"}
    r = client.post(f"/v1/models/{TINY}/classify", content=TINY_IMAGES_BODY, headers=json_type)
    assert r.status_code == 413 and parsed == []
    assert r.json()["error"] == (
        "JSON body too large: 650000 values or more, the most a request may need is 51328 "
        "(CAPSNET_MAX_IMAGES_PER_REQUEST)"
    )


def test_a_v2_tensor_of_more_values_than_the_image_limit_allows_is_refused_before_parsing(
    client: TestClient, calls: Callable[[Any, str], list[bool]]
) -> None:
    parsed = calls(inputs, "parse_json")
    values = ",".join(["0"] * 200_000)
    body = f'{{"inputs":[{{"name":"image","shape":[1,1,28,28],"datatype":"FP32","data":[{values}]}}]}}'
    r = client.post(f"/v2/models/{TINY}/infer", content=body, headers={"content-type": "application/json"})
    assert r.status_code == 413 and "JSON body too large" in r.json()["error"] and parsed == []


def test_multipart_parts_over_the_count_are_refused_before_the_body_is_parsed(
    client: TestClient, calls: Callable[[Any, str], list[bool]]
) -> None:
    parsed = calls(multipart, "_parse")
    body = multipart_body(b"xyz", 70_000)
    r = client.post("/v1/classify", content=body, headers={"content-type": "multipart/form-data; boundary=xyz"})
    assert (r.status_code, r.json()) == (
        413,
        {"error": f"too many images: 70000 in one request, {LIMIT}", "type": "payload_too_large"},
    )
    assert parsed == []


@pytest.mark.parametrize("fast_path", [True, False])
def test_a_bad_body_is_parsed_once(
    make_client: Callable[..., TestClient],
    model_repository: Path,
    calls: Callable[[Any, str], list[bool]],
    fast_path: bool,
) -> None:
    """The fast path answers a client error in the body itself: the route does not parse it a second time."""
    client = make_client(model_repository, default_model=TINY, fast_path=fast_path)
    parsed = calls(inputs, "parse_multipart")
    r = client.post("/v1/classify", files=[("files", ("x.png", b"not an image", "image/png"))])
    assert r.status_code == 400 and r.json()["error"].startswith("file 0 (x.png)") and len(parsed) == 1
    metrics = client.get("/metrics").text
    assert 'capsnet_http_requests_total{method="POST",protocol="http",route="/v1/classify",status="400"} 1.0' in metrics


def test_large_json_is_parsed_on_a_worker_thread_small_json_on_the_loop(
    client: TestClient, calls: Callable[[Any, str], list[bool]]
) -> None:
    parsed = calls(inputs, "parse_json")
    small = {"images": [{"array": (digit_image() / 255.0).tolist()}]}
    large = {"images": small["images"] * 40}
    assert client.post(f"/v1/models/{TINY}/classify", json=small).status_code == 200
    r = client.post(f"/v1/models/{TINY}/classify", json=large)
    assert r.status_code == 200 and len(r.request.content) > INLINE_JSON_BYTES
    assert parsed == [True, False]


@pytest.mark.parametrize("route", ["/v1/classify", f"/v2/models/{TINY}/infer", "/v1/decode"])
def test_an_integer_too_long_to_convert_is_malformed_json_not_a_500(client: TestClient, route: str) -> None:
    r = client.post(route, content=b"[" + b"1" * 5000 + b"]", headers={"content-type": "application/json"})
    assert r.status_code == 400 and r.json()["error"].startswith("malformed JSON: Exceeds the limit (4300 digits)")


def png_of_size(width: int, height: int) -> bytes:
    buffer = io.BytesIO()
    Image.fromarray(np.zeros((height, width), np.uint8)).save(buffer, format="PNG")
    return buffer.getvalue()


def test_the_pixels_of_a_request_are_budgeted_before_any_image_is_decoded(
    make_client: Callable[..., TestClient], model_repository: Path, calls: Callable[[Any, str], list[bool]]
) -> None:
    client = make_client(model_repository, default_model=TINY, max_request_pixels=25_000, max_image_pixels=20_000)
    decoded = calls(inputs, "load_image")
    image = png_of_size(100, 100)
    r = client.post("/v1/classify", files=[("files", (f"{i}.png", image, "image/png")) for i in range(3)])
    assert (r.status_code, r.json()) == (
        413,
        {
            "error": "the request's 3 images have 30000 pixels together, more than the limit of 25000 "
            "(CAPSNET_MAX_REQUEST_PIXELS)",
            "type": "payload_too_large",
        },
    )
    r = client.post("/v1/classify", files=[("files", ("big.png", png_of_size(150, 150), "image/png"))])
    assert r.status_code == 413 and "(CAPSNET_MAX_IMAGE_PIXELS)" in r.json()["error"]
    assert decoded == []
    assert client.post("/v1/classify", files=[("files", ("a.png", image, "image/png"))] * 2).status_code == 200


def test_the_default_pixel_budgets_fit_a_digit_service() -> None:
    from service.core.config import Settings

    fields = Settings.model_fields
    assert fields["max_image_pixels"].default == 4_000_000  # a 2000×2000 photo of a digit
    assert fields["max_request_pixels"].default == 16_000_000

"""v1 routes refuse a query parameter they do not read (400 naming the valid ones), on the fast path's routes too."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient

from tests.service.conftest import TINY, digit_image, png_bytes

CLASSIFY_PARAMETERS = (
    "include_input, include_ood_parts, invert, normalize, reject_ood, top_k, version"  # version: declared in OpenAPI
)


def image_files() -> list[tuple[str, tuple[str, bytes, str]]]:
    return [("files", ("d.png", png_bytes(digit_image()), "image/png"))]


@pytest.fixture(params=[True, False], ids=["fast-path", "routes-only"])
def any_client(request: pytest.FixtureRequest, make_client: Any, model_repository: Path) -> TestClient:
    """Both ways a classify request is served: the fast path in front of the routes, and the routes alone."""
    client: TestClient = make_client(model_repository, fast_path=request.param)
    return client


@pytest.mark.parametrize("path", ["/v1/classify", f"/v1/models/{TINY}/classify"])
def test_a_misspelt_option_is_a_400_naming_the_valid_ones(any_client: TestClient, path: str) -> None:
    r = any_client.post(f"{path}?topk=3", files=image_files())
    assert r.status_code == 400
    assert r.json() == {
        "error": f"unknown query parameter 'topk' for {path}; valid ones: {CLASSIFY_PARAMETERS}",
        "type": "invalid_input",
    }


def test_the_valid_options_still_work_and_each_route_has_its_own(any_client: TestClient) -> None:
    r = any_client.post("/v1/classify?top_k=2&invert=auto&version=1", files=image_files())
    assert r.status_code == 200 and len(r.json()["predictions"][0]["top_k"]) == 2
    r = any_client.post(f"/v1/models/{TINY}/capsules?top_k=2&b=1&a=2", files=image_files())  # classify's, not its own
    assert r.status_code == 400
    assert r.json()["error"] == (
        f"unknown query parameter 'a', 'b', 'top_k' for /v1/models/{TINY}/capsules; valid ones: include_input, "
        "include_ood_parts, invert, normalize, reject_ood, version"
    )


def test_routes_without_options_refuse_any(client: TestClient) -> None:
    for path in ("/v1/models", f"/v1/models/{TINY}"):
        r = client.get(f"{path}?verbose=1")
        assert r.status_code == 400
        assert r.json() == {
            "error": f"unknown query parameter 'verbose' for {path}; it takes none",
            "type": "invalid_input",
        }
    assert client.get("/v1/models").status_code == 200


def test_explain_and_reconstruct_know_their_own(client: TestClient) -> None:
    r = client.post(f"/v1/models/{TINY}/reconstruct?clas=3", files=image_files())
    assert r.status_code == 400 and "'clas'" in r.json()["error"] and "valid ones: class, format," in r.json()["error"]
    r = client.post(f"/v1/models/{TINY}/explain?scale=2&formt=png", files=image_files())
    assert r.status_code == 400 and r.json()["error"].startswith(
        f"unknown query parameter 'formt' for /v1/models/{TINY}"
    )

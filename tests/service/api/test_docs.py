"""`/docs` and `/redoc` load Swagger UI and ReDoc from this service, never from a CDN."""

from __future__ import annotations

import re

import pytest
from fastapi.testclient import TestClient


@pytest.mark.parametrize(
    ("path", "assets"),
    [("/docs", ["swagger-ui-bundle.js", "swagger-ui.css"]), ("/redoc", ["redoc.standalone.js"])],
)
def test_docs_pages_load_their_assets_from_the_service(client: TestClient, path: str, assets: list[str]) -> None:
    r = client.get(path)
    assert r.status_code == 200 and r.headers["content-type"].startswith("text/html")
    urls = re.findall(r"""(?:src|href|url)\s*[:=]\s*['"]([^'"]+)['"]""", r.text)
    assert not [u for u in urls if u.startswith(("http:", "https:", "//"))], urls
    for name in assets:
        assert f"/docs-assets/{name}" in r.text
        asset = client.get(f"/docs-assets/{name}")
        assert asset.status_code == 200 and len(asset.content) > 10_000, name


def test_docs_pages_stay_out_of_the_openapi_document(client: TestClient) -> None:
    paths = client.get("/openapi.json").json()["paths"]
    assert not {"/docs", "/redoc", "/docs/oauth2-redirect"} & set(paths)


@pytest.mark.parametrize("path", ["/docs", "/redoc"])
def test_docs_pages_may_load_only_from_the_service(client: TestClient, path: str) -> None:
    policy = client.get(path).headers["content-security-policy"]
    assert "default-src 'self'" in policy and "img-src 'self' data:" in policy

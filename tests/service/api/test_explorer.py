"""The explorer page at `/`: served from the package with the right types, self-contained, wired to the public API."""

from __future__ import annotations

import re
from html.parser import HTMLParser
from pathlib import Path

import pytest
from fastapi.testclient import TestClient

from service.api.routes import explorer

STATIC = explorer.STATIC_DIR
PAGE_FILES = ["index.html", "app.js", "style.css"]
EXTERNAL = [
    re.compile(r"\b(?:https?|wss?|ftp):", re.IGNORECASE),  # any absolute URL
    re.compile(r"""(?:src|href|action)\s*=\s*["']?//""", re.IGNORECASE),  # protocol-relative attribute
    re.compile(r"""url\(\s*["']?(?:[a-z]+:)?//""", re.IGNORECASE),  # CSS url() elsewhere
    re.compile(r"@import|@font-face|fonts\.googleapis", re.IGNORECASE),
]


class PageParser(HTMLParser):
    """Collects the ids, the referenced assets and the form controls of the page."""

    def __init__(self) -> None:
        super().__init__()
        self.ids: set[str] = set()
        self.assets: list[str] = []
        self.links: list[str] = []
        self.label_for: set[str] = set()
        self.controls: list[dict[str, str | None]] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        a = dict(attrs)
        if a.get("id"):
            self.ids.add(str(a["id"]))
        if tag == "script" and a.get("src"):
            self.assets.append(str(a["src"]))
        if tag == "link" and a.get("rel") == "stylesheet" and a.get("href"):
            self.assets.append(str(a["href"]))
        if tag == "a" and a.get("href"):
            self.links.append(str(a["href"]))
        if tag == "label" and a.get("for"):
            self.label_for.add(str(a["for"]))
        if tag in ("input", "select", "textarea", "button"):
            self.controls.append({"tag": tag, **a})


def parse_page() -> PageParser:
    parser = PageParser()
    parser.feed((STATIC / "index.html").read_text(encoding="utf-8"))
    return parser


def test_page_files_ship_in_the_package() -> None:
    for name in PAGE_FILES:
        assert (STATIC / name).is_file(), f"service/static/{name} is missing"


def test_index_is_served_as_html_with_a_same_origin_policy(client: TestClient) -> None:
    r = client.get("/")
    assert r.status_code == 200
    assert r.headers["content-type"].startswith("text/html")
    assert r.text == (STATIC / "index.html").read_text(encoding="utf-8")
    policy = r.headers["content-security-policy"]
    assert "default-src 'self'" in policy and "connect-src 'self'" in policy


@pytest.mark.parametrize(
    ("name", "types"),
    [
        ("app.js", ("text/javascript", "application/javascript")),
        ("style.css", ("text/css",)),
        ("index.html", ("text/html",)),
    ],
)
def test_assets_are_served_with_their_content_type(client: TestClient, name: str, types: tuple[str, ...]) -> None:
    r = client.get(f"/static/{name}")
    assert r.status_code == 200
    assert r.headers["content-type"].split(";")[0] in types
    assert r.content == (STATIC / name).read_bytes()


def test_every_asset_the_page_references_is_served_from_the_package(client: TestClient) -> None:
    page = parse_page()
    assert sorted(page.assets) == ["/static/app.js", "/static/style.css"]
    for path in page.assets + [link for link in page.links if not link.startswith("#")]:
        assert path.startswith("/") and not path.startswith("//"), path
        assert client.get(path).status_code == 200, path


@pytest.mark.parametrize("name", PAGE_FILES)
def test_no_external_urls(name: str) -> None:
    text = (STATIC / name).read_text(encoding="utf-8")
    for pattern in EXTERNAL:
        found = [text[max(0, m.start() - 40) : m.end() + 40] for m in pattern.finditer(text)]
        assert not found, f"{name} refers outside the service: {found}"


def test_every_control_is_labelled() -> None:
    page = parse_page()
    assert page.controls
    for control in page.controls:
        if control["tag"] == "button":
            continue  # buttons are labelled by their text
        labelled = control.get("id") in page.label_for or control.get("aria-label") or control.get("aria-labelledby")
        assert labelled, f"unlabelled control: {control}"


def test_the_page_has_an_error_region_and_a_mobile_viewport() -> None:
    html = (STATIC / "index.html").read_text(encoding="utf-8")
    assert re.search(r'<div id="error"[^>]*role="alert"[^>]*aria-live="assertive"', html)
    assert 'name="viewport" content="width=device-width, initial-scale=1"' in html
    assert '<html lang="en">' in html


def test_the_script_only_uses_elements_of_the_page() -> None:
    script = (STATIC / "app.js").read_text(encoding="utf-8")
    used = set(re.findall(r"""\$\(\s*["']([\w-]+)["']\s*\)""", script))
    assert used, "no $('id') lookups found in app.js"
    missing = used - parse_page().ids
    assert not missing, f"app.js looks up ids that index.html lacks: {sorted(missing)}"


def test_the_script_only_calls_documented_api_routes(client: TestClient) -> None:
    script = (STATIC / "app.js").read_text(encoding="utf-8")
    paths = client.app.openapi()["paths"]  # type: ignore[attr-defined]
    fixed = set(re.findall(r"""api\(\s*["'](/v1/[\w/]*)["']""", script))
    per_model = set(re.findall(r"""modelPath\(\s*["'](\w+)["']\s*[,)]""", script))
    assert fixed == {"/v1/models"}
    assert per_model == {"capsules", "decode", "explain"}
    for path in fixed | {f"/v1/models/{{name}}/{op}" for op in per_model}:
        assert path in paths, f"the page calls {path}, which is not in the OpenAPI schema"


def test_without_the_static_page_the_index_lists_the_api(
    client: TestClient, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setattr(explorer, "INDEX_FILE", tmp_path / "absent.html")
    r = client.get("/")
    assert r.status_code == 200 and r.headers["content-type"].startswith("text/html")
    assert '<a href="/docs">' in r.text

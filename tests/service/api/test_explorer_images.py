"""The explorer's image slots before there is anything to show: a blank image, never Chromium's broken-image icon."""

from __future__ import annotations

import base64
import io
import re
from html.parser import HTMLParser

from fastapi.testclient import TestClient
from PIL import Image


class Images(HTMLParser):
    def __init__(self) -> None:
        super().__init__()
        self.found: dict[str, dict[str, str | None]] = {}

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        if tag == "img":
            a = dict(attrs)
            self.found[str(a.get("id"))] = a


def decoded(uri: str) -> Image.Image:
    media, _, data = uri.partition(",")
    assert media.startswith("data:image/") and media.endswith(";base64"), uri[:40]
    return Image.open(io.BytesIO(base64.b64decode(data)))


def test_every_image_of_the_page_starts_with_a_source_that_decodes(client: TestClient) -> None:
    parser = Images()
    parser.feed(client.get("/").text)
    assert {"reconstruction", "explanation"} <= set(parser.found)
    for name, attrs in parser.found.items():
        image = decoded(str(attrs.get("src")))  # an <img> without src is drawn as a broken image
        assert image.size == (1, 1) and image.info.get("transparency") == 0, name  # the slot's black background shows


def test_clearing_a_result_puts_the_blank_image_back(client: TestClient) -> None:
    script = client.get("/static/app.js").text
    assert 'removeAttribute("src")' not in script
    (blank,) = re.findall(r'const BLANK_IMAGE = "([^"]+)";', script)
    parser = Images()
    parser.feed(client.get("/").text)
    assert {a.get("src") for a in parser.found.values()} == {blank}
    assert script.count(".src = BLANK_IMAGE;") == 2  # the reconstruction's and the explanation's

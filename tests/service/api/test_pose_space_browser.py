"""The explorer's pose-space view in headless Chromium: the committed projection drawn, hovered and clicked."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest

from tests.service.api.test_explorer_browser import Server, Tab, chromium_or_skip, get_json, open_tab, wait_until
from tests.service.conftest import EM_LIKE, write_em_like
from tests.service.live_server import REPO_ROOT, running_server

pytestmark = [pytest.mark.browser, pytest.mark.slow]

MODEL = "capsnet-mnist"
ZOO = REPO_ROOT / "model" / "zoo"
VIEW = REPO_ROOT / "service" / "static" / "pose-space" / f"{MODEL}.json"
PALETTE = ["#4e79a7", "#f28e2b", "#e15759", "#76b7b2", "#59a14f", "#edc948", "#b07aa1", "#ff9da7", "#9c755f", "#bab0ac"]
POINTS = (
    "() => Array.from(document.querySelectorAll('#pose-space-plot circle')).map(c => ({i: Number(c.dataset.point), "
    "cx: Number(c.getAttribute('cx')), cy: Number(c.getAttribute('cy')), fill: c.getAttribute('fill'), "
    "flagged: c.classList.contains('flagged')}))"
)


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    chromium_or_skip()
    if not (ZOO / MODEL / "model.json").is_file() or not VIEW.is_file():
        pytest.skip(f"the bundled model {MODEL} or its pose-space projection is absent")
    root = tmp_path_factory.mktemp("pose-space-repository")
    (root / MODEL).symlink_to(ZOO / MODEL, target_is_directory=True)
    write_em_like(root, EM_LIKE)  # a model without a projection
    with running_server(root, CAPSNET_PROVIDER="cpu", CAPSNET_DEFAULT_MODEL=MODEL) as (base, _):
        yield Server(base, get_json(f"{base}/v1/models"))


@pytest.fixture(scope="module")
def browser(server: Server) -> Iterator[Any]:
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        b = p.chromium.launch(executable_path=str(chromium_or_skip()), args=["--no-sandbox"])
        yield b
        b.close()


@pytest.fixture
def tab(browser: Any, server: Server) -> Iterator[Tab]:
    yield from open_tab(browser, server, viewport={"width": 1200, "height": 1400})


def test_the_scatter_hover_and_click(tab: Tab) -> None:
    page, view = tab.page, json.loads(VIEW.read_text())
    points = view["points"]
    n = len(points["index"])
    drawn = wait_until(page, f"() => {{ const p = ({POINTS})(); return p.length === {n} ? p : null; }}")
    for point in drawn:
        assert point["fill"] == PALETTE[points["predicted_class"][point["i"]]]
        assert point["flagged"] == (points["in_distribution"][point["i"]] is False)
    assert sum(p["flagged"] for p in drawn) == sum(v is False for v in points["in_distribution"]) > 0
    assert "Capsule “0”" in page.locator("#pose-space-caption").text_content()

    page.select_option("#pose-space-class", "3")
    moved = wait_until(page, f"() => {{ const p = ({POINTS})(); return p[0].cx !== {drawn[0]['cx']} ? p : null; }}")
    expected = view["projections"][3]["x"]
    leftmost = min(moved, key=lambda p: p["cx"])
    assert leftmost["i"] == expected.index(min(expected))
    assert "Capsule “3”" in page.locator("#pose-space-caption").text_content()

    def alone(p: dict[str, Any]) -> bool:  # no other point within reach of the pointer
        return all(q is p or (q["cx"] - p["cx"]) ** 2 + (q["cy"] - p["cy"]) ** 2 > 100 for q in moved)

    target = next(
        p for p in moved
        if not p["flagged"] and points["label"][p["i"]] == str(points["predicted_class"][p["i"]]) and alone(p)
    )  # fmt: skip
    circle = page.locator(f"#pose-space-plot circle[data-point='{target['i']}']")
    circle.hover()
    wait_until(page, "() => !document.getElementById('pose-space-tip').hidden")
    assert (
        f"test image {points['index'][target['i']]} · label {points['label'][target['i']]}"
        in page.locator("#pose-space-tip-text").text_content()
    )
    ink = page.evaluate(
        "() => { const c = document.getElementById('pose-space-digit'); return Array.from(c.getContext('2d')"
        ".getImageData(0, 0, c.width, c.height).data).filter((v, i) => i % 4 === 0 && v > 128).length; }"
    )
    assert ink > 50  # the digit is drawn, not a blank tile

    circle.click()
    wait_until(
        page,
        "() => document.getElementById('results').getAttribute('aria-busy') === 'false' && "
        "document.getElementById('predicted-class').textContent.trim() !== '–'",
    )
    assert page.locator("#predicted-class").text_content().strip() == points["label"][target["i"]]
    wait_until(page, "() => document.getElementById('reconstruction').naturalWidth > 0")
    assert page.locator("#sliders input[type=range]").count() == 16
    assert page.locator("#sliders-fieldset").is_enabled()
    tab.check_clean()


def test_a_model_without_a_projection_says_how_to_make_one(tab: Tab) -> None:
    page = tab.page
    wait_until(page, "() => document.querySelectorAll('#pose-space-plot circle').length > 0")
    page.select_option("#model-select", EM_LIKE)
    wait_until(page, "() => !document.getElementById('pose-space-notice').hidden")
    assert (
        page.locator("#pose-space-notice")
        .text_content()
        .startswith(f"No pose-space projection for model “{EM_LIKE}”: make one with capsnet-predict --all-poses")
    )
    assert page.locator("#pose-space-controls").is_hidden()
    page.select_option("#model-select", MODEL)
    wait_until(page, "() => document.getElementById('pose-space-notice').hidden")
    tab.check_clean()  # no 404: the index says which models have a projection

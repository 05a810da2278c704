"""The explorer page end to end: the real `capsnet-serve` on a loopback port, driven in headless Chromium.

Chromium is Debian's (`apt-get install chromium`, at /usr/bin/chromium or CAPSNET_CHROMIUM), driven by
Playwright's Python package with that executable (no `playwright install`). Screenshots go to
test-artifacts/; with CAPSNET_UPDATE_SCREENSHOT=1 the README's docs/explorer.png is rewritten too.
"""

from __future__ import annotations

import io
import json
import os
import shutil
import time
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from PIL import Image

from tests.service.conftest import EM_LIKE, TINY, export_tiny, write_em_like
from tests.service.live_server import REPO_ROOT, running_server

pytestmark = [pytest.mark.browser, pytest.mark.slow]

ZOO = REPO_ROOT / "model" / "zoo"
ARTIFACTS = REPO_ROOT / "test-artifacts"
README_SCREENSHOT = REPO_ROOT / "docs" / "explorer.png"
CHROMIUM = Path(os.environ.get("CAPSNET_CHROMIUM", "/usr/bin/chromium"))
TIMEOUT_MS = 60_000
TRAINED_MAX_ERROR = 0.05  # a served model with a measured test error below this must get MNIST digits right


def chromium_or_skip() -> Path:
    if not CHROMIUM.is_file():
        pytest.skip(f"no Chromium at {CHROMIUM}: apt-get install chromium (or set CAPSNET_CHROMIUM)")
    try:
        import playwright.sync_api  # noqa: F401
    except ImportError:
        pytest.skip("the playwright package is not installed: pip install -e '.[dev]'")
    return CHROMIUM


@dataclass
class Server:
    base: str
    models: dict[str, Any]  # GET /v1/models
    trained: set[str] = field(default_factory=set)  # models whose card reports a low MNIST test error

    def card(self, name: str) -> dict[str, Any]:
        return next(m for m in self.models["models"] if m["name"] == name)

    @property
    def default(self) -> dict[str, Any]:
        return self.card(self.models["default_model"])


def zoo_models() -> list[Path]:
    return sorted(p.parent for p in ZOO.glob("*/model.json")) if ZOO.is_dir() else []


@pytest.fixture(scope="module")
def browser_repository(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The bundled models (when the zoo has any) or a tiny exported one, next to an EM-shaped model with no decoder."""
    chromium_or_skip()  # before exporting anything
    root = tmp_path_factory.mktemp("explorer-repository")
    bundled = zoo_models()
    for model_dir in bundled:
        (root / model_dir.name).symlink_to(model_dir, target_is_directory=True)
    if not bundled:
        export_tiny(root, TINY)
    write_em_like(root, EM_LIKE)
    return root


def get_json(url: str) -> Any:
    with urllib.request.urlopen(url, timeout=10) as r:
        return json.load(r)


@pytest.fixture(scope="module")
def server(browser_repository: Path) -> Iterator[Server]:
    chromium_or_skip()
    with running_server(browser_repository, CAPSNET_PROVIDER="cpu") as (base, _):
        models = get_json(f"{base}/v1/models")
        trained = set()
        for m in models["models"]:
            error = (get_json(f"{base}/v1/models/{m['name']}")["card"].get("metrics") or {}).get("mnist_test_error")
            if error is not None and error < TRAINED_MAX_ERROR:
                trained.add(m["name"])
        yield Server(base, models, trained)


@pytest.fixture(scope="module")
def browser(server: Server) -> Iterator[Any]:
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        b = p.chromium.launch(executable_path=str(chromium_or_skip()), args=["--no-sandbox"])
        yield b
        b.close()


@dataclass
class Tab:
    """One page plus what it did: requests to other origins, uncaught errors, console errors."""

    page: Any
    base: str
    foreign: list[str] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)

    def check_clean(self, allow_http_errors: bool = False) -> None:
        assert not self.foreign, f"the page reached outside the service: {self.foreign}"
        http = ("Failed to load resource", "HTTP 4")
        errors = [e for e in self.errors if not (allow_http_errors and e.startswith(http))]
        assert not errors, f"errors in the page: {errors}"


def open_tab(browser: Any, server: Server, **context: Any) -> Iterator[Tab]:
    ctx = browser.new_context(**context)
    page = ctx.new_page()
    page.set_default_timeout(TIMEOUT_MS)
    tab = Tab(page, server.base)
    own = (server.base, "blob:", "data:")
    page.on("request", lambda r: None if r.url.startswith(own) else tab.foreign.append(r.url))
    page.on("pageerror", lambda e: tab.errors.append(f"uncaught: {e}"))
    page.on("console", lambda m: tab.errors.append(m.text) if m.type == "error" else None)
    page.on("response", lambda r: tab.errors.append(f"HTTP {r.status} {r.url}") if r.status >= 400 else None)
    page.goto(server.base + "/")
    wait_until(page, "() => document.querySelector('#model-select option:checked:not([disabled])') !== null")
    try:
        yield tab
    finally:
        ctx.close()


@pytest.fixture
def tab(browser: Any, server: Server) -> Iterator[Tab]:
    yield from open_tab(browser, server, viewport={"width": 1200, "height": 900})


@pytest.fixture
def phone(browser: Any, server: Server) -> Iterator[Tab]:
    yield from open_tab(browser, server, viewport={"width": 360, "height": 740}, has_touch=True, is_mobile=True)


def screenshot(page: Any, name: str) -> Path:
    ARTIFACTS.mkdir(exist_ok=True)
    path = ARTIFACTS / name
    page.screenshot(path=str(path), full_page=True)
    return path


def draw_seven(page: Any) -> None:
    """A "7" with the mouse: a bar across the top, then a diagonal down to the left."""
    box = page.locator("#draw").bounding_box()
    x0, y0, w, h = box["x"], box["y"], box["width"], box["height"]
    page.mouse.move(x0 + 0.3 * w, y0 + 0.25 * h)
    page.mouse.down()
    page.mouse.move(x0 + 0.7 * w, y0 + 0.25 * h, steps=8)
    page.mouse.move(x0 + 0.45 * w, y0 + 0.8 * h, steps=12)
    page.mouse.up()


def wait_until(page: Any, function: str, arg: Any = None, timeout_s: float = TIMEOUT_MS / 1000) -> Any:
    """Poll `function` in the page until it returns something truthy.

    Playwright's wait_for_function evaluates strings, which the page's Content-Security-Policy forbids.
    """
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if result := page.evaluate(function, arg):
            return result
        page.wait_for_timeout(50)
    raise AssertionError(f"timed out after {timeout_s} s waiting for {function}")


def wait_idle(page: Any) -> None:
    """Until no request of the page is queued or in flight (it marks its results aria-busy meanwhile)."""
    wait_until(page, "() => document.getElementById('results').getAttribute('aria-busy') === 'false'")


def wait_prediction(page: Any) -> str:
    wait_idle(page)
    wait_until(page, "() => /^\\S+$/.test(document.getElementById('predicted-class').textContent.replace('–', ''))")
    return str(page.locator("#predicted-class").text_content())


RECONSTRUCTION_PIXELS = """() => {
  const img = document.getElementById('reconstruction');
  if (!img.complete || img.naturalWidth === 0) return null;
  const c = document.createElement('canvas');
  c.width = img.naturalWidth; c.height = img.naturalHeight;
  const g = c.getContext('2d');
  g.drawImage(img, 0, 0);
  return Array.from(g.getImageData(0, 0, c.width, c.height).data.filter((_, i) => i % 4 === 0));
}"""


def reconstruction_pixels(page: Any) -> list[int] | None:
    pixels = page.evaluate(RECONSTRUCTION_PIXELS)
    return None if pixels is None else list(pixels)


def wait_reconstruction(page: Any, differs_from: list[int] | None = None) -> list[int]:
    wait_until(
        page,
        """(before) => {
          const img = document.getElementById('reconstruction');
          if (!img.complete || img.naturalWidth === 0) return false;
          if (before === null) return true;
          const c = document.createElement('canvas');
          c.width = img.naturalWidth; c.height = img.naturalHeight;
          const g = c.getContext('2d');
          g.drawImage(img, 0, 0);
          const now = g.getImageData(0, 0, c.width, c.height).data.filter((_, i) => i % 4 === 0);
          return now.some((v, i) => v !== before[i]);
        }""",
        differs_from,
    )
    wait_idle(page)
    pixels = reconstruction_pixels(page)
    assert pixels is not None
    return pixels


def test_drawing_a_stroke_shows_a_prediction(tab: Tab, server: Server) -> None:
    page = tab.page
    draw_seven(page)
    label = wait_prediction(page)
    assert label in server.default["classes"]
    bars = page.locator("#lengths li")
    assert bars.count() == len(server.default["classes"])
    assert page.locator("#lengths li.top .bar-label").text_content() == label  # the longest capsule is the answer
    pose_size = int(np.prod(server.default["pose_shape"]))
    assert page.locator("#heatmap .pose-row").count() == len(server.default["classes"])
    assert page.locator("#heatmap .pose-row.top .cell").count() == pose_size
    model_input = page.evaluate(
        "() => Array.from(document.getElementById('model-input').getContext('2d')"
        ".getImageData(0, 0, 28, 28).data.filter((_, i) => i % 4 === 0))"
    )
    assert len(model_input) == 784 and max(model_input) > 200  # the stroke reached the model, white on black
    if server.default.get("ood_calibrated"):  # the not-a-digit flag, and the (up to) three parts that weigh most
        reasons = page.locator("#ood-parts li")  # as many as the card's score has, at most three
        assert 1 <= reasons.count() <= 3 and "training digits are as extreme" in (reasons.first.text_content() or "")
    assert page.locator("#error").is_hidden()
    screenshot(page, "explorer-drawn.png")
    tab.check_clean()


def test_reconstruction_loads_and_the_sliders_change_it(tab: Tab, server: Server) -> None:
    page = tab.page
    model = server.default
    assert model["has_decoder"], "the default model should be the one with a decoder"
    draw_seven(page)
    predicted = wait_prediction(page)
    before = wait_reconstruction(page)
    assert page.evaluate("document.getElementById('reconstruction').naturalWidth") == 28

    sliders = page.locator("#sliders input[type=range]")
    assert sliders.count() == int(np.prod(model["pose_shape"]))
    assert page.locator("label[for=dim-0]").text_content() == "Dimension 1"
    page.focus("#dim-0")  # by keyboard: End moves the slider to +0.25
    page.keyboard.press("End")
    assert page.locator("#dim-0").input_value() == "0.25"
    after = wait_reconstruction(page, differs_from=before)
    assert after != before
    assert "edited pose" in str(page.locator("#recon-caption").text_content())
    screenshot(page, "explorer-slider.png")

    other = next(c for c in model["classes"] if c != predicted)
    page.select_option("#recon-class", index=model["classes"].index(other))
    wait_until(page, f"() => document.getElementById('recon-caption').textContent === 'from capsule “{other}”'")
    assert page.locator("#dim-0").input_value() == "0"  # a new capsule starts unedited
    tab.check_clean()


EXPLANATION_SIZE = "() => { const i = document.getElementById('explanation'); return i.complete ? i.naturalWidth : 0; }"


def test_explanation_shows_the_default_method_and_switches_method_and_class(tab: Tab, server: Server) -> None:
    page = tab.page
    model = server.default
    assert model["explain_methods"] == ["occlusion", "routing"], "the default model should offer both methods"
    draw_seven(page)
    predicted = wait_prediction(page)
    wait_until(page, f"() => ({EXPLANATION_SIZE})() > 0")
    assert page.evaluate(EXPLANATION_SIZE) == 28 * 8  # the 28×28 overlay at scale 8
    caption = page.locator("#explain-caption")
    wait_until(page, "() => document.getElementById('explain-meaning').textContent.length > 0")
    assert page.locator("#explain-method").input_value() == "occlusion"
    assert f"Occlusion for “{predicted}”" in str(caption.text_content())
    meaning = str(page.locator("#explain-meaning").text_content())
    assert "the ink the model needs" in meaning and ("random 10%" in meaning or "not been measured" in meaning)
    page.select_option("#explain-method", "routing")
    wait_until(page, "() => document.getElementById('explain-caption').textContent.startsWith('Routing map')")
    assert "not what the score depends on" in str(page.locator("#explain-meaning").text_content())
    other = next(c for c in model["classes"] if c != predicted)
    page.select_option("#explain-class", index=model["classes"].index(other))
    wait_until(page, f"() => document.getElementById('explain-caption').textContent.includes('“{other}”')")
    assert str(caption.text_content()).startswith("Routing map")  # the method stays as chosen
    wait_idle(page)
    assert page.locator("#error").is_hidden()
    tab.check_clean()


def mnist_png(data_dir: Path, index: int) -> tuple[bytes, int]:
    from training.data.mnist import load_split

    test = load_split(data_dir, "test")
    buffer = io.BytesIO()
    Image.fromarray(test.images[index, 0].astype(np.uint8)).save(buffer, format="PNG")
    return buffer.getvalue(), int(test.labels[index])


def test_uploading_an_mnist_digit_shows_its_class(tab: Tab, server: Server, real_mnist: Path) -> None:
    page = tab.page
    data, label = mnist_png(real_mnist, 0)
    page.set_input_files("#file-input", files=[{"name": "mnist-0.png", "mimeType": "image/png", "buffer": data}])
    shown = wait_prediction(page)
    if server.models["default_model"] in server.trained:
        assert shown == server.default["classes"][label]
    else:
        assert shown in server.default["classes"]  # an untrained test model: any class, but one is shown
    wait_reconstruction(page)
    path = screenshot(page, "explorer-mnist.png")
    if os.environ.get("CAPSNET_UPDATE_SCREENSHOT") == "1":
        save_readme_screenshot(path)
    tab.check_clean()


def save_readme_screenshot(path: Path) -> None:
    """A small palette PNG of the screenshot, for the README."""
    image = Image.open(path).convert("RGB")
    image.quantize(colors=128, dither=Image.Dither.NONE).save(README_SCREENSHOT, optimize=True)


def test_uploading_a_non_image_shows_the_service_message(tab: Tab, server: Server) -> None:
    page = tab.page
    body = b"these are notes, not a picture\n"
    request = urllib.request.Request(
        f"{server.base}/v1/models/{server.models['default_model']}/capsules",
        data=b"--b\r\nContent-Disposition: form-data; name=files; filename=notes.txt\r\n"
        b"Content-Type: text/plain\r\n\r\n" + body + b"\r\n--b--\r\n",
        headers={"Content-Type": "multipart/form-data; boundary=b"},
    )
    with pytest.raises(urllib.error.HTTPError) as rejected:
        urllib.request.urlopen(request, timeout=10)
    status, message = rejected.value.code, json.load(rejected.value)["error"]

    page.set_input_files("#file-input", files=[{"name": "notes.txt", "mimeType": "text/plain", "buffer": body}])
    error = page.locator("#error")
    error.wait_for(state="visible")
    text = str(error.text_content())
    assert f"HTTP {status}" in text and message in text, text
    assert page.locator("#predicted-class").text_content() == "–"
    screenshot(page, "explorer-error.png")
    tab.check_clean(allow_http_errors=True)


def test_a_model_without_decoder_shows_4x4_poses_and_no_reconstruction(tab: Tab, server: Server) -> None:
    page = tab.page
    assert not page.locator("#model-select").is_disabled(), "several models are served: the chooser is on"
    draw_seven(page)
    wait_prediction(page)
    page.select_option("#model-select", EM_LIKE)
    wait_until(page, "() => document.querySelectorAll('#heatmap.blocks .pose-row').length === 10")
    assert page.locator("#heatmap .pose-row.top .cell").count() == 16
    assert page.locator("#heatmap").evaluate("e => getComputedStyle(e).getPropertyValue('--cols')").strip() == "4"
    assert page.locator("#lengths-heading").text_content() == "Capsule activations"
    notice = page.locator("#no-decoder")
    assert notice.is_visible() and "no decoder" in str(notice.text_content())
    assert page.locator("#recon-controls").is_hidden() and page.locator("#recon-figure").is_hidden()
    assert page.locator("#no-explanation").is_hidden()  # occlusion explains any model: only the routing map is off
    wait_until(page, "() => document.getElementById('explain-caption').textContent.startsWith('Occlusion')")
    assert (
        page.locator("#explain-method").is_disabled() and page.locator("#explain-method").input_value() == "occlusion"
    )
    screenshot(page, "explorer-no-decoder.png")
    tab.check_clean()


def test_every_control_is_reachable_with_the_keyboard_and_shows_focus(tab: Tab, server: Server) -> None:
    page = tab.page
    draw_seven(page)
    wait_prediction(page)
    wait_reconstruction(page)
    last_slider = f"dim-{int(np.prod(server.default['pose_shape'])) - 1}"
    page.locator("body").focus()
    outline: dict[str, str] = {}  # id of each element Tab reached -> its outline style while focused
    for _ in range(80):
        page.keyboard.press("Tab")
        element_id, style = page.evaluate(
            "() => [document.activeElement.id || document.activeElement.tagName,"
            " getComputedStyle(document.activeElement).outlineStyle]"
        )
        outline.setdefault(element_id, style)
    controls = ["model-select", "clear-button", "file-input", "recon-class", "reset-button", "dim-0", last_slider]
    missing = [c for c in controls if c not in outline]
    assert not missing, f"not reachable with Tab: {missing} (reached {sorted(outline)})"
    hidden_focus = [c for c in controls if c != "file-input" and outline[c] == "none"]
    assert not hidden_focus, f"no visible focus on {hidden_focus}"
    tab.check_clean()


def test_readable_and_drawable_at_360_px(phone: Tab) -> None:
    page = phone.page
    box = page.locator("#draw").bounding_box()
    page.touchscreen.tap(box["x"] + box["width"] / 2, box["y"] + box["height"] / 2)
    wait_prediction(page)
    overflow = page.evaluate("document.documentElement.scrollWidth - document.documentElement.clientWidth")
    assert overflow <= 0, f"the page scrolls sideways by {overflow} px at 360 px"
    assert page.locator("#lengths").bounding_box()["width"] <= 360
    screenshot(page, "explorer-360.png")
    phone.check_clean()


@pytest.mark.parametrize(("path", "rendered"), [("/docs", ".swagger-ui .opblock"), ("/redoc", "li[data-item-id]")])
def test_api_docs_render_offline(browser: Any, server: Server, path: str, rendered: str) -> None:
    """Every request to another origin is refused, as on a machine without internet: the docs still render."""
    ctx = browser.new_context()
    page = ctx.new_page()
    page.set_default_timeout(TIMEOUT_MS)
    foreign: list[str] = []

    def only_own(route: Any) -> None:
        if route.request.url.startswith(server.base):
            route.continue_()
        else:
            foreign.append(route.request.url)
            route.abort()

    page.route("**/*", only_own)
    try:
        page.goto(server.base + path)
        page.wait_for_selector(rendered, timeout=TIMEOUT_MS)
        assert page.locator(rendered).count() >= 10  # one per documented operation (Swagger) or menu entry (ReDoc)
        assert not foreign, f"{path} reached outside the service: {foreign}"
    finally:
        ctx.close()


EXPLORER_TOKEN = "explorer-token-1"


@pytest.fixture(scope="module")
def protected_base(browser_repository: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """The same models behind bearer-token authentication."""
    tokens = tmp_path_factory.mktemp("tokens") / "tokens"
    tokens.write_text(f"# explorer test\n{EXPLORER_TOKEN}\n")
    with running_server(browser_repository, CAPSNET_PROVIDER="cpu", CAPSNET_AUTH_TOKENS_FILE=str(tokens)) as (base, _):
        yield base


def enter_token(page: Any, token: str) -> None:
    form = page.locator("#token-form")
    form.wait_for(state="visible")
    assert page.evaluate("document.activeElement.id") == "token-input"
    page.keyboard.type(token)
    page.keyboard.press("Enter")


def test_a_protected_service_asks_for_a_token_and_keeps_it_for_the_tab(browser: Any, protected_base: str) -> None:
    ctx = browser.new_context(viewport={"width": 1200, "height": 900})
    page = ctx.new_page()
    page.set_default_timeout(TIMEOUT_MS)
    sent: list[str | None] = []
    page.on("request", lambda r: sent.append(r.headers.get("authorization")) if "/v1/" in r.url else None)
    page.goto(protected_base + "/")
    message = page.locator("#token-message")
    enter_token(page, "wrong-token")
    wait_until(page, "() => document.getElementById('token-message').textContent.includes('did not accept')")
    assert "invalid bearer token" in str(message.text_content())
    assert page.evaluate("document.getElementById('token-input').value") == ""
    screenshot(page, "explorer-token.png")
    enter_token(page, EXPLORER_TOKEN)
    wait_until(page, "() => document.querySelector('#model-select option:checked:not([disabled])') !== null")
    assert page.locator("#token-form").is_hidden() and page.locator("#error").is_hidden()
    draw_seven(page)
    assert wait_prediction(page) != "–"
    assert sent[:3] == [None, "Bearer wrong-token", f"Bearer {EXPLORER_TOKEN}"]
    assert set(sent[3:]) == {f"Bearer {EXPLORER_TOKEN}"}  # every later call (capsules, decode) carries it
    stored = "() => [sessionStorage.length, localStorage.length, document.cookie]"
    assert page.evaluate(stored) == [1, 0, ""]  # the tab's session only
    page.reload()  # the same tab keeps it
    wait_until(page, "() => document.querySelector('#model-select option:checked:not([disabled])') !== null")
    assert page.locator("#token-form").is_hidden()
    other = ctx.new_page()  # another tab asks again
    other.goto(protected_base + "/")
    other.locator("#token-form").wait_for(state="visible")
    assert "needs an access token" in str(other.locator("#token-message").text_content())
    ctx.close()


@pytest.fixture(scope="module")
def versioned_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    """The EM-shaped model as version folders 1 and 2, both served (policy all)."""
    chromium_or_skip()
    staging, root = tmp_path_factory.mktemp("staging"), tmp_path_factory.mktemp("versioned")
    write_em_like(staging, EM_LIKE)
    for version in ("1", "2"):
        shutil.copytree(staging / EM_LIKE, root / EM_LIKE / version)
    (root / EM_LIKE / "version_policy.json").write_text('{"all": true}')
    with running_server(root, CAPSNET_PROVIDER="cpu") as (base, _):
        yield Server(base, get_json(f"{base}/v1/models"))


@pytest.fixture
def versioned_tab(browser: Any, versioned_server: Server) -> Iterator[Tab]:
    yield from open_tab(browser, versioned_server, viewport={"width": 1200, "height": 900})


def test_the_version_picker_sends_the_chosen_version(versioned_tab: Tab) -> None:
    tab = versioned_tab
    page = tab.page
    picker = page.locator("#version-select")
    assert not picker.is_disabled(), "two versions are ready: the picker is on"
    options = page.eval_on_selector_all("#version-select option", "os => os.map(o => o.textContent)")
    assert options == ["newest (2)", "2", "1"]
    assert "version 2" in str(page.locator("#model-info").text_content())
    sent: list[str] = []
    page.on("request", lambda r: sent.append(r.url) if "/capsules" in r.url else None)
    draw_seven(page)
    wait_prediction(page)
    assert sent and "version=" not in sent[-1]  # the newest: the service's choice
    page.select_option("#version-select", "1")
    wait_until(page, "() => /version 1/.test(document.getElementById('model-info').textContent)")
    draw_seven(page)
    wait_prediction(page)
    assert sent[-1].endswith("version=1"), sent
    tab.check_clean()

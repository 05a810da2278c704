"""/v1/explain's methods on inputs whose answer is known, the occlusion's trip through the batcher, and its errors."""

from __future__ import annotations

import asyncio
import io
import shutil
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import numpy as np
import onnxruntime as ort
import pytest
from fastapi.testclient import TestClient
from PIL import Image

from service.api.routes.explain import OCCLUSION_CHUNK, batched_scores
from service.explanation import METHODS, occluded_copies, occlusion_grid, occlusion_tiles
from service.main import create_app
from tests.conftest import REPO_ROOT
from tests.service.conftest import EM_LIKE, TINY, digit_image, service_settings, wait_ready, write_em_like

ATTENDING = "tiny-attending"  # class 7 weighs the 8x8 square REGION only; the other classes weigh every pixel
REGION = (slice(4, 12), slice(4, 12))  # occlusion tiles (1, 1), (1, 2), (2, 1), (2, 2)
REGION_TILES = {(1, 1), (1, 2), (2, 1), (2, 2)}
DISTRACTOR = (slice(20, 24), slice(20, 24))  # tile (5, 5): ink that class 7 ignores
WEIGHT = 0.02  # class 7's weight on each pixel of REGION
OTHERS = -0.01  # every other class's weight on every pixel
BUNDLED = REPO_ROOT / "model" / "zoo" / "capsnet-mnist"
ATOL = 1e-5


def sigmoid(x: float) -> float:
    return float(1.0 / (1.0 + np.exp(-x)))


def attending_weights() -> np.ndarray:
    weights = np.full((28, 28, 10), OTHERS)
    weights[..., 7] = 0.0
    weights[REGION[0], REGION[1], 7] = WEIGHT
    return weights.reshape(784, 10)


def digit_with_distractor() -> np.ndarray:
    """A square "digit" where class 7 looks, and a 4x4 patch of ink where it does not."""
    image = np.zeros((28, 28), np.float32)
    image[REGION] = 1.0
    image[DISTRACTOR] = 1.0
    return image


def body(*images: np.ndarray) -> dict[str, Any]:
    """JSON arrays in [0, 1]: used as is by the service (no preprocessing), so the model sees exactly these."""
    return {"images": [{"array": a.reshape(28, 28).tolist()} for a in images]}


@pytest.fixture(scope="module")
def client(model_repository: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[TestClient]:
    """tiny (a dynamic-routing capsnet with a routing map), tiny-em (no routing map) and tiny-attending."""
    root = tmp_path_factory.mktemp("explain-methods")
    for name in (TINY, EM_LIKE):
        shutil.copytree(model_repository / name, root / name)
    write_em_like(root, ATTENDING, attending_weights())
    with TestClient(create_app(service_settings(root)), raise_server_exceptions=False) as c:
        wait_ready(c)
        yield c


# --- occlusion: known answers ----------------------------------------------------------------------------------


def test_occlusion_weighs_the_ink_the_class_looks_at_and_not_the_distractor(client: TestClient) -> None:
    r = client.post(f"/v1/models/{ATTENDING}/explain", json=body(digit_with_distractor()))
    assert r.status_code == 200, r.text
    out = r.json()
    assert out["method"] == "occlusion" and out["receptive_field"] == {"size": 4, "stride": 4}
    (item,) = out["explanations"]
    full = 64 * WEIGHT  # class 7's logit on the intact image
    assert item["class"] == item["predicted_class"] == 7 and item["share"] is None
    assert item["score"] == pytest.approx(sigmoid(full), abs=ATOL)
    want = np.zeros((7, 7))
    for r_, c_ in REGION_TILES:
        want[r_, c_] = sigmoid(full) - sigmoid(full - 16 * WEIGHT)  # one tile of the square blacked out
    np.testing.assert_allclose(np.array(item["grid"]), want, atol=ATOL)  # the distractor's tile (5, 5) weighs 0
    heat = np.array(item["heatmap"])
    np.testing.assert_allclose(heat[REGION], want[1, 1], atol=ATOL)
    assert np.abs(heat[DISTRACTOR]).max() < ATOL and np.abs(heat).sum() == pytest.approx(64 * want[1, 1], abs=1e-4)


def test_occlusion_of_another_class_shows_the_ink_that_argues_against_it(client: TestClient) -> None:
    r = client.post(f"/v1/models/{ATTENDING}/explain", params={"class": 3}, json=body(digit_with_distractor()))
    assert r.status_code == 200, r.text
    (item,) = r.json()["explanations"]
    inked = 80 * OTHERS  # class 3's logit: every inked pixel counts against it
    assert item["class"] == 3 and item["predicted_class"] == 7
    grid = np.array(item["grid"])
    drop = sigmoid(inked) - sigmoid(inked - 16 * OTHERS)  # < 0: without the tile, class 3 scores higher
    for tile in [*REGION_TILES, (5, 5)]:
        assert grid[tile] == pytest.approx(drop, abs=ATOL)
    assert drop < 0 and np.count_nonzero(np.abs(grid) > ATOL) == 5


def test_occlusion_matches_the_graph_run_by_hand_and_is_batch_independent(
    client: TestClient, model_repository: Path
) -> None:
    rng = np.random.default_rng(3)
    images = (rng.random((2, 28, 28)) * (rng.random((2, 28, 28)) > 0.7)).astype(np.float32)
    images[1, :, 14:] = 0.0  # the right half has no ink: those tiles are not run and weigh 0
    both = client.post(f"/v1/models/{TINY}/explain", json=body(*images)).json()["explanations"]
    alone = client.post(f"/v1/models/{TINY}/explain", json=body(images[1])).json()["explanations"][0]
    np.testing.assert_allclose(np.array(both[1]["grid"]), np.array(alone["grid"]), atol=ATOL)
    session = ort.InferenceSession(str(model_repository / TINY / "capsnet.onnx"), providers=["CPUExecutionProvider"])
    for image, item in zip(images, both, strict=True):
        scores = session.run(["lengths"], {"image": image[None, None]})[0][0]
        tiles = occlusion_tiles(image)
        occluded = session.run(["lengths"], {"image": occluded_copies(image, tiles)[:, None]})[0][:, item["class"]]
        want = occlusion_grid(float(scores[item["class"]]), occluded, tiles, (7, 7))
        np.testing.assert_allclose(np.array(item["grid"]), want, atol=ATOL)
    assert not np.array(both[1]["grid"])[:, 4:].any()


def test_occlusion_on_the_bundled_model_ignores_a_distractor_patch() -> None:
    """The bundled capsnet-mnist on a drawn 7 with a patch of ink in a corner: the patch weighs next to nothing,
    the stroke most."""
    if not BUNDLED.is_dir():
        pytest.skip("the bundled model/zoo/capsnet-mnist is absent")
    session = ort.InferenceSession(str(BUNDLED / "capsnet.onnx"), providers=["CPUExecutionProvider"])
    image = digit_image().astype(np.float32) / 255.0
    image[24:28, 0:4] = 1.0  # tile (6, 0), far from the stroke
    scores = session.run(["lengths"], {"image": image[None, None]})[0][0]
    assert scores.argmax() == 7
    tiles = occlusion_tiles(image)
    occluded = session.run(["lengths"], {"image": occluded_copies(image, tiles)[:, None]})[0][:, 7]
    grid = occlusion_grid(float(scores[7]), occluded, tiles, (7, 7))
    assert abs(grid[6, 0]) < 0.02 and grid.max() > 0.2
    assert np.unravel_index(grid.argmax(), grid.shape) != (6, 0)
    top = np.unravel_index(grid.argmax(), grid.shape)
    assert image[top[0] * 4 : top[0] * 4 + 4, top[1] * 4 : top[1] * 4 + 4].any()  # the top tile holds stroke ink


def test_occlusion_png_colours_the_tiles_the_class_needs(client: TestClient) -> None:
    r = client.post(
        f"/v1/models/{ATTENDING}/explain", params={"format": "png", "scale": 1}, json=body(digit_with_distractor())
    )
    assert r.status_code == 200 and r.headers["content-type"] == "image/png"
    assert r.headers["x-explanation-method"] == "occlusion"
    pixels = np.asarray(Image.open(io.BytesIO(r.content))).astype(int)  # (28, 28, 3)
    red_minus_blue = pixels[..., 0] - pixels[..., 2]
    assert red_minus_blue[REGION].min() > 100  # the square: in colour
    assert not red_minus_blue[DISTRACTOR].any()  # the ignored patch: plain gray (white)


def test_occlusion_runs_for_a_model_without_a_routing_map(client: TestClient) -> None:
    r = client.post(f"/v1/models/{EM_LIKE}/explain", json=body(digit_with_distractor()))
    assert r.status_code == 200, r.text
    assert r.json()["method"] == "occlusion" and len(r.json()["explanations"][0]["grid"]) == 7


# --- occlusion through the batcher ------------------------------------------------------------------------------


class RecordingModel:
    """Stands in for a ServedModel: records the rows of each `infer` and whether two ran at once."""

    def __init__(self, max_batch_size: int | None) -> None:
        self.max_batch_size = max_batch_size
        self.calls: list[int] = []
        self.running = 0
        self.overlapped = False

    async def infer(self, images: np.ndarray) -> dict[str, np.ndarray]:
        self.running += 1
        self.overlapped |= self.running > 1
        await asyncio.sleep(0)
        self.calls.append(len(images))
        self.running -= 1
        return {"scores": images.reshape(len(images), -1)[:, :10]}


@pytest.mark.parametrize(("max_batch", "want"), [(32, [8, 8, 4]), (1, [1] * 20), (None, [8, 8, 4]), (5, [5] * 4)])
def test_occluded_copies_go_to_the_batcher_in_chunks_one_after_another(max_batch: int | None, want: list[int]) -> None:
    model = RecordingModel(max_batch)
    card = SimpleNamespace(classes=[str(k) for k in range(10)], scores=SimpleNamespace(output="scores"))
    copies = np.arange(20 * 784, dtype=np.float32).reshape(20, 1, 28, 28)
    scores = asyncio.run(batched_scores(model, card, copies))  # type: ignore[arg-type]
    assert model.calls == want and max(want) <= OCCLUSION_CHUNK and not model.overlapped
    np.testing.assert_array_equal(scores, copies.reshape(20, -1)[:, :10])  # every copy's scores, in order


# --- routing, methods and errors --------------------------------------------------------------------------------


def test_routing_is_offered_by_name_and_says_so(client: TestClient) -> None:
    r = client.post(f"/v1/models/{TINY}/explain", params={"method": "routing"}, json=body(digit_with_distractor()))
    assert r.status_code == 200, r.text
    assert r.json()["method"] == "routing" and r.json()["receptive_field"] == {"size": 17, "stride": 2}
    assert 0 < r.json()["explanations"][0]["share"] <= 1


def test_the_model_list_names_each_models_methods(client: TestClient) -> None:
    methods = {m["name"]: m["explain_methods"] for m in client.get("/v1/models").json()["models"]}
    assert methods == {TINY: list(METHODS), EM_LIKE: ["occlusion"], ATTENDING: ["occlusion"]}


def test_an_unknown_method_is_400_naming_the_valid_ones(client: TestClient) -> None:
    r = client.post(f"/v1/models/{TINY}/explain", params={"method": "gradcam"}, json=body(digit_with_distractor()))
    assert r.status_code == 400 and r.json()["type"] == "invalid_input"
    assert "method" in r.json()["error"] and "'occlusion'" in r.json()["error"] and "'routing'" in r.json()["error"]


def test_routing_without_the_output_is_409_pointing_to_occlusion(client: TestClient) -> None:
    r = client.post(f"/v1/models/{EM_LIKE}/explain", params={"method": "routing"}, json=body(digit_with_distractor()))
    assert r.status_code == 409 and r.json()["type"] == "model_capability"
    assert r.json()["error"].startswith(f"model {EM_LIKE!r} has no routing map")
    assert "method=occlusion works for it" in r.json()["error"]


def test_the_method_is_in_the_openapi_schema(client: TestClient) -> None:
    schema = client.get("/openapi.json").json()
    parameters = {p["name"]: p for p in schema["paths"]["/v1/explain"]["post"]["parameters"]}
    assert parameters["method"]["schema"]["default"] == "occlusion"
    assert "method" in schema["components"]["schemas"]["ExplainResponse"]["properties"]

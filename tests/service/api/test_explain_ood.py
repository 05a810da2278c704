"""/v1/explain (routing maps, JSON and PNG) and the 'not a digit' fields of classify and capsules."""

from __future__ import annotations

import io
import json
import shutil
from pathlib import Path

import numpy as np
import onnxruntime as ort
import pytest
from fastapi.testclient import TestClient
from PIL import Image

from service.explanation import input_heatmap
from service.runtime.card import CardError, parse_card
from service.runtime.ood import OODCalibration, image_features
from tests.conftest import synthetic_digits
from tests.service.conftest import EM_LIKE, TINY

CALIBRATED = "tiny-ood"
EM_CALIBRATED = "tiny-em-ood"  # no decoder: calibrated on winning activation, margin and ink
ATOL = 1e-5


def graph_outputs(directory: Path, images: np.ndarray) -> dict[str, np.ndarray]:
    session = ort.InferenceSession(str(directory / "capsnet.onnx"), providers=["CPUExecutionProvider"])
    names = [o.name for o in session.get_outputs()]
    return dict(zip(names, session.run(names, {"image": images}), strict=True))


def body(*images: np.ndarray) -> dict[str, list[dict[str, list[list[float]]]]]:
    """JSON arrays in [0, 1]: used as is by the service (no preprocessing), so the model sees exactly these."""
    return {"images": [{"array": a.reshape(28, 28).tolist()} for a in images]}


def sample_images(n: int = 3) -> np.ndarray:
    images, _ = synthetic_digits(n, seed=5)
    return (images / 255.0).astype(np.float32).reshape(n, 1, 28, 28)


@pytest.fixture(scope="module")
def calibrated_repository(model_repository: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """tiny-ood and tiny-em-ood: tiny and tiny-em calibrated on 64 synthetic digits (threshold: 80th percentile)."""
    from training.ood.calibrate import ModelOutputs, calibrate, write_ood_calibration

    root = tmp_path_factory.mktemp("calibrated")
    images, _ = synthetic_digits(64, seed=0)
    for source, name in ((TINY, CALIBRATED), (EM_LIKE, EM_CALIBRATED)):
        directory = root / name
        shutil.copytree(model_repository / source, directory)
        card = json.loads((directory / "model.json").read_text())
        (directory / "model.json").write_text(json.dumps({**card, "name": name}))
        features, _ = ModelOutputs(directory).features((images / 255.0).astype(np.float32).reshape(-1, 1, 28, 28))
        write_ood_calibration(directory, calibrate(features, 80.0, "64 synthetic digits", 0.99))
    return root


@pytest.fixture(scope="module")
def ood_client(calibrated_repository: Path) -> TestClient:
    from service.main import create_app
    from tests.service.conftest import service_settings, wait_ready

    with TestClient(create_app(service_settings(calibrated_repository)), raise_server_exceptions=False) as c:
        wait_ready(c)
        yield c


# --- explain ---------------------------------------------------------------------------------------------------


def test_explain_json_is_the_graph_map_of_the_predicted_class(client: TestClient, model_repository: Path) -> None:
    images = sample_images(3)
    r = client.post(f"/v1/models/{TINY}/explain", json=body(*images))
    assert r.status_code == 200, r.text
    out = r.json()
    card = json.loads((model_repository / TINY / "model.json").read_text())
    field = next(o for o in card["outputs"] if o["role"] == "explanation")["receptive_field"]
    assert out["receptive_field"] == field
    want = graph_outputs(model_repository / TINY, images)
    for i, item in enumerate(out["explanations"]):
        predicted = int(want["lengths"][i].argmax())
        assert item["class"] == item["predicted_class"] == predicted and item["label"] == str(predicted)
        grid = np.array(item["grid"])
        np.testing.assert_allclose(grid, want["explanation"][i, predicted], atol=ATOL)
        heat = np.array(item["heatmap"])
        assert heat.shape == (28, 28)
        assert grid.min() - ATOL <= heat[:-1, :-1].min() and heat.max() <= grid.max() + ATOL  # means of cells
        np.testing.assert_allclose(heat, input_heatmap(grid, field["size"], field["stride"], (28, 28)), atol=ATOL)
        share = want["explanation"][i, predicted].sum() / want["explanation"][i].sum()
        assert item["share"] == pytest.approx(share, abs=1e-5)


def test_heatmap_is_the_mean_of_the_cells_that_see_each_pixel() -> None:
    flat = input_heatmap(np.full((6, 6), 2.0), 17, 2, (28, 28))
    np.testing.assert_array_equal(flat[:27, :27], 2.0)  # a uniform grid draws a uniform map
    assert not flat[27].any() and not flat[:, 27].any()  # no cell sees the last row and column
    one = np.zeros((6, 6))
    one[0, 0] = 1.0
    heat = input_heatmap(one, 17, 2, (28, 28))
    assert heat[0, 0] == 1.0 and heat[0, 1] == 1.0  # only cell (0, 0) sees pixel (0, 0) and (0, 1)
    assert heat[2, 2] == pytest.approx(1 / 4)  # cells (0, 0), (0, 1), (1, 0), (1, 1) see pixel (2, 2)
    assert heat[16, 16] == pytest.approx(1 / 36) and heat[17, 17] == 0.0


def test_explain_a_requested_class_on_the_default_route(client: TestClient, model_repository: Path) -> None:
    images = sample_images(1)
    r = client.post("/v1/explain", params={"class": 4}, json=body(*images))
    assert r.status_code == 200, r.text
    item = r.json()["explanations"][0]
    assert item["class"] == 4 and item["label"] == "4"
    want = graph_outputs(model_repository / TINY, images)["explanation"][0, 4]
    np.testing.assert_allclose(np.array(item["grid"]), want, atol=ATOL)


def test_explain_is_batch_independent(client: TestClient) -> None:
    images = sample_images(3)
    batch = client.post(f"/v1/models/{TINY}/explain", json=body(*images)).json()["explanations"]
    alone = client.post(f"/v1/models/{TINY}/explain", json=body(images[1])).json()["explanations"][0]
    np.testing.assert_allclose(np.array(batch[1]["grid"]), np.array(alone["grid"]), atol=ATOL)
    np.testing.assert_allclose(np.array(batch[1]["heatmap"]), np.array(alone["heatmap"]), atol=ATOL)
    assert batch[1]["class"] == alone["class"]


def test_explain_png_is_an_upscaled_colour_overlay(client: TestClient) -> None:
    r = client.post(f"/v1/models/{TINY}/explain", params={"format": "png", "scale": 4}, json=body(sample_images(1)[0]))
    assert r.status_code == 200 and r.headers["content-type"] == "image/png"
    picture = Image.open(io.BytesIO(r.content))
    assert picture.mode == "RGB" and picture.size == (112, 112)
    pixels = np.asarray(picture).astype(int)
    assert (pixels[..., 0] - pixels[..., 2]).max() > 50  # the heat is drawn in red-orange over the gray input


@pytest.mark.parametrize(
    ("params", "images", "status", "message"),
    [
        ({"class": 10}, 1, 400, "class 10 is out of range: model 'tiny' has classes 0..9"),
        ({"class": -1}, 1, 400, "class"),
        ({"format": "png"}, 2, 400, "format=png returns one image but the request has 2; use format=json"),
        ({"format": "png", "scale": 0}, 1, 400, "scale"),
        ({"format": "gif"}, 1, 400, "format"),
    ],
)
def test_explain_rejects_bad_options(
    client: TestClient, params: dict[str, object], images: int, status: int, message: str
) -> None:
    r = client.post(f"/v1/models/{TINY}/explain", params=params, json=body(*sample_images(images)))
    assert r.status_code == status
    assert message in r.json()["error"]


def test_explain_without_the_output_is_409(client: TestClient) -> None:
    r = client.post(f"/v1/models/{EM_LIKE}/explain", json=body(sample_images(1)[0]))
    assert r.status_code == 409
    assert r.json()["type"] == "model_capability"
    assert r.json()["error"].startswith(f"model {EM_LIKE!r} cannot explain its routing: its graph has no explanation")


def test_explain_bad_image_is_400(client: TestClient) -> None:
    r = client.post(f"/v1/models/{TINY}/explain", json={"images": [{"array": [[0.5] * 3] * 3}]})
    assert r.status_code == 400


def test_explain_is_in_the_openapi_schema(client: TestClient) -> None:
    schema = client.get("/openapi.json").json()
    assert "/v1/explain" in schema["paths"] and "/v1/models/{name}/explain" in schema["paths"]
    assert {"grid", "heatmap", "share"} <= set(schema["components"]["schemas"]["Explanation"]["properties"])
    assert {"ood_score", "in_distribution"} <= set(schema["components"]["schemas"]["Prediction"]["properties"])
    parameters = {p["name"] for p in schema["paths"]["/v1/classify"]["post"]["parameters"]}
    assert "reject_ood" in parameters


# --- not a digit -----------------------------------------------------------------------------------------------


def test_uncalibrated_model_gives_null_ood_fields_and_409_on_reject(client: TestClient) -> None:
    item = client.post(f"/v1/models/{TINY}/classify", json=body(sample_images(1)[0])).json()["predictions"][0]
    assert item["ood_score"] is None and item["in_distribution"] is None
    r = client.post(f"/v1/models/{TINY}/classify", params={"reject_ood": "true"}, json=body(sample_images(1)[0]))
    assert r.status_code == 409
    assert "has no 'not a digit' calibration" in r.json()["error"]


def expected_ood(repository: Path, images: np.ndarray) -> tuple[np.ndarray, np.ndarray, float]:
    card = json.loads((repository / CALIBRATED / "model.json").read_text())
    calibration = OODCalibration.from_card(card["ood"])
    out = graph_outputs(repository / CALIBRATED, images)
    score = calibration.score(image_features(images, out["lengths"], out["reconstruction"]))
    return score, score <= calibration.threshold, calibration.threshold


@pytest.mark.parametrize("op", ["classify", "capsules"])
def test_ood_fields_match_the_card_calibration(ood_client: TestClient, calibrated_repository: Path, op: str) -> None:
    images = np.concatenate([sample_images(3), np.zeros((1, 1, 28, 28), np.float32)])  # the last is blank
    r = ood_client.post(f"/v1/models/{CALIBRATED}/{op}", json=body(*images))
    assert r.status_code == 200, r.text
    items = r.json()["predictions" if op == "classify" else "capsules"]
    score, accepted, _ = expected_ood(calibrated_repository, images)
    assert [i["ood_score"] for i in items] == pytest.approx(score.tolist(), abs=1e-5)
    assert [i["in_distribution"] for i in items] == accepted.tolist()
    assert items[-1]["in_distribution"] is False  # a blank page has no ink: far below every digit


@pytest.mark.parametrize("op", ["classify", "capsules"])
def test_ood_parts_on_request_add_up_to_the_score(ood_client: TestClient, op: str) -> None:
    images = np.concatenate([sample_images(2), np.zeros((1, 1, 28, 28), np.float32)])
    r = ood_client.post(f"/v1/models/{CALIBRATED}/{op}", params={"include_ood_parts": "true"}, json=body(*images))
    assert r.status_code == 200, r.text
    items = r.json()["predictions" if op == "classify" else "capsules"]
    for item in items:  # a card without a combiner: the score is the largest surprise
        parts = item["ood_parts"]
        assert {p["name"] for p in parts} == {"distance", "relative_distance", "winning_score", "margin", "ink"}
        assert max(p["contribution"] for p in parts) == pytest.approx(item["ood_score"], abs=1e-5)
        assert all(0 < p["tail_share"] <= 1 and p["says"] for p in parts)
    blank = {p["name"]: p for p in items[2]["ood_parts"]}["ink"]
    assert blank["value"] == 0.0 and blank["says"].startswith("the amount of ink is unlike a digit's")


def test_ood_parts_need_a_calibration(client: TestClient) -> None:
    r = client.post(f"/v1/models/{TINY}/classify", params={"include_ood_parts": "true"}, json=body(sample_images(1)[0]))
    assert r.status_code == 409 and "so its score has no parts; omit include_ood_parts" in r.json()["error"]


def test_ood_score_is_batch_independent(ood_client: TestClient) -> None:
    images = sample_images(3)
    batch = ood_client.post(f"/v1/models/{CALIBRATED}/classify", json=body(*images)).json()["predictions"]
    alone = ood_client.post(f"/v1/models/{CALIBRATED}/classify", json=body(images[2])).json()["predictions"][0]
    assert batch[2]["ood_score"] == pytest.approx(alone["ood_score"], abs=1e-5)
    assert batch[2]["in_distribution"] == alone["in_distribution"]


def test_callers_of_one_run_are_scored_in_one_call_as_if_alone(
    calibrated_repository: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from service.api.routes.inference import ood_scores
    from service.runtime.batcher import BatchResult, Rows

    card = parse_card(json.loads((calibrated_repository / CALIBRATED / "model.json").read_text()))
    calibration = card.ood_calibration
    assert calibration is not None
    images = np.concatenate([sample_images(3), np.zeros((1, 1, 28, 28), np.float32)])
    outputs = graph_outputs(calibrated_repository / CALIBRATED, images)
    alone = [
        ood_scores(card, calibration, images[i : i + 1], {k: v[i : i + 1] for k, v in outputs.items()})
        for i in range(4)
    ]
    calls: list[int] = []
    assess = OODCalibration.assess
    monkeypatch.setattr(OODCalibration, "assess", lambda self, x, *a: calls.append(len(x)) or assess(self, x, *a))
    shared = BatchResult({card.input.name: images}, outputs)
    callers = [(images[:3], slice(0, 3)), (images[3:], slice(3, 4))]  # two requests in one run
    scored = [ood_scores(card, calibration, x, Rows(shared, rows)) for x, rows in callers]
    assert calls == [4]  # the whole batch, once
    assert np.concatenate([s for s, _ in scored]).tolist() == pytest.approx([float(s[0]) for s, _ in alone], abs=1e-9)
    assert np.concatenate([a for _, a in scored]).tolist() == [bool(a[0]) for _, a in alone]


def test_reject_ood_answers_422_naming_the_image(ood_client: TestClient, calibrated_repository: Path) -> None:
    images, _ = synthetic_digits(64, seed=0)  # the reference images: most are accepted
    reference = (images / 255.0).astype(np.float32).reshape(-1, 1, 28, 28)
    _, accepted, threshold = expected_ood(calibrated_repository, reference)
    good = reference[int(np.flatnonzero(accepted)[0])]
    ok = ood_client.post(f"/v1/models/{CALIBRATED}/classify", params={"reject_ood": "true"}, json=body(good))
    assert ok.status_code == 200 and ok.json()["predictions"][0]["in_distribution"] is True
    blank = np.zeros((1, 28, 28), np.float32)
    r = ood_client.post(f"/v1/models/{CALIBRATED}/capsules", params={"reject_ood": "true"}, json=body(good, blank))
    assert r.status_code == 422
    assert r.json()["type"] == "out_of_distribution"
    message = r.json()["error"]
    assert message.startswith(f"1 of 2 images are not digits by the calibrated score of model {CALIBRATED!r} (image 1:")
    assert f"> threshold {threshold:.3f}); send reject_ood=false to classify them anyway" in message


def test_malformed_ood_calibration_is_a_card_error(calibrated_repository: Path) -> None:
    card = json.loads((calibrated_repository / CALIBRATED / "model.json").read_text())
    card["ood"]["features"][0]["values"] = card["ood"]["features"][0]["values"][::-1]
    with pytest.raises(CardError, match=r"ood calibration is malformed: ValueError .*values must be .* increasing"):
        parse_card(card)
    card = json.loads((calibrated_repository / CALIBRATED / "model.json").read_text())
    del card["ood"]["threshold"]
    with pytest.raises(CardError, match="ood calibration is malformed: KeyError 'threshold'"):
        parse_card(card)


def test_explanation_receptive_field_is_checked(model_repository: Path) -> None:
    card = json.loads((model_repository / TINY / "model.json").read_text())
    explanation = next(o for o in card["outputs"] if o["role"] == "explanation")
    explanation["receptive_field"] = {"size": 40, "stride": 2}
    with pytest.raises(CardError, match=r"receptive field .* exceeds the input"):
        parse_card(card)


def test_a_model_without_decoder_is_scored_on_its_activations(
    ood_client: TestClient, calibrated_repository: Path
) -> None:
    card = json.loads((calibrated_repository / EM_CALIBRATED / "model.json").read_text())
    assert [f["name"] for f in card["ood"]["features"]] == ["winning_score", "margin", "ink"]
    calibration = OODCalibration.from_card(card["ood"])
    images = np.concatenate([sample_images(2), np.zeros((1, 1, 28, 28), np.float32)])
    out = graph_outputs(calibrated_repository / EM_CALIBRATED, images)
    score = calibration.score(image_features(images, out["activations"], None))
    items = ood_client.post(f"/v1/models/{EM_CALIBRATED}/classify", json=body(*images)).json()["predictions"]
    assert [i["ood_score"] for i in items] == pytest.approx(score.tolist(), abs=1e-5)
    assert items[-1]["in_distribution"] is False
    r = ood_client.post(f"/v1/models/{EM_CALIBRATED}/explain", json=body(images[0]))
    assert r.status_code == 409


def test_models_list_says_what_each_model_can_do(ood_client: TestClient) -> None:
    models = {m["name"]: m for m in ood_client.get("/v1/models").json()["models"]}
    assert models[CALIBRATED]["has_explanation"] is True and models[CALIBRATED]["ood_calibrated"] is True
    assert models[EM_CALIBRATED]["has_explanation"] is False and models[EM_CALIBRATED]["ood_calibrated"] is True


@pytest.mark.parametrize("with_reconstruction", [True, False])
def test_features_of_a_large_batch_are_those_of_each_image(with_reconstruction: bool) -> None:
    from service.runtime.ood import chunk_rows

    rng = np.random.default_rng(3)
    step = chunk_rows(np.zeros((1, 1, 28, 28), np.float32))
    assert step == 20
    n = 2 * step + 5  # computed in chunks
    images = rng.random((n, 1, 28, 28), dtype=np.float32)
    scores = rng.random((n, 10), dtype=np.float32)
    reconstruction = rng.random((n, 784), dtype=np.float32) if with_reconstruction else None
    batch = image_features(images, scores, reconstruction)
    for i in (0, step, n - 1):
        alone = image_features(
            images[i : i + 1], scores[i : i + 1], None if reconstruction is None else reconstruction[i : i + 1]
        )
        assert alone.keys() == batch.keys()
        assert all(batch[k][i] == alone[k][0] for k in alone)  # the same arithmetic, bit for bit
    assert all(len(v) == n for v in batch.values())


def calibration_of(features: dict[str, np.ndarray]) -> OODCalibration:
    """The calibration `training.ood.calibrate` writes for reference images with these features."""
    from training.ood.calibrate import calibrate

    return OODCalibration.from_card(calibrate(features, 95.0, "test", 0.99))


@pytest.mark.parametrize("with_reconstruction", [True, False])
def test_one_image_is_scored_as_in_a_batch_to_the_last_bit(with_reconstruction: bool) -> None:
    """A single image takes the plain-Python path (numpy's interp transcribed); a batch takes numpy's. The
    reference quantiles come from the same kind of images, so the features land between, on and beyond them."""
    rng = np.random.default_rng(5)
    n = 400
    images = rng.random((n, 1, 28, 28), dtype=np.float32) * rng.random((n, 1, 1, 1), dtype=np.float32)
    scores = rng.random((n, 10), dtype=np.float32)
    reconstruction = rng.random((n, 784), dtype=np.float32) if with_reconstruction else None
    calibration = calibration_of({k: v[: n // 2] for k, v in image_features(images, scores, reconstruction).items()})
    batch_score, batch_accepted = calibration.assess(images, scores, reconstruction)
    assert 0 < batch_accepted.sum() < n  # both verdicts occur
    for i in range(n):
        one = slice(i, i + 1)
        recon = None if reconstruction is None else reconstruction[one]
        score, accepted = calibration.assess(images[one], scores[one], recon)
        assert score.shape == accepted.shape == (1,)
        assert score[0] == batch_score[i] and accepted[0] == batch_accepted[i], i
    for reference in calibration.features:  # on the knots, just beside them and far outside
        knots = np.concatenate([reference.values, np.nextafter(reference.values, np.inf), [-1e9, 1e9]])
        alone = -np.log([reference.tail_probability(float(x)) for x in knots])
        assert np.array_equal(reference.surprise(knots), alone)


def test_a_non_finite_value_is_scored_by_numpy() -> None:
    rng = np.random.default_rng(6)
    images = rng.random((30, 1, 28, 28), dtype=np.float32)
    scores = rng.random((30, 10), dtype=np.float32)
    calibration = calibration_of(image_features(images, scores, None))
    scores[0, 3] = np.nan
    score, accepted = calibration.assess(images[:1], scores[:1], None)
    expected = calibration.score(image_features(images[:1], scores[:1], None))
    assert np.isnan(expected[0]) and np.array_equal(score, expected, equal_nan=True) and not accepted[0]

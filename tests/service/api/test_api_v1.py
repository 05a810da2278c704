"""The v1 application API against ONNX Runtime run directly on the same inputs."""

from __future__ import annotations

import base64
import io
import json
from pathlib import Path

import numpy as np
import onnxruntime as ort
import pytest
from fastapi.testclient import TestClient
from PIL import Image

from service.imaging import ImageLimits, decode_image, preprocess
from tests.service.conftest import EM_LIKE, NO_DECODER, TINY, TINY_36, digit_image, png_bytes

ATOL = 1e-5


def run_graph(repository: Path, model: str, graph: str, inputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    session = ort.InferenceSession(str(repository / model / graph), providers=["CPUExecutionProvider"])
    names = [o.name for o in session.get_outputs()]
    return dict(zip(names, session.run(names, inputs), strict=True))


def model_input(png: bytes) -> np.ndarray:
    """What the service should feed the model for `png` with the default options."""
    return preprocess(decode_image(png, ImageLimits(max_pixels=10**7)), (28, 28)).array.reshape(1, 1, 28, 28)


def array_body(*arrays: np.ndarray) -> dict[str, list[dict[str, list[list[float]]]]]:
    return {"images": [{"array": (a / 255.0).tolist()} for a in arrays]}


def test_models_lists_every_model_with_its_capabilities(client: TestClient) -> None:
    body = client.get("/v1/models").json()
    assert body["default_model"] == TINY  # no test error on any card: the first by name
    models = {m["name"]: m for m in body["models"]}
    assert sorted(models) == [TINY, EM_LIKE, NO_DECODER]
    assert models[TINY]["has_decoder"] is True
    assert models[NO_DECODER]["has_decoder"] is False
    assert models[EM_LIKE]["pose_shape"] == [4, 4]
    assert all(m["ready"] and m["state"] == "ready" and m["error"] is None for m in models.values())
    assert all(m["execution_provider"] == "CPUExecutionProvider" for m in models.values())


def test_model_detail_returns_the_card(client: TestClient, model_repository: Path) -> None:
    body = client.get(f"/v1/models/{TINY}").json()
    assert body["card"] == json.loads((model_repository / TINY / "model.json").read_text())
    assert body["classes"] == [str(i) for i in range(10)]


def test_classify_multipart_matches_onnxruntime(client: TestClient, model_repository: Path) -> None:
    png = png_bytes(digit_image())
    r = client.post(f"/v1/models/{TINY}/classify", files=[("files", ("seven.png", png, "image/png"))])
    assert r.status_code == 200
    body = r.json()
    assert body["model"] == TINY and body["model_version"] == "1"
    (pred,) = body["predictions"]
    expected = run_graph(model_repository, TINY, "capsnet.onnx", {"image": model_input(png)})["lengths"][0]
    np.testing.assert_allclose(pred["scores"], expected, atol=ATOL)
    assert pred["predicted_class"] == int(expected.argmax())
    assert pred["label"] == str(int(expected.argmax()))
    assert pred["score_kind"] == "capsule_length"
    np.testing.assert_allclose(pred["probabilities"], expected / expected.sum(), atol=ATOL)
    assert sum(pred["probabilities"]) == pytest.approx(1.0, abs=1e-5)
    assert [t["class"] for t in pred["top_k"]] == list(np.argsort(-expected, kind="stable")[:3])
    assert pred["preprocessing"] == {
        "source": "file",
        "filename": "seven.png",
        "inverted": False,
        "normalized": True,
        "input": None,
    }


def test_classify_several_files_keeps_their_order(client: TestClient) -> None:
    images = [digit_image(), np.rot90(digit_image()).copy(), digit_image(56)]
    files = [("files", (f"{i}.png", png_bytes(a), "image/png")) for i, a in enumerate(images)]
    one_by_one = [client.post("/v1/classify", files=[f]).json()["predictions"][0]["scores"] for f in files]
    together = client.post("/v1/classify", files=files).json()["predictions"]
    assert [p["index"] for p in together] == [0, 1, 2]
    for alone, joint in zip(one_by_one, together, strict=True):
        np.testing.assert_allclose(joint["scores"], alone, atol=ATOL)


def test_base64_wrapped_unpadded_or_in_a_data_url_with_parameters_is_accepted(client: TestClient) -> None:
    png = png_bytes(digit_image())
    encoded = base64.b64encode(png).decode()
    wrapped = base64.encodebytes(png).decode()  # what `base64` prints: lines of 76 characters, a final newline
    assert "\n" in wrapped.rstrip("\n") and encoded.endswith("=")
    variants = [
        encoded,
        wrapped,
        "\r\n".join(wrapped.splitlines()),
        f"  {encoded[:10]}\t{encoded[10:]} ",
        encoded.rstrip("="),
        "data:image/png;base64," + wrapped,
        "data:IMAGE/PNG;name=seven.png;BASE64," + encoded.rstrip("="),
    ]
    r = client.post("/v1/classify", json={"images": [{"data": v} for v in variants]})
    assert r.status_code == 200, r.text
    scores = [p["scores"] for p in r.json()["predictions"]]
    assert all(s == scores[0] for s in scores)


def test_classify_json_base64_data_url_and_array_agree(client: TestClient) -> None:
    png = png_bytes(digit_image())
    encoded = base64.b64encode(png).decode()
    body = {"images": [{"data": encoded}, {"data": "data:image/png;base64," + encoded}]}
    preds = client.post("/v1/classify", json=body).json()["predictions"]
    assert preds[0]["scores"] == preds[1]["scores"]
    assert preds[0]["preprocessing"]["source"] == "base64"
    preprocessed = model_input(png)[0, 0]
    r = client.post("/v1/classify", json={"images": [{"array": preprocessed.tolist()}]})
    arr = r.json()["predictions"][0]
    np.testing.assert_allclose(arr["scores"], preds[0]["scores"], atol=ATOL)
    assert arr["preprocessing"] == {
        "source": "array",
        "filename": None,
        "inverted": False,
        "normalized": False,
        "input": None,
    }


def test_classify_include_input_returns_what_the_model_received(client: TestClient) -> None:
    png = png_bytes(digit_image(dark_on_light=True))
    r = client.post("/v1/classify?include_input=true&top_k=10", files=[("files", ("d.png", png, "image/png"))])
    pred = r.json()["predictions"][0]
    assert pred["preprocessing"]["inverted"] is True
    np.testing.assert_allclose(pred["preprocessing"]["input"], model_input(png)[0, 0], atol=1e-6)
    assert len(pred["top_k"]) == 10


def test_classify_invert_and_normalize_options(client: TestClient) -> None:
    png = png_bytes(digit_image(dark_on_light=True))
    files = [("files", ("d.png", png, "image/png"))]
    forced = client.post("/v1/classify?invert=false&normalize=false", files=files).json()["predictions"][0]
    assert forced["preprocessing"]["inverted"] is False
    assert forced["preprocessing"]["normalized"] is False
    auto = client.post("/v1/classify", files=files).json()["predictions"][0]
    assert auto["preprocessing"]["inverted"] is True


def test_capsules_return_every_pose_and_call_out_the_predicted_one(client: TestClient, model_repository: Path) -> None:
    image = digit_image()
    body = client.post(f"/v1/models/{TINY}/capsules", json=array_body(image)).json()
    assert body["pose_shape"] == [8]
    (caps,) = body["capsules"]
    expected = run_graph(
        model_repository, TINY, "capsnet.onnx", {"image": (image / 255.0).astype(np.float32)[None, None]}
    )
    np.testing.assert_allclose(caps["poses"], expected["poses"][0], atol=ATOL)
    assert caps["predicted_pose"] == caps["poses"][caps["predicted_class"]]
    assert len(caps["top_k"]) == 10


def test_em_shaped_model_served_by_the_same_code(client: TestClient, model_repository: Path) -> None:
    image = digit_image()
    body = client.post(f"/v1/models/{EM_LIKE}/capsules", json=array_body(image)).json()
    assert body["model_version"] == "3" and body["pose_shape"] == [4, 4]
    caps = body["capsules"][0]
    assert np.array(caps["poses"]).shape == (10, 4, 4)
    assert np.array(caps["predicted_pose"]).shape == (4, 4)
    assert caps["score_kind"] == "activation"
    expected = run_graph(
        model_repository, EM_LIKE, "capsnet.onnx", {"image": (image / 255.0).astype(np.float32)[None, None]}
    )
    np.testing.assert_allclose(caps["scores"], expected["activations"][0], atol=ATOL)


def decoder_reference(repository: Path, poses: np.ndarray, cls: int) -> np.ndarray:
    mask = np.zeros((1, 10), np.float32)
    mask[0, cls] = 1
    return run_graph(repository, TINY, "decoder.onnx", {"poses": poses.astype(np.float32), "mask": mask})[
        "reconstruction"
    ][0, 0]


def test_reconstruct_predicted_and_requested_class(client: TestClient, model_repository: Path) -> None:
    image = digit_image()
    x = (image / 255.0).astype(np.float32)[None, None]
    out = run_graph(model_repository, TINY, "capsnet.onnx", {"image": x})
    predicted = int(out["lengths"][0].argmax())
    body = client.post(f"/v1/models/{TINY}/reconstruct", json=array_body(image)).json()
    (rec,) = body["reconstructions"]
    assert rec["class"] == predicted == rec["predicted_class"]
    np.testing.assert_allclose(rec["image"], out["reconstruction"][0, 0], atol=ATOL)  # the graph's own decoding
    other = (predicted + 1) % 10
    rec = client.post(f"/v1/models/{TINY}/reconstruct?class={other}", json=array_body(image)).json()
    assert rec["reconstructions"][0]["class"] == other and rec["reconstructions"][0]["label"] == str(other)
    np.testing.assert_allclose(
        rec["reconstructions"][0]["image"], decoder_reference(model_repository, out["poses"], other), atol=ATOL
    )


def test_reconstruct_png(client: TestClient) -> None:
    r = client.post(f"/v1/models/{TINY}/reconstruct?format=png", json=array_body(digit_image()))
    assert r.status_code == 200 and r.headers["content-type"] == "image/png"
    png = Image.open(io.BytesIO(r.content))
    assert png.size == (28, 28) and png.mode == "L"
    as_json = client.post(f"/v1/models/{TINY}/reconstruct", json=array_body(digit_image())).json()
    expected = np.round(np.array(as_json["reconstructions"][0]["image"]) * 255)
    assert np.abs(np.asarray(png, dtype=np.float64) - expected).max() <= 1


def test_perturb_grid_follows_figure_4(client: TestClient, model_repository: Path) -> None:
    image = digit_image()
    body = client.post(f"/v1/models/{TINY}/perturb", json=array_body(image)).json()
    np.testing.assert_allclose(body["deltas"], np.arange(-0.25, 0.2501, 0.05), atol=1e-6)
    grid = np.array(body["images"])
    assert grid.shape == (8, 11, 28, 28)  # the tiny model's 8 pose dimensions × 11 values
    x = (image / 255.0).astype(np.float32)[None, None]
    out = run_graph(model_repository, TINY, "capsnet.onnx", {"image": x})
    cls = body["class"]
    assert cls == body["predicted_class"] == int(out["lengths"][0].argmax())
    np.testing.assert_allclose(body["pose"], out["poses"][0, cls], atol=ATOL)
    assert np.abs(grid[:, 5] - out["reconstruction"][0, 0]).max() < 1e-4  # delta 0: the plain reconstruction
    edited = out["poses"].copy()
    edited[0, cls, 3] += -0.25
    np.testing.assert_allclose(grid[3, 0], decoder_reference(model_repository, edited, cls), atol=ATOL)


def test_perturb_png_and_custom_range(client: TestClient) -> None:
    r = client.post("/v1/perturb?format=png&low=-0.1&high=0.1&step=0.1&class=2", json=array_body(digit_image()))
    assert r.status_code == 200 and r.headers["content-type"] == "image/png"
    assert Image.open(io.BytesIO(r.content)).size == (3 * 28, 8 * 28)  # width: values, height: dimensions


def test_decode_edited_poses(client: TestClient, model_repository: Path) -> None:
    caps = client.post(f"/v1/models/{TINY}/capsules", json=array_body(digit_image())).json()["capsules"][0]
    cls = caps["predicted_class"]
    poses = np.array(caps["poses"])
    plain = client.post(f"/v1/models/{TINY}/decode", json={"poses": poses.tolist(), "class": cls}).json()
    np.testing.assert_allclose(plain["image"], decoder_reference(model_repository, poses[None], cls), atol=ATOL)
    poses[cls, 0] += 0.2
    edited = client.post("/v1/decode", json={"poses": poses.tolist(), "class": cls}).json()
    np.testing.assert_allclose(edited["image"], decoder_reference(model_repository, poses[None], cls), atol=ATOL)
    assert np.abs(np.array(edited["image"]) - np.array(plain["image"])).max() > 0
    mask = [0.0] * 10
    mask[cls] = 1.0
    by_mask = client.post("/v1/decode", json={"poses": poses.tolist(), "mask": mask}).json()
    assert by_mask["image"] == edited["image"]
    r = client.post("/v1/decode?format=png", json={"poses": poses.tolist(), "class": cls})
    assert r.headers["content-type"] == "image/png"


@pytest.mark.parametrize("model", [NO_DECODER, EM_LIKE])
@pytest.mark.parametrize("op", ["reconstruct", "perturb"])
def test_models_without_decoder_refuse_to_reconstruct(client: TestClient, model: str, op: str) -> None:
    r = client.post(f"/v1/models/{model}/{op}", json=array_body(digit_image()))
    assert r.status_code == 409
    assert r.json() == {
        "error": f"model '{model}' has no decoder, so it cannot reconstruct images (its card's decoder is null)",
        "type": "model_capability",
    }


def test_decode_without_decoder_is_refused(client: TestClient) -> None:
    r = client.post(f"/v1/models/{EM_LIKE}/decode", json={"poses": np.zeros((10, 4, 4)).tolist(), "class": 1})
    assert r.status_code == 409
    assert r.json()["error"].startswith(f"model '{EM_LIKE}' has no decoder")


def test_default_model_setting(make_client, model_repository: Path) -> None:  # type: ignore[no-untyped-def]
    client = make_client(model_repository, default_model=EM_LIKE)
    assert client.get("/v1/models").json()["default_model"] == EM_LIKE
    assert client.post("/v1/classify", json=array_body(digit_image())).json()["model"] == EM_LIKE


def test_image_size_comes_from_the_card(make_client, sized_repository: Path) -> None:  # type: ignore[no-untyped-def]
    client = make_client(sized_repository)
    card = client.get(f"/v1/models/{TINY_36}").json()["card"]
    assert card["input"]["shape"] == [-1, 1, 36, 36]
    png = png_bytes(digit_image(size=50))
    r = client.post(f"/v1/models/{TINY_36}/classify?include_input=true", files={"f": ("seven.png", png, "image/png")})
    assert r.status_code == 200, r.text
    received = np.array(r.json()["predictions"][0]["preprocessing"]["input"])
    assert received.shape == (36, 36)
    expected = preprocess(decode_image(png, ImageLimits()), (36, 36)).array
    np.testing.assert_allclose(received, expected, atol=1e-6)
    direct = run_graph(sized_repository, TINY_36, "capsnet.onnx", {"image": expected.reshape(1, 1, 36, 36)})
    np.testing.assert_allclose(r.json()["predictions"][0]["scores"], direct["lengths"][0], atol=ATOL)

    raw = np.random.default_rng(0).random((36, 36))
    r = client.post(f"/v1/models/{TINY_36}/classify", json={"images": [{"array": raw.tolist()}]})
    assert r.status_code == 200, r.text
    direct = run_graph(sized_repository, TINY_36, "capsnet.onnx", {"image": raw.reshape(1, 1, 36, 36).astype("f4")})
    np.testing.assert_allclose(r.json()["predictions"][0]["scores"], direct["lengths"][0], atol=ATOL)

    r = client.post(f"/v1/models/{TINY_36}/classify", json=array_body(digit_image()))
    assert r.status_code == 400
    assert r.json() == {
        "error": "images[0].array: pixels must be a 36×36 array, got shape [28, 28]",
        "type": "invalid_input",
    }


def test_reconstructions_have_the_cards_image_size(make_client, sized_repository: Path) -> None:  # type: ignore[no-untyped-def]
    client = make_client(sized_repository)
    files = {"f": ("seven.png", png_bytes(digit_image(size=36)), "image/png")}
    recon = client.post(f"/v1/models/{TINY_36}/reconstruct", files=files).json()["reconstructions"][0]
    assert np.array(recon["image"]).shape == (36, 36)
    r = client.post(f"/v1/models/{TINY_36}/perturb?format=png", files=files)
    assert r.status_code == 200, r.text
    pose_size = client.get(f"/v1/models/{TINY_36}").json()["card"]["pose_shape"][0]
    assert Image.open(io.BytesIO(r.content)).size == (11 * 36, pose_size * 36)


def test_openapi_documents_every_route_with_examples(client: TestClient) -> None:
    schema = client.get("/openapi.json").json()
    paths = schema["paths"]
    for op in ("classify", "capsules", "reconstruct", "perturb", "decode"):
        assert f"/v1/{op}" in paths and f"/v1/models/{{name}}/{op}" in paths
    for path in ("/v2", "/v2/health/live", "/v2/health/ready", "/v2/models/{name}", "/v2/models/{name}/infer"):
        assert path in paths
    body = paths["/v1/classify"]["post"]["requestBody"]["content"]
    assert set(body) == {"multipart/form-data", "application/json"}
    assert schema["components"]["schemas"]["ImagesRequest"]["examples"]
    assert schema["components"]["schemas"]["InferenceRequest"]["examples"]
    for path in ("/v2/models/{name}", "/v2/models/{name}/ready", "/v2/models/{name}/versions/{model_version}/ready"):
        listed = paths[path]["get"]["responses"]
        assert "413" not in listed and "415" not in listed and "404" in listed, path  # GETs read no body or image
    assert "content" not in paths["/v2/models/{name}/ready"]["get"]["responses"]["400"]  # not ready: empty body
    assert {"413", "415"} <= set(paths["/v2/models/{name}/infer"]["post"]["responses"])
    ood = {f"/v1{prefix}/{op}" for prefix in ("", "/models/{name}") for op in ("classify", "capsules")}
    for path, operations in paths.items():  # bad parameters are 400s (see test_errors), never FastAPI's 422
        for method, operation in operations.items():
            error = operation["responses"].get("422", {})  # only reject_ood's "not a digit", as ErrorV1
            assert (path in ood) == ("reject_ood=true" in error.get("description", "")), (method, path)
            assert path not in ood or error["content"]["application/json"]["schema"]["$ref"].endswith("/ErrorV1")
    assert "HTTPValidationError" not in schema["components"]["schemas"]
    assert client.post("/v1/classify?top_k=x").status_code == 400
    assert client.get("/docs").status_code == 200


def same_fields(example: object, real: object, where: str = "") -> None:
    """The example has the real response's structure: no field the API does not send, and every field it
    sends except the null ones (lists: compared by their first items)."""
    if isinstance(real, dict):
        assert isinstance(example, dict), where
        assert set(example) <= set(real), (where, set(example) - set(real))
        assert {k for k, v in real.items() if v is not None} <= set(example), (where, set(real) - set(example))
        for key in example:
            same_fields(example[key], real[key], f"{where}.{key}")
    elif isinstance(real, list) and real and isinstance(real[0], dict | list):
        assert isinstance(example, list) and example, where
        same_fields(example[0], real[0], f"{where}[0]")


def test_openapi_response_examples_match_the_responses(client: TestClient) -> None:
    schemas = client.get("/openapi.json").json()["components"]["schemas"]
    image = array_body(digit_image())
    poses = client.post("/v1/capsules", json=image).json()["capsules"][0]["poses"]
    v2_body = {
        "id": "42",
        "inputs": [{"name": "image", "shape": [1, 1, 28, 28], "datatype": "FP32", "data": [0.0] * 784}],
    }
    real = {
        "ModelList": client.get("/v1/models"),
        "ClassifyResponse": client.post("/v1/classify", json=image),
        "CapsulesResponse": client.post("/v1/capsules", json=image),
        "ReconstructResponse": client.post("/v1/reconstruct", json=image),
        "PerturbResponse": client.post("/v1/perturb", json=image),
        "DecodeResponse": client.post("/v1/decode", json={"poses": poses, "class": 7}),
        "ModelMetadata": client.get(f"/v2/models/{TINY}"),
        "InferenceResponse": client.post(
            f"/v2/models/{TINY}/infer", json={**v2_body, "outputs": [{"name": "lengths"}]}
        ),
    }
    for name, response in real.items():
        assert response.status_code == 200, (name, response.text)
        examples = schemas[name]["examples"]
        assert examples, name
        same_fields(examples[0], response.json(), name)


def test_index_page(client: TestClient) -> None:
    r = client.get("/")
    assert r.status_code == 200 and r.headers["content-type"].startswith("text/html")


def test_a_batch_s_predictions_are_each_image_s_alone(model_repository: Path) -> None:
    """Predictions are built once per batch (one numpy call each for all images); every image's values are what it
    gets alone, bit for bit, a row of zero scores included (uniform probabilities)."""
    from service.api.routes.inference import predictions
    from service.api.schemas import InputInfo
    from service.runtime.model_dir import load_model_dir

    card = load_model_dir(model_repository / TINY).card
    rng = np.random.default_rng(8)
    scores = rng.random((7, len(card.classes)), dtype=np.float32)
    scores[2] = 0.0
    scores[4, 3] = scores[4, 5] = 2.0  # a tie at the top: the lower class ranks first
    info = [InputInfo(source="file", filename=f"{i}.png", inverted=False, normalized=True) for i in range(7)]
    ood = (rng.random(7), rng.random(7) > 0.5)
    batch = predictions(card, scores, info, 4, ood)
    for i, got in enumerate(batch):
        (alone,) = predictions(card, scores[i : i + 1], info[i : i + 1], 4, (ood[0][i : i + 1], ood[1][i : i + 1]))
        assert got.model_dump() == {**alone.model_dump(), "index": i}
    assert batch[2].probabilities == [round(1 / len(card.classes), 6)] * len(card.classes)
    assert [t.class_ for t in batch[4].top_k[:2]] == [3, 5]

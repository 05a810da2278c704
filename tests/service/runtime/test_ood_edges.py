"""The served "not a digit" flag of each bundled model, pinned: two images just either side of its card's threshold
through the real classify route, with their scores and the score's parts.

The pairs (`ood_edges.json`) are a typeset digit blended into a letter, cut by bisection on the blend so that
one scores just below the threshold and one just above (`python -m training.ood.calibrate --model model/zoo/<name>
--write-edges tests/service/runtime/ood_edges.json`). They fail when the comparison, the threshold (by a
few percent either way), a part or the combination changes; re-cut them after a new calibration.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from fastapi.testclient import TestClient

ZOO = Path(__file__).resolve().parents[3] / "model" / "zoo"
EDGES = Path(__file__).parent / "ood_edges.json"
MODELS = ("capsnet-mnist", "capsnet-mnist-int8", "capsnet-em-mnist")
NEAR = 0.05  # each image's score lies within 5% of the threshold: a 20% looser or tighter threshold flips one
EDGE_CLEAR, EDGE_CLEAR_MIN = 1e-3, 5e-4  # and no closer than training.ood.edges cuts it (relatively, absolutely)


@pytest.fixture(scope="module")
def zoo_client(tmp_path_factory: pytest.TempPathFactory) -> Iterator[TestClient]:
    from service.main import create_app
    from tests.service.conftest import service_settings, wait_ready

    if not all((ZOO / name / "model.json").is_file() for name in MODELS):
        pytest.skip("the bundled models are not in model/zoo")
    repository = tmp_path_factory.mktemp("zoo")
    for name in MODELS:
        (repository / name).symlink_to(ZOO / name)
    with TestClient(create_app(service_settings(repository)), raise_server_exceptions=False) as client:
        wait_ready(client)
        yield client


def pair_of(name: str) -> dict[str, Any]:
    pair: dict[str, Any] = json.loads(EDGES.read_text())[name]
    return pair


@pytest.mark.parametrize("name", MODELS)
def test_the_pair_was_cut_for_the_card_and_sits_close_either_side(name: str) -> None:
    pair = pair_of(name)
    threshold = json.loads((ZOO / name / "model.json").read_text())["ood"]["threshold"]
    assert pair["threshold"] == threshold  # re-cut the pair after a new calibration
    assert threshold > 0
    assert threshold / (1 + NEAR) < pair["below"]["ood_score"] <= threshold < pair["above"]["ood_score"]
    assert pair["above"]["ood_score"] < threshold * (1 + NEAR)
    clear = max(EDGE_CLEAR * threshold, EDGE_CLEAR_MIN)  # far enough that a batch's size cannot flip the flag
    assert min(threshold - pair["below"]["ood_score"], pair["above"]["ood_score"] - threshold) >= clear


@pytest.mark.parametrize("name", MODELS)
def test_the_served_flag_score_and_parts_either_side_of_the_threshold(zoo_client: TestClient, name: str) -> None:
    pair = pair_of(name)
    served_alone = []  # one image per request, as the pair was scored: a batch's size can move the last digits
    for side in ("below", "above"):
        alone = {"images": [{"array": pair[side]["pixels"]}]}
        r = zoo_client.post(f"/v1/models/{name}/classify", params={"include_ood_parts": "true"}, json=alone)
        assert r.status_code == 200, r.text
        served_alone.append(r.json()["predictions"][0])
    below, above = served_alone
    assert below["in_distribution"] is True and above["in_distribution"] is False
    for side, served in (("below", below), ("above", above)):
        assert served["ood_score"] == pytest.approx(pair[side]["ood_score"], abs=2e-5)
        parts = {p["name"]: p["contribution"] for p in served["ood_parts"]}
        assert parts == pytest.approx(pair[side]["parts"], abs=1e-4)
        assert all(isinstance(p["says"], str) and p["says"] for p in served["ood_parts"])
    body = {"images": [{"array": pair[side]["pixels"]} for side in ("below", "above")]}
    with_parts = zoo_client.post(f"/v1/models/{name}/classify", params={"include_ood_parts": "true"}, json=body)
    plain = zoo_client.post(f"/v1/models/{name}/classify", json=body).json()["predictions"]
    assert with_parts.status_code == 200, with_parts.text
    assert [p["ood_score"] for p in plain] == [p["ood_score"] for p in with_parts.json()["predictions"]]
    assert [p["in_distribution"] for p in plain] == [True, False]  # in a batch of two as well
    assert [p["ood_score"] for p in plain] == pytest.approx([below["ood_score"], above["ood_score"]], abs=2e-4)
    assert "ood_parts" not in plain[0]


@pytest.mark.parametrize("name", MODELS)
def test_reject_ood_passes_the_image_below_and_refuses_the_one_above(zoo_client: TestClient, name: str) -> None:
    pair = pair_of(name)
    route = f"/v1/models/{name}/classify"
    ok = zoo_client.post(route, params={"reject_ood": "true"}, json={"images": [{"array": pair["below"]["pixels"]}]})
    assert ok.status_code == 200
    r = zoo_client.post(route, params={"reject_ood": "true"}, json={"images": [{"array": pair["above"]["pixels"]}]})
    assert r.status_code == 422 and "not digits by the calibrated score" in r.json()["error"]


VETO_NEAR = 0.02  # each image of a veto pair has a margin within 2% of the cut: a veto 2% looser or tighter flips one
# unless the two images are one pixel apart, the finest step an image allows: the preprocessing places the digit by its
# centre of mass, so one pixel's level can move the margin by a few percent; then within this
VETO_NEAR_ONE_PIXEL = 0.05


def card_ood(name: str) -> dict[str, Any]:
    ood: dict[str, Any] = json.loads((ZOO / name / "model.json").read_text())["ood"]
    return ood


@pytest.mark.parametrize("name", MODELS)
def test_a_card_with_a_misread_veto_has_a_pair_cut_either_side_of_it(name: str) -> None:
    pair, veto = pair_of(name), card_ood(name).get("veto")
    assert ("veto" in pair) == (veto is not None)  # re-cut the pairs after a new calibration
    if veto is None:
        return
    cut = pair["veto"]
    assert (cut["at_most"], cut["score"]) == (veto["at_most"], veto["score"])
    assert cut["inside"]["margin"] <= veto["at_most"] < cut["outside"]["margin"]
    apart = np.count_nonzero(np.asarray(cut["inside"]["pixels"]) != np.asarray(cut["outside"]["pixels"]))
    near = VETO_NEAR_ONE_PIXEL if apart == 1 else VETO_NEAR
    assert cut["outside"]["margin"] < veto["at_most"] * (1 + near)
    assert cut["inside"]["margin"] > veto["at_most"] * (1 - near)
    assert cut["outside"]["ood_score"] <= card_ood(name)["threshold"] < cut["inside"]["ood_score"] == veto["score"]


@pytest.mark.parametrize("name", MODELS)
def test_the_served_flag_either_side_of_the_misread_veto(zoo_client: TestClient, name: str) -> None:
    veto = card_ood(name).get("veto")
    if veto is None:
        pytest.skip(f"the {name} card has no misread veto (the validation sets did not choose one)")
    cut = pair_of(name)["veto"]
    served = {}
    for side in ("outside", "inside"):
        alone = {"images": [{"array": cut[side]["pixels"]}]}
        r = zoo_client.post(f"/v1/models/{name}/classify", params={"include_ood_parts": "true"}, json=alone)
        assert r.status_code == 200, r.text
        served[side] = r.json()["predictions"][0]
        assert served[side]["ood_score"] == pytest.approx(cut[side]["ood_score"], abs=2e-5)
        parts = {p["name"]: p["contribution"] for p in served[side]["ood_parts"]}
        assert parts == pytest.approx(cut[side]["parts"], abs=1e-4)
    assert served["outside"]["in_distribution"] is True and served["inside"]["in_distribution"] is False
    margin = next(p for p in served["inside"]["ood_parts"] if p["name"] == "margin")
    assert "hardly wins over the runner-up" in margin["says"]

"""The `pattern` network of the "not a digit" score: its input vector, its arithmetic, its card checks."""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from service.runtime.ood import (
    OODCalibration,
    OODPart,
)
from service.runtime.ood_pattern import RANKED, VECTOR_INPUTS, PatternNetwork, capsule_vector, vector_width

K, D = 3, 4


def batch(n: int, seed: int = 0) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    images = rng.random((n, 1, 4, 4)).astype(np.float32)
    scores = rng.random((n, K)).astype(np.float32)
    poses = rng.normal(size=(n, K, D)).astype(np.float32)
    reconstruction = rng.random((n, 1, 4, 4)).astype(np.float32)
    return images, scores, poses, reconstruction


def network_entry(inputs: tuple[str, ...] = ("scores", "ranked_scores", "poses", "ink", "distance")) -> dict[str, Any]:
    images, scores, poses, reconstruction = batch(1)
    width = capsule_vector(inputs, images, scores, poses, reconstruction).shape[1]
    rng = np.random.default_rng(7)
    return {
        "inputs": list(inputs),
        "mean": rng.normal(size=width).tolist(),
        "scale": rng.uniform(0.5, 2, width).tolist(),
        "members": [
            {
                "layers": [
                    {"weight": rng.normal(size=(5, width)).tolist(), "bias": rng.normal(size=5).tolist()},
                    {"weight": rng.normal(size=(1, 5)).tolist(), "bias": [bias]},
                ]
            }
            for bias in (0.25, -0.5)
        ],
    }


def test_the_capsule_vector_holds_each_input_in_order() -> None:
    images, scores, poses, reconstruction = batch(4)
    vector = capsule_vector(
        ("scores", "ranked_scores", "poses", "ink", "distance"), images, scores, poses, reconstruction
    )
    assert vector.shape == (4, K + RANKED + K * D + 1 + 2)
    np.testing.assert_allclose(vector[:, :K], scores)
    np.testing.assert_allclose(vector[:, K : K + RANKED], -np.sort(-scores, axis=1)[:, :RANKED])
    np.testing.assert_allclose(vector[:, K + RANKED : K + RANKED + K * D], poses.reshape(4, -1))
    x = images.reshape(4, -1).astype(np.float64)
    np.testing.assert_allclose(vector[:, -3], x.sum(axis=1) / 100)
    distance = np.linalg.norm(x - reconstruction.reshape(4, -1), axis=1)
    np.testing.assert_allclose(vector[:, -2], distance, rtol=1e-6)
    np.testing.assert_allclose(vector[:, -1], distance / np.linalg.norm(x, axis=1), rtol=1e-6)
    em = capsule_vector(("poses", "ink"), images, scores, poses, None)  # no decoder, no distance
    assert em.shape == (4, K * D + 1)


def test_the_capsule_vector_holds_the_routing_map_and_the_parts_flattened() -> None:
    images, scores, poses, _ = batch(3)
    rng = np.random.default_rng(5)
    explanation, parts = rng.random((3, K, 2, 2)), rng.random((3, 4, 5))
    vector = capsule_vector(("ink", "explanation", "parts"), images, scores, poses, None, explanation, parts)
    assert vector.shape == (3, 1 + K * 4 + 20)
    np.testing.assert_array_equal(vector[:, 1 : 1 + K * 4], explanation.reshape(3, -1))
    np.testing.assert_array_equal(vector[:, 1 + K * 4 :], parts.reshape(3, -1))
    for name in ("explanation", "parts"):
        with pytest.raises(ValueError, match=f"needs the model's {name} output"):
            capsule_vector((name,), images, scores, poses, None)


@pytest.mark.parametrize(("inputs", "missing"), [(("poses",), "poses"), (("distance",), "reconstruction")])
def test_the_capsule_vector_names_a_missing_output(inputs: tuple[str, ...], missing: str) -> None:
    images, scores, _, _ = batch(2)
    with pytest.raises(ValueError, match=missing):
        capsule_vector(inputs, images, scores, None, None)


def test_the_network_is_the_mean_of_standardised_perceptrons() -> None:
    entry = network_entry()
    network = PatternNetwork.from_card(entry)
    images, scores, poses, reconstruction = batch(6, seed=3)
    vector = capsule_vector(network.inputs, images, scores, poses, reconstruction)
    x = (vector - np.array(entry["mean"])) / np.array(entry["scale"])
    outputs = []
    for member in entry["members"]:
        first, last = member["layers"]
        h = np.maximum(x @ np.array(first["weight"]).T + first["bias"], 0)
        outputs.append((h @ np.array(last["weight"]).T)[:, 0] + last["bias"][0])
    expected = (outputs[0] + outputs[1]) / 2  # the network runs in float32: equal to that rounding
    np.testing.assert_allclose(network.pattern(images, scores, poses, reconstruction), expected, rtol=1e-5, atol=1e-5)
    alone = PatternNetwork.from_card({**entry, "members": entry["members"][:1]})
    np.testing.assert_allclose(alone.pattern(images, scores, poses, reconstruction), outputs[0], rtol=1e-5, atol=1e-5)


def reference_network(entry: dict[str, Any], vectors: np.ndarray) -> np.ndarray:
    """The card's network in plain float64: standardise, each member's dense layers with ReLU between, average."""
    x = (vectors - np.array(entry["mean"])) / np.array(entry["scale"])
    outputs = []
    for member in entry["members"]:
        h = x
        for k, layer in enumerate(member["layers"]):
            h = h @ np.array(layer["weight"]).T + np.array(layer["bias"])
            h = np.maximum(h, 0) if k < len(member["layers"]) - 1 else h
        outputs.append(h[:, 0])
    return np.mean(outputs, axis=0)


@pytest.mark.parametrize("n", [1, 33])
def test_the_network_agrees_with_plain_float64_for_members_of_any_shape(n: int) -> None:
    rng = np.random.default_rng(n)
    width = 40

    def layer(out: int, given: int) -> dict[str, Any]:
        return {"weight": rng.normal(0, given**-0.5, (out, given)).tolist(), "bias": rng.normal(0, 0.5, out).tolist()}

    shapes = [(16, 8, 1), (5, 1), (1,), (128, 128, 1)]  # hidden widths and depths differ, one member is linear
    entry = {
        "inputs": ["poses"],
        "mean": rng.uniform(-300, 300, width).tolist(),
        "scale": rng.uniform(0.05, 50, width).tolist(),
        "members": [{"layers": [layer(o, i) for i, o in zip((width, *s[:-1]), s, strict=True)]} for s in shapes],
    }
    vectors = np.array(entry["mean"]) + np.array(entry["scale"]) * rng.normal(0, 3, (n, width))
    vectors[::4] *= rng.uniform(-2, 2, width)  # some far outside the fitted spread, up to a few hundred
    expected = reference_network(entry, vectors)
    got = PatternNetwork.from_card(entry)(vectors)
    assert got.dtype == np.float64 and got.shape == (n,)
    np.testing.assert_allclose(got, expected, rtol=1e-4, atol=1e-4)
    entry["members"][1]["layers"][1]["weight"][0][0] = 1e39  # beyond float32: computed in float64 instead
    np.testing.assert_allclose(PatternNetwork.from_card(entry)(vectors), reference_network(entry, vectors), rtol=1e-12)


@pytest.mark.parametrize("card", ["capsnet-mnist", "capsnet-em-mnist"])
def test_an_image_gets_the_same_pattern_bits_in_any_batch(card: str) -> None:
    """The served network pads each call to whole blocks of rows, so an image's bits do not depend on the rows
    beside it (BLAS sums a row in an order that depends on the rows of the call)."""
    from threadpoolctl import threadpool_limits

    card_file = Path(__file__).parents[3] / "model" / "zoo" / card / "model.json"
    net = PatternNetwork.from_card(json.loads(card_file.read_text())["ood"]["network"])
    vectors = np.random.default_rng(0).normal(size=(70, net.width)) * net.scale + net.mean
    with threadpool_limits(limits=1, user_api="blas"):  # as the server runs it
        whole = net(vectors)
        for n in [*range(1, 20), 33, 64, 70]:
            np.testing.assert_array_equal(net(vectors[:n]), whole[:n], err_msg=f"a batch of {n}")
        for start in (1, 5, 13):
            np.testing.assert_array_equal(net(vectors[start : start + 3]), whole[start : start + 3])


def calibration_entry() -> dict[str, Any]:
    return {
        "reference": {"n": 10},
        "levels": [0.0, 0.5, 1.0],
        "features": [
            {"name": "pattern", "tail": "upper", "values": [-4.0, -2.0, 0.0]},
            {"name": "winning_score", "tail": "lower", "values": [0.0, 0.5, 1.0]},
        ],
        "network": network_entry(),
        "combiner": {"kind": "logistic", "bias": -1.0, "weights": {"pattern": 1.5, "winning_score": 0.5}},
        "threshold": 2.0,
    }


def test_the_pattern_feature_enters_the_score_and_one_image_scores_as_in_a_batch() -> None:
    calibration = OODCalibration.from_card(calibration_entry())
    assert calibration.needs_poses and calibration.needs_reconstruction
    images, scores, poses, reconstruction = batch(8, seed=5)
    features = calibration.measure(images, scores, reconstruction, poses)
    assert calibration.network is not None
    np.testing.assert_allclose(features["pattern"], calibration.network.pattern(images, scores, poses, reconstruction))
    cdf = np.interp(features["pattern"], [-4.0, -2.0, 0.0], [0.0, 0.5, 1.0])
    win = np.interp(scores.max(axis=1), [0.0, 0.5, 1.0], [0.0, 0.5, 1.0])
    expected = -1.0 + 1.5 * -np.log(np.maximum(1 - cdf, 0.05)) + 0.5 * -np.log(np.maximum(win, 0.05))
    score, accepted = calibration.assess(images, scores, reconstruction, poses)
    np.testing.assert_allclose(score, expected, rtol=1e-9)
    np.testing.assert_array_equal(accepted, expected <= 2.0)
    for i in range(len(images)):
        one = slice(i, i + 1)
        alone, _ = calibration.assess(images[one], scores[one], reconstruction[one], poses[one])
        assert alone[0] == pytest.approx(score[i], rel=1e-9)  # the combination is summed in another order alone
    parts = calibration.parts(features)[0]
    assert [p.name for p in parts] == ["pattern", "winning_score"]
    assert parts[0].contribution == pytest.approx(1.5 * -np.log(max(1 - cdf[0], 0.05)))
    assert OODPart("pattern", 3.0, 0.001, 9.0).says("2") == (
        "the capsules' lengths, poses and routing together look like a non-digit's, not a 2's: "
        "0.10% of training digits are as extreme"
    )


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (lambda o: o["network"].update(inputs=["scores", "colour"]), "network inputs"),
        (lambda o: o["network"].update(inputs=[]), "network inputs"),
        (lambda o: o["network"]["scale"].__setitem__(0, 0.0), "scale above 0"),
        (lambda o: o["network"]["scale"].__setitem__(0, float("inf")), "finite"),
        (lambda o: (o["network"]["mean"].pop(), o["network"]["scale"].pop()), "weight must be"),
        (
            lambda o: o["network"]["members"][1]["layers"][1].update(weight=[[1.0] * 5] * 2, bias=[0.0, 0.0]),
            "one number",
        ),
        (lambda o: o["network"]["members"][0]["layers"][0]["bias"].__setitem__(0, float("nan")), "finite"),
        (lambda o: o["network"].update(members=[]), "at least one member"),
        (lambda o: o.pop("network"), "come together"),
        (lambda o: o["features"].pop(0) and o["combiner"]["weights"].pop("pattern"), "come together"),
    ],
)
def test_a_malformed_network_is_refused_with_its_reason(change: Any, message: str) -> None:
    entry = copy.deepcopy(calibration_entry())
    change(entry)
    with pytest.raises(ValueError, match=message):
        OODCalibration.from_card(entry)


def test_a_network_of_another_width_names_both_widths() -> None:
    network = PatternNetwork.from_card(network_entry())
    images, scores, poses, _ = batch(2)
    with pytest.raises(ValueError, match=f"takes {network.width} numbers"):
        network(capsule_vector(("poses",), images, scores, poses, None))


def test_a_card_whose_network_does_not_fit_the_models_outputs_is_a_card_error(model_repository: Path) -> None:
    from service.runtime.card import CardError, parse_card
    from tests.service.conftest import TINY

    card = json.loads((model_repository / TINY / "model.json").read_text())
    shapes = {o["role"]: o["shape"][1:] for o in card["outputs"]}
    k, pose = shapes["scores"][0], int(np.prod(shapes["poses"]))
    inputs = ("scores", "ranked_scores", "poses", "ink", "distance")
    entry = {**calibration_entry(), "network": network_entry(inputs)}
    width = k + RANKED + pose + 1 + 2
    rng = np.random.default_rng(0)
    entry["network"].update(mean=[0.0] * width, scale=[1.0] * width)
    for member in entry["network"]["members"]:
        member["layers"][0]["weight"] = rng.normal(size=(5, width)).tolist()
    parse_card({**card, "ood": entry})  # fits: parses
    narrow = copy.deepcopy(entry)
    narrow["network"].update(mean=[0.0] * (width - 1), scale=[1.0] * (width - 1))
    for member in narrow["network"]["members"]:
        member["layers"][0]["weight"] = rng.normal(size=(5, width - 1)).tolist()
    with pytest.raises(CardError, match=f"takes {width - 1} numbers per image, but this model's outputs give {width}"):
        parse_card({**card, "ood": narrow})
    huge = copy.deepcopy(card)  # the width is counted, never allocated: a huge declared input costs nothing
    huge["input"]["shape"] = [-1, 1, 1_000_000, 1_000_000]
    for output in huge["outputs"]:
        if output["role"] == "reconstruction":
            output["shape"] = huge["input"]["shape"]
    with pytest.raises(CardError, match=f"takes {width - 1} numbers per image, but this model's outputs give {width}"):
        parse_card({**huge, "ood": narrow})
    no_decoder = {**card, "outputs": [o for o in card["outputs"] if o["role"] != "reconstruction"], "ood": entry}
    with pytest.raises(CardError, match="reconstruction"):
        parse_card(no_decoder)
    reads_parts = copy.deepcopy(entry)  # the tiny dynamic model has a routing map but no parts output
    reads_parts["network"]["inputs"] = [*inputs, "parts"]
    with pytest.raises(CardError, match="needs the model's parts output"):
        parse_card({**card, "ood": reads_parts})


@pytest.mark.parametrize(
    "inputs", [("scores",), ("ranked_scores", "ink"), ("poses", "distance"), VECTOR_INPUTS, ("ink", "scores")]
)
@pytest.mark.parametrize("k", [1, 2, 3, 10])
def test_the_counted_width_is_that_of_the_vector(inputs: tuple[str, ...], k: int) -> None:
    rng = np.random.default_rng(k)
    images, reconstruction = rng.random((2, 1, 4, 4)), rng.random((2, 1, 4, 4))
    explanation, parts = rng.random((2, k, 3, 3)), rng.random((2, 4, 2))
    vector = capsule_vector(
        inputs, images, rng.random((2, k)), rng.normal(size=(2, k, 2, 2)), reconstruction, explanation, parts
    )
    maps = {"explanation": k * 9, "parts": 8}
    assert vector_width(inputs, k, 4, has_reconstruction=True, maps=maps) == vector.shape[1]
    for name in ("explanation", "parts"):
        if name in inputs:
            with pytest.raises(ValueError, match=f"needs the model's {name} output"):
                vector_width(inputs, k, 4, True, {n: v for n, v in maps.items() if n != name})
    if "distance" in inputs:
        with pytest.raises(ValueError, match="reconstruction"):
            vector_width(inputs, k, 4, has_reconstruction=False, maps=maps)
    with pytest.raises(ValueError, match="unknown network input 'colour'"):
        vector_width((*inputs, "colour"), k, 4, has_reconstruction=True)

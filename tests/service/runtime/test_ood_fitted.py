"""The fitted "not a digit" score: class Gaussians, the routing share, the logistic combiner and its parts."""

from __future__ import annotations

import copy
from typing import Any

import numpy as np
import pytest

from service.runtime.ood import FEATURE_TAILS, ClassGaussian, OODCalibration, OODPart, Veto, image_features

K, D = 3, 4


def card_ood() -> dict[str, Any]:
    """A hand-made fitted `ood` object: two features, one a pose Gaussian, combined with weights 2 and 0.5."""
    levels = [0.0, 0.5, 1.0]
    return {
        "reference": {"n": 10},
        "levels": levels,
        "features": [
            {"name": "pose_distance", "tail": "upper", "values": [0.0, 1.0, 2.0]},
            {"name": "winning_score", "tail": "lower", "values": [0.0, 0.5, 1.0]},
        ],
        "gaussians": {
            "pose_distance": {
                "output": "poses",
                "means": np.arange(K * D, dtype=float).reshape(K, D).tolist(),
                "whitening": (2.0 * np.eye(D)).tolist(),
            }
        },
        "combiner": {"kind": "logistic", "bias": -1.0, "weights": {"pose_distance": 2.0, "winning_score": 0.5}},
        "threshold": 1.5,
    }


def test_the_pose_distance_is_the_mahalanobis_distance_to_the_predicted_class_mean() -> None:
    rng = np.random.default_rng(0)
    means = rng.normal(size=(K, D))
    covariance = np.cov(rng.normal(size=(D, 50))) + np.eye(D)
    whitening = np.linalg.inv(np.linalg.cholesky(covariance))
    gaussian = ClassGaussian("poses", means, whitening)
    scores = rng.random((5, K))
    poses = rng.normal(size=(5, K, 2, 2))
    got = gaussian.distance(scores, poses)
    for i in range(5):
        c = int(scores[i].argmax())
        delta = poses[i, c].reshape(-1) - means[c]
        assert got[i] == pytest.approx(np.sqrt(delta @ np.linalg.inv(covariance) @ delta))
    on_scores = ClassGaussian("scores", means[:, :K], np.eye(K)).distance(scores, None)
    np.testing.assert_allclose(on_scores, np.linalg.norm(scores - means[scores.argmax(axis=1), :K], axis=1))


def test_the_routing_share_is_the_winning_class_share_of_the_map() -> None:
    images = np.zeros((2, 1, 4, 4), np.float32)
    scores = np.array([[0.1, 0.9, 0.2], [0.8, 0.1, 0.1]], np.float32)
    explanation = np.ones((2, K, 2, 2), np.float32)
    explanation[0, 1] = 2.0  # class 1 holds 8 of 16
    features = image_features(images, scores, None, explanation)
    np.testing.assert_allclose(features["routing_share"], [0.5, 1 / 3])
    assert "routing_share" not in image_features(images, scores, None)


def outputs(n: int, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    images = rng.random((n, 1, 4, 4)).astype(np.float32)
    scores = rng.random((n, K)).astype(np.float32)
    poses = rng.normal(4, 2, (n, K, D)).astype(np.float32)
    return images, scores, poses


def test_the_score_is_the_combiners_weighted_sum_of_surprises_and_the_parts_add_up_to_it() -> None:
    calibration = OODCalibration.from_card(card_ood())
    assert calibration.needs_poses and not calibration.needs_reconstruction and not calibration.needs_explanation
    images, scores, poses = outputs(6, np.random.default_rng(1))
    features = calibration.measure(images, scores, None, poses)
    winner = scores.argmax(axis=1)
    distance = 2.0 * np.linalg.norm(poses[np.arange(6), winner] - np.arange(K * D).reshape(K, D)[winner], axis=1)
    np.testing.assert_allclose(features["pose_distance"], distance, rtol=1e-6)
    floor = 0.5 / 10
    cdf_pose = np.interp(distance, [0.0, 1.0, 2.0], [0.0, 0.5, 1.0])
    cdf_win = np.interp(scores.max(axis=1), [0.0, 0.5, 1.0], [0.0, 0.5, 1.0])
    expected = -1.0 + 2.0 * -np.log(np.maximum(1 - cdf_pose, floor)) + 0.5 * -np.log(np.maximum(cdf_win, floor))
    score, accepted = calibration.assess(images, scores, None, poses)
    np.testing.assert_allclose(score, expected, rtol=1e-9)
    np.testing.assert_array_equal(accepted, expected <= 1.5)
    for i, parts in enumerate(calibration.parts(features)):
        assert [p.name for p in parts] == ["pose_distance", "winning_score"]
        assert sum(p.contribution for p in parts) - 1.0 == pytest.approx(score[i])
        assert parts[0].tail_share == pytest.approx(max(1 - cdf_pose[i], floor))
    alone = calibration.assess(images[:1], scores[:1], None, poses[:1])[0]
    assert alone[0] == pytest.approx(score[0])


def test_the_parts_speak_in_words() -> None:
    unusual = OODPart("pose_distance", 9.0, 0.0002, 17.0)
    assert unusual.says("4") == "the pose is unlike any 4 in training: 0.02% of training digits are as extreme"
    somewhat = OODPart("relative_distance", 0.66, 0.0149, 2.8)
    assert somewhat.says("4") == (
        "the reconstruction from the 4 capsule misses much of the ink, somewhat: "
        "1.49% of training digits are as extreme"
    )
    usual = OODPart("margin", 0.5, 0.4, 0.9)
    assert usual.says("4") == "margin as for digits: 40.00% of training digits are as extreme"
    assert OODPart("ink", 1.0, 1e-6, 1.0).says("7").endswith("under 0.01% of training digits are as extreme")
    assert set(FEATURE_TAILS) >= {"pose_distance", "scores_distance", "routing_share"}


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (lambda o: o["combiner"]["weights"].pop("winning_score"), "combiner weights .* must be those of the features"),
        (lambda o: o.pop("gaussians"), r"features \['pose_distance'\] need their gaussians"),
        (lambda o: o["gaussians"]["pose_distance"].update(output="scores"), "must measure output 'poses'"),
        (lambda o: o["gaussians"]["pose_distance"].update(whitening=[[1.0]]), "whitening DxD finite"),
        (lambda o: o["combiner"].update(bias=float("nan")), "must be finite"),
        (lambda o: o["combiner"].update(kind="forest"), "must be a logistic regression"),
    ],
)
def test_a_malformed_fitted_calibration_is_refused(change: Any, message: str) -> None:
    ood = copy.deepcopy(card_ood())
    change(ood)
    with pytest.raises(ValueError, match=message):
        OODCalibration.from_card(ood)


def test_a_lone_image_scores_as_in_a_batch_with_every_kind_of_feature() -> None:
    ood = card_ood()
    ood["features"] += [
        {"name": "scores_distance", "tail": "upper", "values": [0.0, 0.5, 3.0]},
        {"name": "routing_share", "tail": "lower", "values": [0.0, 0.3, 1.0]},
        {"name": "distance", "tail": "upper", "values": [0.0, 2.0, 4.0]},
    ]
    ood["gaussians"]["scores_distance"] = {
        "output": "scores",
        "means": np.eye(K).tolist(),
        "whitening": np.eye(K).tolist(),
    }
    ood["combiner"]["weights"].update(scores_distance=0.7, routing_share=0.3, distance=0.1)
    calibration = OODCalibration.from_card(ood)
    rng = np.random.default_rng(2)
    images, scores, poses = outputs(5, rng)
    reconstruction = rng.random(images.shape).astype(np.float32)
    explanation = rng.random((5, K, 2, 2)).astype(np.float32)
    batch, _ = calibration.assess(images, scores, reconstruction, poses, explanation)
    for i in range(5):
        one = slice(i, i + 1)
        alone = calibration._score_one(images[one], scores[one], reconstruction[one], poses[one], explanation[one])
        assert alone is not None and alone[0] == pytest.approx(batch[i], abs=1e-12)
    scores[0, 0] = np.nan  # not finite: the batch arithmetic decides
    assert calibration._score_one(images[:1], scores[:1], reconstruction[:1], poses[:1], explanation[:1]) is None


def vetoed_card() -> dict[str, Any]:
    """card_ood with the margin as a third feature and a veto on it: margins of at most 0.1 score at least 4."""
    ood = card_ood()
    ood["features"].append({"name": "margin", "tail": "lower", "values": [0.0, 0.3, 1.0]})
    ood["combiner"]["weights"]["margin"] = 0.25
    ood["veto"] = {"feature": "margin", "at_most": 0.1, "score": 4.0, "rule": "a hand-made cut"}
    return ood


def test_the_misread_veto_refuses_a_hardly_won_reading_and_its_margin_part_carries_the_lift() -> None:
    calibration = OODCalibration.from_card(vetoed_card())
    assert calibration.veto == Veto("margin", 0.1, 4.0)
    plain = OODCalibration.from_card({k: v for k, v in vetoed_card().items() if k != "veto"})
    rng = np.random.default_rng(3)
    images, scores, poses = outputs(40, rng)
    poses[:20] = np.arange(K * D, dtype=np.float32).reshape(K, D) + rng.normal(0, 0.1, (20, K, D))  # near the means
    scores[:10, 1] = scores[:10, 0] + rng.uniform(0.0, 0.1, 10)  # class 1 wins by at most 0.1 ...
    scores[:10, 2] = 0.0
    scores[10:20, 1] = scores[10:20, 0] + rng.uniform(0.11, 0.2, 10)  # ... or by a little more
    scores[10:20, 2] = 0.0
    features = calibration.measure(images, scores, None, poses)
    vetoed = features["margin"] <= 0.1
    assert vetoed[:10].all() and not vetoed[10:20].any()
    base, _ = plain.assess(images, scores, None, poses)
    score, accepted = calibration.assess(images, scores, None, poses)
    np.testing.assert_array_equal(score, np.where(vetoed, np.maximum(base, 4.0), base))
    assert not accepted[vetoed].any() and (score[~vetoed] == base[~vetoed]).all()
    assert (base[:10] < 4.0).all() and accepted[10:20].any()  # the veto lifts them: their parts alone accept some
    for i, parts in enumerate(calibration.parts(features)):
        assert sum(p.contribution for p in parts) - 1.0 == pytest.approx(score[i])  # the parts still add up
        without = {p.name: p.contribution for p in plain.parts(features)[i]}
        lift = {p.name: p.contribution - without[p.name] for p in parts}
        assert lift["margin"] == pytest.approx(score[i] - base[i]) and lift["pose_distance"] == 0.0
        one = slice(i, i + 1)
        assert calibration.assess(images[one], scores[one], None, poses[one])[0][0] == pytest.approx(score[i])


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (lambda o: o["veto"].update(feature="pose_distance"), "must be one that is low away from digits"),
        (lambda o: o["veto"].update(score=1.5), "the score above the threshold"),
        (lambda o: o["veto"].update(at_most=float("inf")), "must be finite"),
        (lambda o: o["veto"].update(feature="routing_share"), "must be one of the features"),
    ],
)
def test_a_malformed_veto_is_refused(change: Any, message: str) -> None:
    ood = vetoed_card()
    change(ood)
    with pytest.raises(ValueError, match=message):
        OODCalibration.from_card(ood)

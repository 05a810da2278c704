"""Fitting the "not a digit" score: class Gaussians, the combiner, the held-out split, the sets and the CLI."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest

from service.runtime.ood import OODCalibration
from tests.conftest import write_mnist_dir
from training.ood import calibrate as ood
from training.ood import choice, nondigits
from training.ood import edges as ood_edges
from training.ood import fitted as ood_fitted
from training.ood.nondigits import TEST_SETS, VALIDATION_SETS, FontMissing, font_paths, make_set, rotated_digits


def fonts_present() -> bool:
    try:
        font_paths()
    except FontMissing:
        return False
    return all((nondigits.FONT_DIR / name).is_file() for name in nondigits.VARIED_FONT_FILES)


needs_fonts = pytest.mark.skipif(
    not fonts_present(), reason="the fitting sets need fonts-dejavu-core and fonts-dejavu-extra"
)


@pytest.fixture
def dejavu_for_held_out(monkeypatch: pytest.MonkeyPatch) -> None:
    """The validation and test sets drawn with the DejaVu fonts: the suite needs no more than fonts-dejavu-core.
    DejaVu has no Bengali, Tamil, Khmer or CJK glyph, so "other scripts" are Arabic letters here."""
    monkeypatch.setattr(nondigits, "held_out_fonts", lambda names: font_paths())
    monkeypatch.setitem(nondigits.TEST_SETS, "other_scripts", nondigits._fonts_set("بتثجحخ", ()))


@pytest.fixture
def tiny_mnist(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """Tiny MNIST files (120 training and 64 test images), with tmp_path as the working directory."""
    monkeypatch.chdir(tmp_path)
    return write_mnist_dir(tmp_path / "mnist", n_train=120, n_test=64)


def tiny_fit(model: Path, data: Path) -> list[str]:
    """capsnet-ood arguments that fit the tiny model on the tiny MNIST files in seconds."""
    args = ["--model", str(model), "--data-dir", str(data), "--reference", "60", "--combiner", "24"]
    args += ["--val-split", "20", "--validation", "20", "--per-set", "3", "--percentile", "90"]
    args += ["--network-digits", "30", "--network-per-set", "4", "--network-turned", "12", "--network-hidden", "16"]
    return args


def own_copy(model: Path, tmp_path: Path) -> Path:
    """The tiny model copied under tmp_path, so a test may write its card."""
    return Path(shutil.copytree(model, tmp_path / "tiny"))


def test_the_whitening_gives_the_mahalanobis_distance_of_the_shared_covariance() -> None:
    rng = np.random.default_rng(0)
    labels = np.repeat(np.arange(3), 200)
    vectors = rng.normal(size=(600, 4)) @ np.array([[2, 0, 0, 0], [1, 1, 0, 0], [0, 0, 3, 0], [0, 0, 1, 0.5]])
    vectors += np.array([[0, 0, 0, 0], [5, 0, 0, 0], [0, 5, 0, 0]])[labels]
    entry = ood_fitted.gaussian_entry(vectors, labels, 3, "scores")
    means = np.asarray(entry["means"])
    np.testing.assert_allclose(means[1], vectors[labels == 1].mean(axis=0))
    centred = vectors - means[labels]
    covariance = centred.T @ centred / len(vectors)
    covariance += ood_fitted.SHRINKAGE * np.trace(covariance) / 4 * np.eye(4)
    w = np.asarray(entry["whitening"])
    np.testing.assert_allclose(w.T @ w, np.linalg.inv(covariance), rtol=1e-9, atol=1e-12)
    with pytest.raises(ValueError, match=r"no digit of class \[3\]; give a larger --reference"):
        ood_fitted.gaussian_entry(vectors, labels, 4, "scores")


def test_the_combiner_separates_with_non_negative_weights() -> None:
    rng = np.random.default_rng(0)
    digits = rng.exponential(1.0, (400, 3))
    outliers = rng.exponential(1.0, (400, 3)) + np.array([3.0, 0.0, 0.0])  # only the first feature tells
    outliers[:, 2] = rng.exponential(0.2, 400)  # the third is lower for outliers: it must not count against them
    bias, weights = ood_fitted.fit_logistic(digits, outliers)
    assert weights[0] > 1.0 and weights[2] == 0.0 and (weights >= 0).all()
    logit = bias + np.concatenate([digits, outliers]) @ weights
    assert ood.auroc(logit[400:], logit[:400]) > 0.95


def test_the_held_out_images_are_those_capsnet_train_held_out() -> None:
    from training.data.mnist import MNISTSplit
    from training.fitting.train import hold_out

    split = MNISTSplit(np.zeros((50, 1, 2, 2), np.uint8), np.arange(50))
    trained, held = ood_fitted.held_out(50, 10, seed=3)
    kept, validation = hold_out(split, 10, 3)
    assert validation is not None
    np.testing.assert_array_equal(split.labels[held], validation.labels)
    np.testing.assert_array_equal(split.labels[trained], kept.labels)
    card = {"training": {"command": "capsnet-train --val-split 5000 --seed 1", "seed": 1}}
    assert ood_fitted.training_split(card) == (5000, 1) and ood_fitted.training_split({}) == (0, 0)


def test_turned_digits_leave_out_those_that_stay_digits() -> None:
    images = np.arange(10 * 4, dtype=np.uint8).reshape(10, 1, 2, 2)
    labels = np.arange(10)
    quarter = rotated_digits(images, labels, 1)
    assert len(quarter) == 7 and np.array_equal(quarter[0, 0], np.rot90(images[2, 0]))
    assert len(rotated_digits(images, labels, 2)) == 5  # 0, 1, 8 and 6, 9 (each other's turn) left out


@needs_fonts
@pytest.mark.usefixtures("dejavu_for_held_out")
@pytest.mark.parametrize(("role", "names"), [("validation", VALIDATION_SETS), ("test", TEST_SETS)])
def test_validation_and_test_sets_are_seeded_and_differ_from_the_fitting_sets(role: str, names: dict) -> None:
    for name in names:
        a = make_set(name, 3, seed=0, role=role)
        assert a.shape == (3, 1, 28, 28) and a.min() >= 0 and a.max() <= 1
        np.testing.assert_array_equal(a, make_set(name, 3, seed=0, role=role))
        if name in nondigits.NONDIGIT_SETS and name != "blank":
            assert not np.array_equal(a, make_set(name, 3, seed=0))  # another random stream than the fitting set's


def test_missing_held_out_fonts_name_the_packages(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setattr(nondigits, "FONT_ROOT", tmp_path)
    with pytest.raises(FontMissing, match=r"sets need Debian's fonts-liberation; missing .*Sans-Regular\.ttf and 3"):
        make_set("letters", 1, seed=0, role="validation")
    with pytest.raises(
        FontMissing, match="need Debian's fonts-adf-ikarius fonts-aenigma fonts-georgewilliams fonts-konatu fonts"
    ):
        make_set("letters", 1, seed=0, role="test")
    with pytest.raises(FontMissing, match="need Debian's fonts-manchufont fonts-noto-core; missing"):
        make_set("other_scripts", 1, seed=0, role="test")
    with pytest.raises(FontMissing, match="need Debian's culmus fonts-3270 fonts-adf-accanthis fonts-adf-berenis fon"):
        make_set("font_letters", 1, seed=0)
    with pytest.raises(ValueError, match="unknown validation non-digit set 'noise'"):
        make_set("noise", 1, seed=0, role="validation")


@needs_fonts
@pytest.mark.usefixtures("dejavu_for_held_out")
def test_cli_fits_chooses_on_validation_writes_the_card_and_reports_beside_the_previous_score(
    tiny_model: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    data = write_mnist_dir(tmp_path / "mnist", n_train=120, n_test=64)
    report_file, cache = tmp_path / "ood.json", tmp_path / "cache"
    args = [*tiny_fit(tiny_model, data), "--cache", str(cache)]
    assert ood.main([*args, "--method", "darccc", "--write-card", "--json", str(report_file)]) == 0
    previous = json.loads((tiny_model / "model.json").read_text())["ood"]
    assert ood.main([*args, "--write-card", "--json", str(report_file)]) == 0
    report = json.loads(report_file.read_text())
    assert set(report["sets"]) == set(TEST_SETS) | {"digits_turned_90", "digits_turned_180"}
    assert set(report["previous"]["sets"]) == set(report["sets"]) and report["previous"]["threshold"] == pytest.approx(
        previous["threshold"]
    )
    assert report["chosen"].split(", misread veto")[0] in ood_fitted.CANDIDATES
    fitting = report["fitting"]["non_digits"]
    assert fitting["varied_letters"] == 3 and 0 < fitting["turned_training_digits"] <= 4  # the combiner's
    network = report["fitting"]["network_non_digits"]  # other images of the same sets: the network's own
    assert network["varied_letters"] == 4 and 0 < network["turned_training_digits"] <= 12
    assert report["fitting"]["network"].startswith("54 digits against")  # 30 training and 24 unseen test digits
    assert report["fitting"]["combiner_digits"].startswith("the 20 MNIST training images the model held out")
    offered = set(report["validation"]["candidates"])  # each, and with the misread veto where it has the margin
    assert (
        set(ood_fitted.CANDIDATES)
        <= offered
        <= set(ood_fitted.CANDIDATES)
        | {
            choice.veto_label(label, share)
            for label, names in ood_fitted.CANDIDATES.items()
            if "margin" in names
            for share in choice.VETO_SHARES
        }
    )
    for label, row in report["validation"]["candidates"].items():  # each veto cut on the network's unseen digits
        assert ("veto" in row) == ("misread veto" in label)
        if "veto" in row:
            assert "MNIST test digits drawn for the network" in row["veto"]["rule"]
    validation = report["validation"]  # the previous score on the same validation digits guards the accuracy
    assert validation["previous"]["digits"]["n"] == 20 and set(validation["previous"]["sets"]) >= {"letters"}
    guard = validation["accuracy_guard"]
    assert guard["previous_accuracy_accepted"] == validation["previous"]["digits"]["accuracy_accepted"]
    assert f"the {validation['percentile']:g}th percentile" in report["threshold_rule"]
    assert all(c["tighter"] == {} for c in validation["candidates"].values())  # 90 is below the 99% promise
    card = json.loads((tiny_model / "model.json").read_text())["ood"]
    calibration = OODCalibration.from_card(card)
    assert calibration.combiner is not None and card["threshold"] == report["threshold"]
    assert set(card["gaussians"]) == {"pose_distance", "scores_distance"} & set(report["features"])
    assert "20 MNIST test digits drawn at random (seed 0) as the validation" in card["threshold_rule"]
    assert card["digit_split"] == {"seed": 0, "combiner": 24, "validation": 20}
    assert report["mnist_test"]["n"] == 20  # the test digits neither the combiner nor the validation drew
    assert any(cache.iterdir())  # the model's outputs kept for the next run
    printed = capsys.readouterr().out
    assert "| letters | 3 |" in printed and "previous AUROC" in printed

    edges = tmp_path / "edges.json"  # a pair either side of the card's threshold, for the tests
    model, chars = ood_fitted.ModelOutputs(tiny_model), ood_edges.EDGE_DIGITS + ood_edges.EDGE_OTHERS
    typeset = np.stack([ood_edges.typeset(c) for c in chars]).astype(np.float32).reshape(-1, 1, 28, 28) / 255
    scores = ood_fitted.scores_of(calibration, model.run(typeset), typeset)
    digits, letters = scores[: len(ood_edges.EDGE_DIGITS)], scores[len(ood_edges.EDGE_DIGITS) :]
    assert digits.min() < letters.max()

    def with_threshold(threshold: float) -> None:
        card["threshold"] = threshold
        if "veto" in card:  # a vetoed image still scores above the threshold
            card["veto"]["score"] = threshold + 1.0
        whole = json.loads((tiny_model / "model.json").read_text())
        (tiny_model / "model.json").write_text(json.dumps({**whole, "ood": card}))

    with_threshold(float(scores.min()) - 1.0)  # every typeset digit rejected: no pair
    assert ood.main(["--model", str(tiny_model), "--write-edges", str(edges)]) == 2
    assert "no typeset digit of 4712309568 is accepted and letter of HAKXTPE rejected" in capsys.readouterr().err
    with_threshold(float(digits.min() + letters.max()) / 2)
    assert ood.main(["--model", str(tiny_model), "--write-edges", str(edges)]) == 0
    pair = json.loads(edges.read_text())["tiny"]
    assert pair["threshold"] == card["threshold"]
    assert pair["below"]["ood_score"] <= card["threshold"] < pair["above"]["ood_score"]
    assert set(pair["below"]["parts"]) == set(report["features"]) and len(pair["above"]["pixels"]) == 28
    assert ("veto" in pair) == ("veto" in card)  # a veto pair exactly when the card has a veto


def test_cli_refuses_more_images_than_there_are(
    tiny_model: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    data = write_mnist_dir(tmp_path / "mnist", n_train=64, n_test=8)
    args = ["--model", str(tiny_model), "--data-dir", str(data), "--val-split", "10"]
    assert ood.main([*args, "--reference", "60"]) == 2
    assert "--reference 60 must be between 1 and the 54 trained images" in capsys.readouterr().err
    assert ood.main([*args, "--reference", "50", "--combiner", "4", "--validation", "4"]) == 2
    assert (
        "--combiner 4 + --validation 4 must be positive and leave some of the 8 test digits" in capsys.readouterr().err
    )


@needs_fonts
@pytest.mark.usefixtures("dejavu_for_held_out")
def test_cli_without_json_writes_its_report_under_runs_never_into_the_docs(
    tiny_model: Path, tmp_path: Path, tiny_mnist: Path
) -> None:
    data = tiny_mnist
    args = ["--model", str(tiny_model), "--data-dir", str(data), "--reference", "60", "--method", "darccc"]
    assert ood.main([*args, "--percentile", "90", "--per-set", "3"]) == 0
    assert (tmp_path / "runs" / "ood" / f"{tiny_model.name}.json").is_file()
    assert not (tmp_path / "docs").exists()


def test_the_choice_takes_the_best_worst_set_and_among_near_ties_the_most_features() -> None:
    def row(worst: float, mean: float, n: int) -> dict:
        return {"worst_rejected": worst, "mean_rejected": mean, "features": ["f"] * n}

    assert choice.choose({"a": row(0.90, 0.95, 1), "b": row(0.80, 0.99, 9)}) == "a"
    assert choice.choose({"a": row(0.90, 0.95, 1), "b": row(0.895, 0.93, 9)}) == "b"  # within the margin
    assert choice.choose({"a": row(0.90, 0.95, 9), "b": row(0.90, 0.96, 9)}) == "b"  # then the mean


def test_the_guarded_choice_keeps_the_previous_scores_accuracy_at_the_loosest_threshold() -> None:
    def row(worst: float, accuracy: float | None) -> dict:
        return {"worst_rejected": worst, "mean_rejected": worst, "digits": {"accuracy_accepted": accuracy}}

    def candidate(n: int, *rows: dict) -> dict:
        return {"features": ["f"] * n, "percentile": 99.3, **rows[0],
                "tighter": {"99.2": rows[1], "99.1": rows[2]}}  # fmt: skip

    a = candidate(1, row(0.90, 0.9970), row(0.91, 0.9975), row(0.92, 0.9990))
    b = candidate(9, row(0.895, 0.9980), row(0.90, 0.9985), row(0.91, 0.9990))  # as strong as a (within the margin)
    weak = candidate(9, row(0.80, 0.9999), row(0.81, 0.9999), row(0.82, 0.9999))  # reads digits best, detects worst
    assert choice.choose_guarded({"a": a, "b": b}, None) == ("b", 99.3)  # no previous score: `choose`
    assert choice.choose_guarded({"a": a, "b": b}, 0.9970) == ("b", 99.3)  # both keep it at their own percentile
    assert choice.choose_guarded({"a": a, "b": b}, 0.9980) == ("b", 99.3)  # only b keeps it at 99.3
    assert choice.choose_guarded({"a": a}, 0.9975) == ("a", 99.2)  # a threshold 0.1 point tighter keeps it
    assert choice.choose_guarded({"a": a, "b": b}, 0.9990) == ("b", 99.1)  # both at 99.1: `choose` between them
    assert choice.choose_guarded({"a": a, "b": b}, 0.9999) == ("b", 99.3)  # none keeps it: as unguarded
    assert choice.choose_guarded({"a": a, "weak": weak}, 0.9980) == ("a", 99.1)  # never a much weaker detector
    assert choice.choose_guarded({"a": a, "weak": weak}, 0.9995) == ("weak", 99.3)  # unless only it keeps it
    none_accepted = candidate(1, row(1.0, None), row(1.0, None), row(1.0, None))
    assert choice.choose_guarded({"a": none_accepted}, 0.5) == ("a", 99.3)


def test_the_veto_cut_and_the_threshold_that_accepts_the_same_share_with_it() -> None:
    scores = np.zeros((1000, 3))
    scores[:, 0] = 1.0
    scores[:, 1] = 1.0 - np.linspace(0.001, 1.0, 1000)  # margins 0.001, 0.002, ..., 1.0
    assert choice.veto_cut(scores, 0.003) == pytest.approx(np.quantile(np.linspace(0.001, 1.0, 1000), 0.003))
    assert choice.veto_label("all", 0.003) == "all, misread veto 0.3%"
    rng = np.random.default_rng(0)
    validation = rng.normal(size=1000)
    vetoed = np.zeros(1000, bool)
    vetoed[rng.choice(1000, 4, replace=False)] = True
    threshold = choice.threshold_with_veto(validation, vetoed, 99.0)
    assert threshold is not None
    assert ((validation <= threshold) & ~vetoed).sum() == 990  # 99% accepted, the vetoed counted as refused
    assert ((validation > threshold) & ~vetoed).sum() == 6  # the veto spends 4 of the 10 refused
    vetoed[:11] = True  # 1.1% vetoed: no threshold keeps 99%
    assert choice.threshold_with_veto(validation, vetoed, 99.0) is None


@needs_fonts
@pytest.mark.usefixtures("dejavu_for_held_out")
def test_confirm_scores_the_served_card_on_the_confirmation_sets_and_changes_nothing(
    tiny_model: Path, tmp_path: Path, tiny_mnist: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    data = tiny_mnist
    tiny_model = own_copy(tiny_model, tmp_path)  # a card of its own, without a calibration
    uncalibrated = {k: v for k, v in json.loads((tiny_model / "model.json").read_text()).items() if k != "ood"}
    (tiny_model / "model.json").write_text(json.dumps(uncalibrated))
    args = ["--model", str(tiny_model), "--data-dir", str(data), "--combiner", "24", "--validation", "20"]
    assert ood.main([*args, "--confirm"]) == 2  # nothing to confirm yet
    assert "has no 'not a digit' calibration to confirm" in capsys.readouterr().err
    calibrate = ["--reference", "60", "--method", "darccc", "--percentile", "90", "--per-set", "3", "--write-card"]
    assert ood.main([*args, *calibrate]) == 0
    card = (tiny_model / "model.json").read_text()
    assert ood.main([*args, "--confirm", "--per-set", "4"]) == 0
    assert (tiny_model / "model.json").read_text() == card
    report = json.loads((tmp_path / "runs" / "ood" / f"{tiny_model.name}-confirmation.json").read_text())
    assert set(report["sets"]) == set(nondigits.CONFIRMATION_SETS) and report["per_set"] == 4
    assert report["mnist_test"]["n"] == 20  # the 64 test digits less the combiner's 24 and the validation's 20
    assert report["threshold"] == json.loads(card)["ood"]["threshold"]
    assert "| handwritten_letters | 4 |" in capsys.readouterr().out


def test_confirmation_fonts_missing_name_their_packages(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setattr(nondigits, "FONT_ROOT", tmp_path)
    with pytest.raises(FontMissing, match="need Debian's fonts-dancingscript fonts-kristi; missing"):
        make_set("handwritten_letters", 1, seed=0, role="confirmation")


@needs_fonts
@pytest.mark.usefixtures("dejavu_for_held_out")
def test_a_tighter_percentile_chosen_on_validation_sets_the_cards_threshold_and_rule(
    tiny_model: Path, tmp_path: Path, tiny_mnist: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    tiny_model = own_copy(tiny_model, tmp_path)
    monkeypatch.setattr(ood_fitted, "TARGET_ACCEPTANCE", 0.5)  # lets the tiny fit's 90th percentile come down
    monkeypatch.setattr(ood_fitted, "choose_guarded", lambda candidates, accuracy: ("all", 89.8))
    report_file = tmp_path / "ood.json"
    assert ood.main([*tiny_fit(tiny_model, tiny_mnist), "--write-card", "--json", str(report_file)]) == 0
    report = json.loads(report_file.read_text())
    tighter = report["validation"]["candidates"]["all"]["tighter"]
    assert set(tighter) == {"89.9", "89.8"} and report["validation"]["percentile"] == 89.8
    card = json.loads((tiny_model / "model.json").read_text())["ood"]
    assert card["threshold"] == tighter["89.8"]["threshold"] == report["threshold"]
    assert card["threshold_rule"].startswith("the 89.8th percentile") and report["chosen"] == "all"


@needs_fonts
@pytest.mark.usefixtures("dejavu_for_held_out")
def test_validation_only_writes_nothing_and_a_test_seed_changes_only_the_test_images(
    tiny_model: Path, tmp_path: Path, tiny_mnist: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    data = tiny_mnist
    tiny_model = own_copy(tiny_model, tmp_path)
    card = (tiny_model / "model.json").read_text()
    args = tiny_fit(tiny_model, data)
    assert ood.main([*args, "--validation-only"]) == 0
    out = capsys.readouterr().out
    assert "validation only, chosen" in out and "| candidate | digits accepted | accuracy on the accepted |" in out
    assert (tiny_model / "model.json").read_text() == card and not (tmp_path / "runs").exists()
    first, second = tmp_path / "seed0.json", tmp_path / "seed7.json"
    assert ood.main([*args, "--json", str(first)]) == 0
    assert ood.main([*args, "--json", str(second), "--test-seed", "7"]) == 0
    a, b = json.loads(first.read_text()), json.loads(second.read_text())
    assert (a["test_seed"], b["test_seed"]) == (0, 7)
    assert a["threshold"] == b["threshold"] and a["combiner"] == b["combiner"]  # the same fit
    assert a["mnist_test"] == b["mnist_test"]  # the same test digits
    for name in ("letters", "noise"):  # other test images (the tiny model may reject all of both)
        assert not np.array_equal(make_set(name, 3, seed=0, role="test"), make_set(name, 3, seed=7, role="test"))


@needs_fonts
@pytest.mark.usefixtures("dejavu_for_held_out")
def test_confirm_reports_the_digits_the_card_left_out_whatever_the_command_line_says(
    tiny_model: Path, tmp_path: Path, tiny_mnist: Path
) -> None:
    data = tiny_mnist
    tiny_model = own_copy(tiny_model, tmp_path)
    assert ood.main([*tiny_fit(tiny_model, data), "--write-card", "--json", str(tmp_path / "fit.json")]) == 0
    fitted = json.loads((tmp_path / "fit.json").read_text())
    other = ["--model", str(tiny_model), "--data-dir", str(data), "--combiner", "10", "--validation", "10"]
    assert ood.main([*other, "--confirm", "--per-set", "2", "--json", str(tmp_path / "confirm.json")]) == 0
    report = json.loads((tmp_path / "confirm.json").read_text())
    assert report["digit_split"] == {"seed": 0, "combiner": 24, "validation": 20}
    assert report["mnist_test"] == fitted["mnist_test"]  # the same 20 reported digits, scored the same


def test_the_cache_never_answers_changed_images_with_old_outputs(tiny_model: Path, tmp_path: Path) -> None:
    model = ood_fitted.ModelOutputs(tiny_model, tmp_path / "cache")
    rng = np.random.default_rng(0)
    first, second = rng.uniform(0, 1, (2, 3, 1, 28, 28)).astype(np.float32)
    kept = model.run(first, "letters")
    np.testing.assert_array_equal(model.run(first, "letters")["scores"], kept["scores"])  # from the file
    assert len(list((tmp_path / "cache").iterdir())) == 1
    changed = model.run(second, "letters")  # the same name, other images: computed afresh
    np.testing.assert_array_equal(changed["scores"], ood_fitted.ModelOutputs(tiny_model).run(second)["scores"])
    assert not np.array_equal(changed["scores"], kept["scores"])


def test_the_cache_never_answers_another_model_of_the_same_name(tiny_model: Path, tmp_path: Path) -> None:
    import torch

    from model.capsnet import CapsNet
    from model.config import CapsNetConfig
    from training.export.exporter import export_module

    torch.manual_seed(1)  # other weights under the same name, as a re-export would give
    cfg = CapsNetConfig.tiny()
    other = tmp_path / "zoo" / "tiny"
    export_module(CapsNet(cfg).eval(), "dynamic", cfg.to_dict(), other, name="tiny", torchscript=False)
    images = np.random.default_rng(1).uniform(0, 1, (3, 1, 28, 28)).astype(np.float32)
    first = ood_fitted.ModelOutputs(tiny_model, tmp_path / "cache").run(images, "letters")
    second = ood_fitted.ModelOutputs(other, tmp_path / "cache").run(images, "letters")
    assert len(list((tmp_path / "cache").iterdir())) == 2
    assert not np.array_equal(first["scores"], second["scores"])


def test_straddle_finds_two_images_one_pixel_apart_either_side_of_the_veto() -> None:
    rng = np.random.default_rng(3)
    outside, inside = rng.integers(0, 100, (28, 28)).astype(np.uint8), rng.integers(150, 256, (28, 28)).astype(np.uint8)

    def vetoed(image: np.ndarray) -> bool:  # a stand-in for "the margin is at most the cut": the ink crosses a level
        return int(image.astype(np.int64).sum()) >= 100_000

    assert not vetoed(outside) and vetoed(inside)
    below, above = ood_edges.straddle(outside, inside, vetoed)
    assert not vetoed(below) and vetoed(above)
    assert np.count_nonzero(below != above) == 1  # one pixel apart: the finest step an image of uint8 allows

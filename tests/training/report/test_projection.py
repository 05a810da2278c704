"""The power-law projection of a report run's curve: where it reaches a target, when it never does, and the
verdict each training section of the report states with it."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from training.fitting.device import resolve_device
from training.report import affine, baseline, common, multimnist
from training.report.projection import main, outlook, project, verdict


def curve(a: float, b: float, epochs: int, epoch_images: int, rate: float = 50.0) -> list[dict]:
    return [
        {"epoch": k, "test_error": a * (k * epoch_images) ** -b, "images_per_second": rate}
        for k in range(1, epochs + 1)
    ]


def test_an_exact_power_law_is_followed_to_its_target() -> None:
    rows = curve(a=2.0, b=0.5, epochs=10, epoch_images=1000)  # error 2 / sqrt(images): 0.02 at 10,000 images
    p = project(rows, target=0.01, epoch_images=1000)
    assert p.slope == pytest.approx(0.5) and p.epochs_fitted == 5  # the second half of the curve
    assert p.images_to_target is not None and abs(p.images_to_target - 40_000) <= 1  # 2 / sqrt(40,000) = 0.01
    assert p.images_more == p.images_to_target - 10_000
    assert p.hours_more == pytest.approx(round(p.images_more / 50 / 3600, 1))
    assert not p.reached


def test_a_flat_or_rising_curve_reaches_no_target_and_a_reached_one_says_so() -> None:
    flat = [{"epoch": k, "test_error": 0.02} for k in range(1, 7)]
    p = project(flat, target=0.01, epoch_images=1000)
    assert p.slope == 0 and p.images_to_target is None and p.hours_more is None
    done = curve(a=2.0, b=0.5, epochs=10, epoch_images=10_000)  # 0.0063 at 100,000 images
    q = project(done, target=0.01, epoch_images=10_000)
    assert q.reached and q.images_more == 0


def test_the_command_prints_json_and_names_bad_input(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    metrics = tmp_path / "metrics.jsonl"
    metrics.write_text("\n".join(json.dumps(r) for r in curve(2.0, 0.5, 6, 1000)) + "\n")
    assert main([str(metrics), "--target", "0.01", "--epoch-images", "1000", "--last", "3"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["epochs_fitted"] == 3 and abs(out["images_to_target"] - 40_000) <= 1
    assert main([str(metrics), "--target", "0"]) == 2
    assert "--target must be above 0" in capsys.readouterr().err
    metrics.write_text(json.dumps({"epoch": 1, "test_error": 0.1}) + "\n")
    assert main([str(metrics), "--target", "0.01"]) == 2
    assert "at least 2 epochs" in capsys.readouterr().err
    assert main([str(tmp_path / "missing.jsonl"), "--target", "0.01"]) == 2


# --- the verdict: error 2 / sqrt(images) reaches 1.25% at 25,600 images, 0.25% at 640,000 ----------------------


def test_a_target_within_the_plan_says_so_with_the_images_and_hours() -> None:
    p = project(curve(a=2.0, b=0.5, epochs=10, epoch_images=1000), target=0.0125, epoch_images=1000)
    text = verdict(p, planned_images=30_000)
    assert text.startswith("The target is 1.25% test error; the best so far is 2.00%.")
    assert "fitted to the last 5 epochs has slope b = 0.50" in text
    assert "reaches the target at about 25,600 training images (15,600 more than the 10,000 done; about 0.1 h" in text
    assert text.endswith("That is within the planned compute (30,000 images).")


def test_a_target_within_three_times_the_plan_says_how_many_epochs_to_add() -> None:
    p = project(curve(a=2.0, b=0.5, epochs=10, epoch_images=1000), target=0.0125, epoch_images=1000)
    text = verdict(p, planned_images=20_000)  # 5,600 images short: 6 epochs of 1,000
    assert "beyond the planned compute (20,000 images) but within three times it" in text
    assert text.endswith("the run should be extended by 6 epochs of 1,000 images (to 26 epochs).")


@pytest.mark.parametrize(("planned", "out_of_reach"), [(8_600, False), (8_500, True)])
def test_three_times_the_plan_is_the_edge_of_reach(planned: int, out_of_reach: bool) -> None:
    p = project(curve(a=2.0, b=0.5, epochs=8, epoch_images=1000), target=0.0125, epoch_images=1000)
    assert p.images_to_target is not None and 3 * 8_500 < p.images_to_target <= 3 * 8_600
    assert ("out of reach" in verdict(p, planned)) is out_of_reach


def test_a_target_out_of_reach_states_the_planned_and_predicted_images_and_its_evidence() -> None:
    p = project(curve(a=2.0, b=0.5, epochs=10, epoch_images=1000), target=0.0025, epoch_images=1000)
    text = verdict(p, 10_000, unit="composites", curve="[the curve above](report/figures/c.png)")
    assert "at about 640,000 training composites (630,000 more than the 10,000 done; about 3.5 h more" in text
    assert text.endswith(
        "That is out of reach: more than three times the planned compute (10,000 composites planned, about 640,000 "
        "predicted); [the curve above](report/figures/c.png) is the evidence."
    )


def test_a_curve_that_does_not_fall_reaches_no_target() -> None:
    rising = [{"epoch": k, "test_error": 0.02 + 0.001 * k, "images_per_second": 50.0} for k in range(1, 7)]
    text = verdict(project(rising, target=0.01, epoch_images=1000), 6_000)
    assert "has slope b = 0.00" in text
    assert "the curve does not fall, so more training like it reaches no target" in text
    assert "planned" not in text and " h " not in text


def test_the_fit_follows_the_best_error_so_far_so_a_bad_last_epoch_does_not_tip_it() -> None:
    rows = curve(a=2.0, b=0.5, epochs=10, epoch_images=1000)
    noisy = [*rows[:-1], {**rows[-1], "test_error": 0.05}]  # the last epoch much worse than the one before
    p = project(noisy, target=0.01, epoch_images=1000)
    assert p.slope > 0.3 and p.best_error == pytest.approx(rows[-2]["test_error"])


def test_a_reached_target_names_the_first_epoch_at_or_below_it() -> None:
    rows = curve(a=2.0, b=0.5, epochs=10, epoch_images=10_000)  # 2%, 1.41%, 1.15%, 1.00% at epoch 4, ...
    text = verdict(project(rows, target=0.0101, epoch_images=10_000), 100_000)
    assert text == (
        "The target is 1.01% test error; the best so far is 0.63%. It is reached: first at epoch 4, after 40,000 "
        "training images."
    )


def test_a_short_curve_is_not_projected_and_a_run_without_images_per_second_gets_no_hours() -> None:
    rows = curve(a=2.0, b=0.5, epochs=10, epoch_images=1000)
    one = outlook(rows[:1], 0.01, 1000, 10_000)
    assert one.endswith("The curve has 1 epoch so far, too short to project (a power law needs 2).")
    assert outlook([], 0.01, 1000, 10_000).endswith("No epoch is measured yet: the curve is too short to project.")
    early = outlook([{"epoch": 1, "test_error": 0.005}], 0.01, 1000, 10_000)
    assert early.endswith("It is reached: first at epoch 1, after 1,000 training images.")
    slow = [{k: v for k, v in row.items() if k != "images_per_second"} for row in rows]
    assert "no time is estimated, as its epochs record no images/s" in outlook(slow, 0.0025, 1000, 10_000)


# --- the sections state it, from their saved histories ----------------------------------------------------------


def context(tmp_path: Path) -> common.Context:
    return common.Context(
        out=tmp_path / "docs", data_dir=None, zoo=tmp_path / "zoo", model=None, sizes=common.Sizes.tiny(), tiny=True,
        device=resolve_device("cpu"), seed=0, command="test", scratch=tmp_path,
    )  # fmt: skip


def progress(epochs_done: int, epochs_planned: int, per_epoch: int) -> dict[str, Any]:
    return {
        "epochs_done": epochs_done, "epochs_planned": epochs_planned, "images_per_epoch": per_epoch,
        "images_done": epochs_done * per_epoch, "images_planned": epochs_planned * per_epoch, "train_hours": 1.0,
        "finished": epochs_done >= epochs_planned,
    }  # fmt: skip


def test_the_baseline_section_says_by_how_many_epochs_to_extend_its_run(tmp_path: Path) -> None:
    history = [{**row, "test_n": 10_000} for row in curve(a=2.0, b=0.5, epochs=6, epoch_images=1000)]
    train = {"epochs": 40, "batch_size": 128, "lr": 0.001, "lr_decay": 0.99}
    result = {
        "history": history, "progress": progress(6, 40, 1000), "train_config": train, "train_digits": 60_000,
        "parameters": 1, "train_flops_per_image": 10**9, "inference_flops_per_image": 10**8, "capsnet": None,
    }  # fmt: skip
    ctx = context(tmp_path)
    text = baseline.render_baseline(ctx, common.save_result(ctx, "baseline", result, {}), None)
    assert "**Projection.** The target is 0.60% test error; the best so far is 2.58%." in text
    assert "at about 111,000 training images" in text and "within the planned compute (40,000" not in text
    assert "but within three times it: the run should be extended by 72 epochs of 1,000 images (to 112 epochs)." in text
    assert text.index("**Projection.**") < text.index("**Partial result.**")


def test_the_multimnist_section_says_its_target_is_out_of_reach_with_its_curve(tmp_path: Path) -> None:
    history = [{**row, "test_n": 100} for row in curve(a=2.0, b=0.5, epochs=10, epoch_images=2000)]
    config = {
        "epochs": 10, "batch_size": 8, "lr": 0.001, "lr_decay": 0.99, "test_pairs_per_digit": 1,
        "composites_per_epoch": 2000,
    }  # fmt: skip
    result = {
        "history": history, "progress": progress(10, 10, 2000), "config": config, "parameters": 1,
        "train_flops_per_image": 10**9, "train_digits": 60_000, "test_digits": 100,
        "test_error": history[-1]["test_error"], "test_n": 100,
    }  # fmt: skip
    ctx = context(tmp_path)
    text = multimnist.render_multimnist(ctx, common.save_result(ctx, "multimnist", result, {}), None)
    assert "**Projection.** The target is 10.00% two-digit test error; the best so far is 1.41%. It is reached" in text
    result["history"] = [{**row, "test_error": 50 * row["test_error"]} for row in history]  # 70.7% at the end
    text = multimnist.render_multimnist(ctx, common.save_result(ctx, "multimnist", result, {}), None)
    assert (
        "That is out of reach: more than three times the planned compute (20,000 composites planned, about "
        "1,000,000 predicted); [the curve above](report/figures/multimnist_curve.png) is the evidence. The target "
        "asks for 2,000,000 training composites; this run plans 20,000."
    ) in text
    assert (ctx.figures / "multimnist_curve.png").is_file()


def test_the_affine_section_projects_each_model(tmp_path: Path) -> None:
    rows = [{**row, "affine_error": 0.5, "affine_n": 10} for row in curve(a=2.0, b=0.5, epochs=6, epoch_images=1000)]
    cnn = {
        "progress": progress(6, 20, 1000), "model_config": {}, "parameters": 1, "train_flops_per_image": 10**9,
        "inference_flops_per_image": 10**8,
        "train_config": {"epochs": 20, "batch_size": 8, "lr": 0.001, "lr_decay": 0.99},
    }  # fmt: skip
    result = {"histories": {"baseline": rows}, "models": {"baseline": cnn}, "matched": None, "train_digits": 60}
    ctx = context(tmp_path)
    text = affine.render_affine(ctx, common.save_result(ctx, "affine", result, {}), None)
    assert "**Projection (Baseline CNN).** The target is 1.00% test error on the centred digits" in text
    assert "reaches the target at about 40,000 training images" in text and "(to 40 epochs)" in text
    assert "**Projection (CapsNet).** Not started yet: nothing to project." in text
    assert "[the figure above](report/figures/affine_vs_mnist.png)" not in text  # cited only when out of reach
    assert text.index("**Projection (CapsNet).**") < text.index("**Partial result.**")
    assert (ctx.figures / "affine_vs_mnist.png").is_file()


def test_a_zero_error_epoch_counts_as_reached_not_as_a_curve_too_short() -> None:
    rows = [{"epoch": 1, "test_error": 0.02}, {"epoch": 2, "test_error": 0.0}, {"epoch": 3, "test_error": 0.01}]
    text = outlook(rows, 0.006, 1000, 10_000)
    assert "It is reached: first at epoch 2, after 2,000 training images." in text


def test_the_rate_is_images_over_seconds_so_slow_epochs_weigh_as_long_as_they_took() -> None:
    rows = [{"epoch": k, "test_error": 0.1 / k, "seconds": s, "images_per_second": 1000 / s}
            for k, s in ((1, 10.0), (2, 10.0), (3, 10.0), (4, 90.0))]  # fmt: skip
    p = project(rows, target=0.0001, epoch_images=1000, last=2)  # 1,000,000 images: 996,000 more
    assert p.images_more == pytest.approx(996_000, abs=2)  # ceil of a float power law
    assert p.hours_more == pytest.approx(996_000 / (2000 / 100.0) / 3600, abs=0.1)  # 13.8 h at 20 images/s

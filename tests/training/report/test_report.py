"""The report: MultiMNIST helpers, Figure-4 grids, matched accuracy, timing, saved results, the command end to end."""

from __future__ import annotations

import json
import re
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from model.baseline import BaselineConfig
from model.capsnet import CapsNet, count_parameters
from model.config import CapsNetConfig
from model.losses import margin_loss, margin_loss_multi
from service.runtime.model_dir import create_session
from training.benchmarks.flops import matmul_graph
from training.data.generators import multimnist
from training.data.mnist import load_split
from training.fitting import loop
from training.fitting import multimnist as multimnist_module
from training.fitting.checkpoint import save_checkpoint
from training.fitting.device import resolve_device
from training.fitting.multimnist import (
    evaluate_multimnist,
    multi_hot,
    multimnist_loss,
    reconstruct_each,
    reconstruction_examples,
    top2,
)
from training.report import (
    affine,
    baseline,
    build,
    common,
    compute,
    costs,
    mnist_models,
    models,
    perturbation,
    service_load,
    speed,
)
from training.report import multimnist as multimnist_section
from training.report.common import Context, Sizes, shown

# --- MultiMNIST helpers ------------------------------------------------------------------------------


def test_margin_loss_multi_matches_eq4() -> None:
    lengths = torch.tensor([[0.95, 0.5, 0.05, 0.3], [0.2, 0.8, 0.9, 0.0]])
    one = torch.tensor([0, 2])
    assert torch.allclose(margin_loss_multi(lengths, multi_hot(one[:, None], 4)), margin_loss(lengths, one))
    two = multi_hot(torch.tensor([[0, 1], [1, 2]]), 4)
    assert two.tolist() == [[1, 1, 0, 0], [0, 1, 1, 0]]
    # image 0: present 0 (0) and 1 (0.4²); absent 2 (0) and 3 (0.5·0.2²). Image 1: 0.1², 0; absent 0.5·0.1², 0.
    expected = ((0.16 + 0.5 * 0.04) + (0.01 + 0.5 * 0.01)) / 2
    assert margin_loss_multi(lengths, two).item() == pytest.approx(expected, rel=1e-5)


def test_top2_sorts_the_two_longest_capsules_by_class() -> None:
    lengths = torch.tensor([[0.1, 0.9, 0.2, 0.8], [0.7, 0.1, 0.6, 0.0]])
    assert top2(lengths).tolist() == [[1, 3], [0, 2]]  # sorted by class index


def test_multimnist_loss_reconstructs_each_digit_from_its_own_capsule() -> None:
    torch.manual_seed(0)
    model = CapsNet(CapsNetConfig.tiny(image_size=36))
    images = torch.rand(3, 1, 36, 36)
    labels = torch.tensor([[1, 4], [0, 9], [7, 2]])
    poses, _ = model.encode(images)
    each = reconstruct_each(model, poses, labels)
    assert each.shape == (3, 2, 36 * 36)
    assert torch.equal(each[:, 0], model.decode_class(poses, labels[:, 0]))
    assert torch.equal(each[:, 1], model.decode_class(poses, labels[:, 1]))
    assert not torch.equal(each[:, 0], each[:, 1])
    loss, parts = multimnist_loss(model, images, labels, torch.rand(3, 2, 1, 36, 36))
    loss.backward()
    assert set(parts) == {"margin_loss", "reconstruction_loss"} and loss.item() > parts["margin_loss"]
    assert model.conv1.weight.grad is not None


def test_evaluate_and_examples_on_generated_pairs(synthetic_mnist: Path) -> None:
    test = load_split(synthetic_mnist, "test")
    data = multimnist(test.images, test.labels, 0)
    model = CapsNet(CapsNetConfig.tiny(image_size=36))
    result = evaluate_multimnist(model, data, torch.device("cpu"), batch_size=10)
    assert result.n == len(test) and result.predictions.shape == (len(test), 2)
    assert result.errors == int((result.predictions != np.sort(data.labels, axis=1)).any(axis=1).sum())
    ex = reconstruction_examples(model, data, torch.device("cpu"), n=3)
    assert ex["inputs"].shape == (3, 36, 36) and ex["recon_pred"].shape == (3, 2, 36, 36)
    assert ex["recon_true"].dtype == np.uint8 and ex["labels"].shape == (3, 2)


# --- Figure 4, matched accuracy, timing --------------------------------------------------------------


def test_perturbation_grid_moves_one_dimension_of_one_class() -> None:
    k, d = 4, 3
    poses = np.arange(k * d, dtype=np.float32).reshape(k, d) / 10
    seen: dict[str, np.ndarray] = {}

    def decode(batch: np.ndarray, mask: np.ndarray) -> np.ndarray:
        seen["mask"] = mask
        flat = np.zeros((len(batch), 4), dtype=np.float32)
        flat[:, :d] = (batch * mask[:, :, None]).sum(axis=1)  # pixels 0..d-1: the masked capsule
        flat[:, 3] = batch.sum(axis=(1, 2))  # pixel 3: the sum of every pose
        return flat.reshape(len(batch), 1, 2, 2)

    values = np.array([-0.1, 0.0, 0.2])
    grid = perturbation.perturbation_grid(poses, 2, decode, values)
    assert grid.shape == (d, 3, 2, 2)
    assert np.all(seen["mask"][:, 2] == 1) and seen["mask"].sum() == d * 3
    for dim in range(d):
        for v, value in enumerate(values):
            expected = poses[2].copy()
            expected[dim] += value
            assert np.allclose(grid[dim, v].ravel()[:d], expected)
            assert grid[dim, v, 1, 1] == pytest.approx(poses.sum() + value, abs=1e-5)  # nothing else moved


def test_pick_examples_prefers_correct_ones() -> None:
    labels = np.array([0, 1, 0, 1, 2])
    scores = np.eye(3)[[1, 1, 0, 0, 1]]  # predictions 1, 1, 0, 0, 1
    picks, correct = perturbation.pick_examples(scores, labels, 4)
    assert picks == [2, 1, 4, -1] and correct == [True, True, False, False]


def test_match_accuracy_compares_at_the_highest_accuracy_both_reach() -> None:
    def rows(accs: list[float]) -> list[dict[str, Any]]:
        return [{"epoch": i + 1, "test_error": 1 - a, "affine_error": 1 - a / 2} for i, a in enumerate(accs)]

    matched = affine.match_accuracy({"dynamic": rows([0.9, 0.97, 0.99]), "baseline": rows([0.95, 0.98, 0.96])})
    assert matched is not None and matched["target_mnist_accuracy"] == pytest.approx(0.98)
    assert matched["picks"]["dynamic"]["epoch"] == 3 and matched["picks"]["baseline"]["epoch"] == 2
    assert affine.match_accuracy({"dynamic": [], "baseline": rows([0.95])}) is None  # CapsNet has no epoch yet


def test_time_calls_and_matmul_graph() -> None:
    calls = []
    t = speed.time_calls(lambda: calls.append(1), batch=4, seconds=0.0, min_reps=5, warmup=2)
    assert t.reps == 5 and len(calls) == 7 and t.p50_ms <= t.p99_ms and t.images_per_s > 0
    session = create_session(matmul_graph(8))
    a, b = np.random.rand(8, 8).astype(np.float32), np.random.rand(8, 8).astype(np.float32)
    assert np.allclose(session.run(None, {"a": a, "b": b})[0], a @ b, atol=1e-5)


def test_montage_tiles_rows_and_columns() -> None:
    images = np.arange(2 * 3 * 2 * 2).reshape(2, 3, 2, 2)
    out = common.montage(images, gap=1)
    assert out.shape == (6, 9)
    assert np.array_equal(out[3:5, 6:8], images[1, 2]) and out[2, 0] == 128


def test_model_from_checkpoint_classifies_and_decodes(tmp_path: Path) -> None:
    cfg = CapsNetConfig.tiny()
    net = CapsNet(cfg)
    save_checkpoint(tmp_path / "c.pt", {"arch": "dynamic", "model_config": cfg.to_dict(), "model": net.state_dict()})
    m = models.model_from_checkpoint(tmp_path / "c.pt")
    scores, poses = m.classify(np.random.rand(2, 1, 28, 28).astype(np.float32))
    assert scores.shape == (2, 10) and poses.shape == (2, 10, cfg.digit_dim) and m.decode is not None
    grid = perturbation.perturbation_grid(poses[0], 3, m.decode, perturbation.PERTURBATIONS)
    assert grid.shape == (cfg.digit_dim, 11, 28, 28)


# --- saved results and the report ---------------------------------------------------------------------


def context(tmp_path: Path, data_dir: Path | None = None, tiny: bool = True) -> Context:
    return Context(
        out=tmp_path / "docs", data_dir=str(data_dir) if data_dir else None, zoo=tmp_path / "zoo", model=None,
        sizes=Sizes.tiny(), tiny=tiny, device=resolve_device("cpu"), seed=0, command="test", scratch=tmp_path,
    )  # fmt: skip


def test_saved_results_round_trip_and_refuse_the_other_mode(tmp_path: Path) -> None:
    ctx = context(tmp_path)
    saved = common.save_result(ctx, "speed", {"x": 1}, {"grid": np.ones((2, 2), dtype=np.uint8)})
    loaded = common.load_result(ctx, "speed")
    assert loaded is not None and loaded.result == {"x": 1} and loaded.produced_at == saved.produced_at
    assert loaded.command == "test" and np.array_equal(loaded.arrays["grid"], np.ones((2, 2)))
    assert common.load_result(context(tmp_path, tiny=False), "speed") is None  # a tiny result is never reused for real


def test_unmeasured_sections_say_so_and_invent_nothing(tmp_path: Path) -> None:
    ctx = context(tmp_path)
    path = build.build_report(ctx, selected={"baseline"}, reuse=False)  # no data directory
    text = path.read_text()
    assert text.count("**Not yet measured.**") == 7  # six sections and the service
    assert "no MNIST data directory" in text
    assert "--sections affine" in text
    assert "this run" not in text and not (ctx.results / "baseline.json").exists()


def test_report_cli_refuses_a_missing_data_dir_and_cuda_without_cuda(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("CAPSNET_DATA_DIR", raising=False)
    out = tmp_path / "docs"
    base = ["--tiny", "--out", str(out), "--zoo", str(tmp_path / "zoo")]
    assert build.main([*base, "--data-dir", str(tmp_path / "none")]) == 2
    assert capsys.readouterr().err == (
        f"python -m training.report: error: MNIST data directory {tmp_path / 'none'} does not exist or is not a "
        "directory\n"
    )
    assert build.main([*base, "--sections", "baseline", "affine"]) == 2
    assert capsys.readouterr().err == (
        "python -m training.report: error: no MNIST data directory given: pass --data-dir or set $CAPSNET_DATA_DIR "
        "(sections baseline, affine read MNIST; --sections speed runs without it)\n"
    )
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert build.main([*base, "--device", "cuda", "--sections", "speed"]) == 2
    err = capsys.readouterr().err
    assert err == "python -m training.report: error: --device cuda was asked for but CUDA is not available\n"
    assert not out.exists()  # nothing written, no REPORT.md claiming "not measured"
    assert build.main([*base, "--sections", "speed", "--dry-run"]) == 0  # speed reads no MNIST
    assert json.loads(capsys.readouterr().out) == {
        "data_dir": None,
        "sections": {key: "run" if key == "speed" else "missing" for key in build.SECTIONS},
    }


def write_card_only_model(zoo: Path) -> None:
    d = zoo / "em-card-only"
    d.mkdir(parents=True)
    card = {
        "format_version": 1, "name": "em-card-only", "architecture": "em", "parameters": 123, "decoder": None,
        "routing": {"algorithm": "em", "variant": None, "iterations": 3}, "outputs": [],
        "metrics": {"mnist_test_error": 0.0123, "n": 10000}, "files": {"capsnet.onnx": {"sha256": "0" * 64}},
    }  # fmt: skip
    (d / "model.json").write_text(json.dumps(card))


@pytest.mark.slow
def test_report_runs_end_to_end_on_tiny_inputs(synthetic_mnist: Path, tmp_path: Path, capsys: Any) -> None:
    from training.export.exporter import export_module

    zoo, out = tmp_path / "zoo", tmp_path / "docs"
    write_card_only_model(zoo)
    cfg = CapsNetConfig.tiny()
    torch.manual_seed(0)
    export_module(CapsNet(cfg), "dynamic", cfg.to_dict(), zoo / "tiny", name="tiny", torchscript=False)
    argv = ["--tiny", "--data-dir", str(synthetic_mnist), "--out", str(out), "--zoo", str(zoo), "--device", "cpu"]
    assert build.main(argv) == 0
    text = (out / "REPORT.md").read_text()
    assert "TINY MODE" in text and "Not yet measured" in text  # only the service section
    assert text.count("**Not yet measured.**") == 1
    assert "1.23%" in text and "em-card-only: confusion matrix not measured" in text  # the card's figure
    for name in (
        "confusion_tiny", "confusion_baseline", "baseline_curve", "affine_vs_mnist", "affine_examples",
        "multimnist_reconstructions", "speed", *(f"perturbation_class{k}" for k in range(10)),
    ):  # fmt: skip
        png = out / "report" / "figures" / f"{name}.png"
        assert png.stat().st_size > 1000, name
        assert f"report/figures/{name}.png" in text, name
    speed = json.loads((out / "report" / "speed.json").read_text())
    assert speed["command"].startswith("python -m training.report --tiny") and speed["produced_at"]
    assert {r["runtime"] for r in speed["result"]["rows"]} >= {"pytorch-eager-cpu", "onnxruntime-cpu"}
    assert [r["batch"] for r in speed["result"]["rows"][:2]] == [1, 8]
    perturbation = json.loads((out / "report" / "perturbation.json").read_text())["result"]
    assert perturbation["model"] == shown(zoo / "tiny") and perturbation["values"][0] == -0.25
    for written in [out / "REPORT.md", *(out / "report").glob("*.json")]:  # the machine's paths stay out of results
        assert not re.search(r"(?<![\w.])" + re.escape(str(tmp_path)), written.read_text()), written.name

    capsys.readouterr()
    stamps = {p.name: json.loads(p.read_text())["produced_at"] for p in (out / "report").glob("*.json")}
    assert build.main([*argv, "--dry-run", "--reuse"]) == 0
    assert set(json.loads(capsys.readouterr().out)["sections"].values()) == {"reuse"}
    (out / "REPORT.md").unlink()
    assert build.main([*argv, "--reuse"]) == 0  # renders again from the saved results, runs nothing
    assert stamps == {p.name: json.loads(p.read_text())["produced_at"] for p in (out / "report").glob("*.json")}
    assert (out / "REPORT.md").read_text().count("**Not yet measured.**") == 1


def test_service_section_renders_the_load_benchmarks_json(tmp_path: Path) -> None:
    ctx = context(tmp_path)
    assert "**Not yet measured.**" in service_load.render_service(ctx)
    ctx.results.mkdir(parents=True)
    rows = {
        "model": "m",
        "raw": [{"batch": 1, "throughput": 1234.5, "p50_ms": 0.8}],
        "http": [{"concurrency": 1, "throughput": 456.25, "p99_ms": 3.0}, {"concurrency": 64, "throughput": 900.0}],
    }
    (ctx.results / service_load.SERVICE_LOAD_FILE).write_text(json.dumps(rows))
    text = service_load.render_service(ctx)
    assert "| concurrency | throughput | p99_ms |" in text and "| 64 | 900.00 |  |" in text
    assert "| 1 | 1,234.50 | 0.80 |" in text
    assert "Peak resident memory of the service under load: **not yet measured**" in text
    assert "by `python -m training.benchmarks.service`" in text and not (ctx.figures / "service_load.png").exists()

    http = [
        {"concurrency": c, "throughput": 100.0 * c, "p50_ms": 1.0 * c, "p99_ms": 2.0 * c, "raw_throughput": 900.0}
        for c in (1, 8, 64)
    ]
    stamp = {
        "command": "python -m training.benchmarks.service --concurrency 1,8,64",
        "produced_at": "2026-01-02T03:04:05+00:00",
    }
    (ctx.results / service_load.SERVICE_LOAD_FILE).write_text(
        json.dumps({**rows, **stamp, "http": http, "server_peak_rss_mib": 291.6})
    )
    text = service_load.render_service(ctx)
    assert "_Produced 2026-01-02T03:04:05+00:00 by `python -m training.benchmarks.service --concurrency 1,8,64`" in text
    assert "service process under this load: 292 MiB" in text
    assert (ctx.figures / "service_load.png").stat().st_size > 1000 and "report/figures/service_load.png" in text
    (ctx.results / service_load.SERVICE_LOAD_FILE).write_text("[1, 2]")
    assert "is not the load benchmark's JSON object" in service_load.render_service(ctx)


# --- time budget: the training sections stop between epochs and continue from --runs -----------------------

TRAINING_SECTIONS = {
    "baseline": (baseline.run_baseline, ["baseline-mnist"]),
    "affine": (affine.run_affine, ["affine-baseline", "affine-dynamic"]),
    "multimnist": (multimnist_section.run_multimnist, ["multimnist"]),
}


@pytest.mark.parametrize("section", sorted(TRAINING_SECTIONS))
def test_training_sections_stop_at_the_budget_and_continue(
    section: str, synthetic_mnist: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """With time for one epoch per call, every call continues where the last stopped, and ends as one run."""
    runner, names = TRAINING_SECTIONS[section]

    def two_epoch_context(runs: Path | None) -> Context:
        ctx = context(tmp_path, synthetic_mnist)
        ctx.sizes = replace(Sizes.tiny(), epochs=2)
        ctx.runs, ctx.deadline = runs, time.monotonic() + 3600
        return ctx

    uninterrupted, _ = runner(two_epoch_context(None))
    for module in (common, loop):  # after an epoch, no time for another
        monkeypatch.setattr(module, "within_budget", lambda deadline, last: deadline is not None and last is None)
    calls, result = 0, None
    while result is None and calls < 5:
        calls += 1
        try:
            result, _ = runner(two_epoch_context(tmp_path / "runs"))
        except common.Unfinished as e:
            assert ("of 2 epochs" in str(e) or "not continued" in str(e)) and "Run the same command again" in str(e)
            assert (tmp_path / "runs" / names[0] / "last.pt").is_file()
            assert e.partial is not None  # the epochs so far, to render as partial
            partial = e.partial[0]
            models = partial["models"].values() if "models" in partial else [partial]
            done = [m["progress"] for m in models]
            assert not all(p["finished"] for p in done) and {p["epochs_planned"] for p in done} == {2}
    # One epoch per call and none of a second model after the first's: nothing was trained twice.
    assert calls == 2 * len(names)
    histories = {
        "baseline": lambda r: {"baseline": r["history"]},
        "affine": lambda r: r["histories"],
        "multimnist": lambda r: {"multimnist": r["history"]},
    }[section]
    assert result is not None
    for name, rows in histories(result).items():
        assert [row["epoch"] for row in rows] == [1, 2], name
        expected = histories(uninterrupted)[name]
        assert rows[-1]["train_loss"] == pytest.approx(expected[-1]["train_loss"], abs=1e-5), name


def test_a_spent_budget_starts_no_training(synthetic_mnist: Path, tmp_path: Path) -> None:
    ctx = context(tmp_path, synthetic_mnist)
    ctx.runs, ctx.deadline = tmp_path / "runs", time.monotonic() - 1
    with pytest.raises(common.Unfinished, match="baseline-mnist: not continued when the time budget ran out"):
        baseline.run_baseline(ctx)
    assert not (tmp_path / "runs").exists()


@pytest.mark.parametrize("section", ["baseline", "multimnist"])
def test_resuming_refuses_a_checkpoint_of_other_settings(section: str, synthetic_mnist: Path, tmp_path: Path) -> None:
    runner = TRAINING_SECTIONS[section][0]
    ctx = context(tmp_path, synthetic_mnist)
    ctx.runs = tmp_path / "runs"
    runner(ctx)
    ctx.seed = 1
    with pytest.raises(common.NotMeasured, match=r"other settings \(seed\); remove it"):
        runner(ctx)


def test_report_budget_exit_code_and_arguments(
    synthetic_mnist: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    argv = ["--tiny", "--data-dir", str(synthetic_mnist), "--out", str(tmp_path / "docs"), "--device", "cpu"]
    with pytest.raises(SystemExit):
        build.main([*argv, "--max-minutes", "5"])  # no --runs: progress would be lost
    assert "--max-minutes needs" in capsys.readouterr().err
    runs = ["--runs", str(tmp_path / "runs"), "--sections", "baseline"]
    assert build.main([*argv, *runs, "--max-minutes", "0.00001"]) == build.EXIT_UNFINISHED
    assert "unfinished: baseline" in capsys.readouterr().err
    text = (tmp_path / "docs" / "REPORT.md").read_text()
    assert "In progress. baseline-mnist: not continued" in text
    assert build.main([*argv, *runs]) == 0
    assert "baseline CNN (this run)" in (tmp_path / "docs" / "REPORT.md").read_text()
    assert build.main([*argv, *runs, "--max-minutes", "0.00001"]) == build.EXIT_UNFINISHED
    text = (tmp_path / "docs" / "REPORT.md").read_text()  # the earlier result stays, marked as being redone
    assert "baseline CNN (this run)" in text and "The figures above are from the earlier complete run." in text


def test_resuming_refuses_a_checkpoint_with_more_epochs_than_asked(synthetic_mnist: Path, tmp_path: Path) -> None:
    ctx = context(tmp_path, synthetic_mnist)
    ctx.runs, ctx.sizes = tmp_path / "runs", replace(Sizes.tiny(), epochs=2)
    baseline.run_baseline(ctx)
    ctx.sizes = Sizes.tiny()
    with pytest.raises(common.NotMeasured, match="has 2 epochs, more than the 1 asked for"):
        baseline.run_baseline(ctx)


# --- CPU scale: short epochs, evaluation subsets, partial results --------------------------------------------


def test_short_epochs_keep_the_per_pass_learning_rate_decay() -> None:
    assert compute.lr_decay_per_epoch(None, 60_000) == 0.96
    assert compute.lr_decay_per_epoch(5_000, 60_000) ** 12 == pytest.approx(0.96)
    assert compute.lr_decay_per_epoch(90_000, 60_000) == 0.96  # an epoch never decays more than a pass


def test_model_costs_count_a_training_step_and_leave_the_random_state_alone() -> None:
    state = torch.get_rng_state()
    costs = compute.model_costs("baseline", BaselineConfig.tiny().to_dict(), (1, 28, 28))
    assert torch.equal(torch.get_rng_state(), state)
    # conv 1->8->8->4 (5x5, 28x28, 'same') and FC 3136->16->8->10: 2 x multiply-adds per image
    macs = 28 * 28 * 25 * (1 * 8 + 8 * 8 + 8 * 4) + 3136 * 16 + 16 * 8 + 8 * 10
    assert costs["inference_flops_per_image"] == 2 * macs
    assert 2 * macs < costs["train_flops_per_image"] <= 3 * 2 * macs  # backward: at most twice the forward


def test_multimnist_draws_composites_per_epoch_from_a_fresh_sample_of_digits(synthetic_mnist: Path) -> None:
    train, test = load_split(synthetic_mnist, "train"), load_split(synthetic_mnist, "test")
    cfg = multimnist_module.MultiMNISTConfig(preset="tiny", batch_size=8, composites_per_epoch=20)
    task = multimnist_module.MultiMNISTTask(cfg, train, test, torch.device("cpu"))
    batches = task.batches(0)
    assert sum(len(b) for b in batches) == 20 and task.data is not None
    first = {tuple(map(tuple, task.data.digits[:, 0, 0].reshape(20, -1)[:, :8]))}
    task.batches(1)
    assert task.data.labels.shape == (20, 2) and (task.data.labels[:, 0] != task.data.labels[:, 1]).all()
    assert first != {tuple(map(tuple, task.data.digits[:, 0, 0].reshape(20, -1)[:, :8]))}  # drawn afresh
    loop_cfg = multimnist_module.train_config(cfg, torch.device("cpu"))
    assert loop_cfg.epoch_images == 20  # recorded in checkpoints: a run refuses to continue with another size


def test_resuming_refuses_other_epoch_sizes(synthetic_mnist: Path, tmp_path: Path) -> None:
    ctx = context(tmp_path, synthetic_mnist)
    ctx.runs, ctx.sizes = tmp_path / "runs", replace(Sizes.tiny(), epoch_images=32)
    multimnist_section.run_multimnist(ctx)
    ctx.sizes = replace(ctx.sizes, epoch_images=16)
    with pytest.raises(common.NotMeasured, match=r"other settings \(epoch_images, lr_decay\); remove it"):
        multimnist_section.run_multimnist(ctx)


def test_a_section_stopped_by_the_budget_is_saved_and_rendered_as_partial(
    synthetic_mnist: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """One epoch per call: the section shows the epochs done, says it is unfinished and how to continue."""
    for module in (common, loop):
        monkeypatch.setattr(module, "within_budget", lambda deadline, last: deadline is not None and last is None)
    out = tmp_path / "docs"
    argv = [
        "--tiny", "--data-dir", str(synthetic_mnist), "--out", str(out), "--device", "cpu", "--runs",
        str(tmp_path / "runs"), "--sections", "baseline", "--epochs", "2", "--epoch-images", "32", "--test-images",
        "16", "--max-minutes", "60",
    ]  # fmt: skip
    assert build.main(argv) == build.EXIT_UNFINISHED
    assert "unfinished: baseline" in capsys.readouterr().err
    saved = json.loads((out / "report" / "baseline.json").read_text())
    assert saved["result"]["progress"] | {"train_hours": 0} == {
        "epochs_done": 1, "epochs_planned": 2, "images_per_epoch": 32, "images_done": 32, "images_planned": 64,
        "train_hours": 0, "finished": False,
    }  # fmt: skip
    assert "final" not in saved["result"]  # no confusion matrix of a model still training
    text = (out / "REPORT.md").read_text()
    assert "Baseline CNN: **unfinished**, 1 of 2 epochs of 32 images (32 of 64 training images)" in text
    assert "**Partial result.**" in text and f"`{saved['command']}` continues every unfinished model" in text
    assert "evaluated after every epoch on the first 16 test digits" in text
    assert "report/figures/baseline_curve.png" in text and "confusion_baseline.png" not in text
    assert build.main(argv) == 0
    text = (out / "REPORT.md").read_text()
    assert "Baseline CNN: finished, 2 of 2 epochs" in text and "Partial result" not in text
    assert "report/figures/confusion_baseline.png" in text


def test_the_affine_section_trains_the_cnn_first_and_waits_for_capsnet(
    synthetic_mnist: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    for module in (common, loop):
        monkeypatch.setattr(module, "within_budget", lambda deadline, last: deadline is not None and last is None)
    ctx = context(tmp_path, synthetic_mnist)
    ctx.sizes = replace(Sizes.tiny(), affine_cnn_channels=(4, 4, 2), test_subset=16)
    ctx.runs, ctx.deadline = tmp_path / "runs", time.monotonic() + 3600
    with pytest.raises(common.Unfinished) as stopped:
        affine.run_affine(ctx)
    assert stopped.value.partial is not None
    result, arrays = stopped.value.partial
    assert result["models"]["baseline"]["model_config"]["conv_channels"] == [4, 4, 2]
    assert result["histories"]["dynamic"] == [] and result["matched"] is None
    row = result["histories"]["baseline"][0]
    assert row["test_n"] == row["affine_n"] == 16 and 0 <= row["affine_error"] <= 1
    saved = common.save_result(ctx, "affine", result, arrays)
    text = affine.render_affine(ctx, saved, None)
    assert "No comparison yet: CapsNet has no epoch trained." in text and "**Partial result.**" in text
    assert "Baseline CNN (conv channels 4, 4, 2)" in text
    assert "CapsNet: not started yet" not in text  # opened, with no epoch yet
    assert "The epochs so far:" in text and "| Baseline CNN | 1 |" in text  # the CNN's rows, no comparison
    del result["models"]["dynamic"]
    assert "CapsNet: not started yet (the models train one after the other, the CNN first)." in (
        affine.compute_paragraph(result, saved.machine)
    )


def test_the_affine_cnn_can_train_fewer_epochs_than_capsnet(synthetic_mnist: Path, tmp_path: Path) -> None:
    ctx = context(tmp_path, synthetic_mnist)
    assert affine.affine_config(ctx, "baseline").epochs == affine.affine_config(ctx, "dynamic").epochs == 1
    ctx.sizes = replace(Sizes.tiny(), epochs=5, affine_cnn_epochs=2)
    assert affine.affine_config(ctx, "baseline").epochs == 2 and affine.affine_config(ctx, "dynamic").epochs == 5
    args = build.build_parser().parse_args(["--tiny", "--epochs", "5", "--affine-cnn-epochs", "2"])
    assert build.sizes_from(build.build_parser(), args).affine_cnn_epochs == 2


def test_baseline_curve_is_compared_with_capsnet_at_the_same_training_compute() -> None:
    capsnet = baseline.cumulative([{"epoch": e, "test_error": 0.01 / e} for e in (1, 2, 3)], 1000, 10**9)
    assert [p["pflop"] for p in capsnet] == [0.001, 0.002, 0.003]
    assert baseline.at_compute(capsnet, 0.0015) == capsnet[1] and baseline.at_compute(capsnet, 0.004) is None


def test_baseline_section_draws_capsnets_curve_beside_its_own(synthetic_mnist: Path, tmp_path: Path) -> None:
    rows = [{"epoch": e, "test_error": 0.02 / e, "test_n": 10000, "val_n": 16, "seconds": 1.0} for e in (1, 2)]
    curve = tmp_path / "metrics.jsonl"
    curve.write_text("".join(json.dumps(r) + "\n" for r in rows))
    ctx = context(tmp_path, synthetic_mnist)
    ctx.capsnet_curve = curve
    result, _ = baseline.run_baseline(ctx)
    ref = result["capsnet"]
    assert ref["images_per_epoch"] == len(load_split(synthetic_mnist, "train")) - 16  # less the held-out images
    assert [r["test_error"] for r in ref["history"]] == [0.02, 0.01] and ref["train_flops_per_image"] > 0
    text = baseline.render_baseline(ctx, common.save_result(ctx, "baseline", result, {}), None)
    assert "| CapsNet, last epoch (epoch 2) | 8,215,568 | 1.20 | 96 | 0.00 | 1.00% | 10,000 |" in text
    assert f"CapsNet's curve is `{shown(curve)}` (48 training images per epoch" in text
    assert "The baseline's test error is on the first 32 test digits (standard error ±" in text
    assert "**What is left.** The baseline trained " in text and "so training it to convergence is left." in text
    for row in result["history"]:
        row["test_error"] = 0.0039  # as good as the paper's: nothing is left
    text = baseline.render_baseline(ctx, common.save_result(ctx, "baseline", result, {}), None)
    assert "**What is left.**" not in text and "**Partial result.**" not in text


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--epoch-images", "0"], "--epoch-images must be at least 1, got 0"),
        (["--test-images", "-1"], "--test-images must be at least 1, got -1"),
        (["--eval-every", "0"], "--eval-every must be at least 1, got 0"),
        (["--affine-cnn-epochs", "0"], "--affine-cnn-epochs must be at least 1, got 0"),
        (["--affine-cnn-channels", "64,64"], "expected three positive channel counts like 64,64,32, got '64,64'"),
    ],
)
def test_report_cli_refuses_sizes_no_run_can_use(
    argv: list[str], message: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as e:
        build.main(["--tiny", "--out", str(tmp_path / "docs"), *argv])
    assert e.value.code == 2 and message in capsys.readouterr().err.splitlines()[-1]
    assert not (tmp_path / "docs").exists()


def test_mnist_table_says_what_the_em_row_is_missing_until_an_em_model_is_bundled(tmp_path: Path) -> None:
    ctx = context(tmp_path)
    dynamic = {"name": "capsnet-mnist", "architecture": "dynamic", "routing": {"algorithm": "dynamic"}}
    saved = common.save_result(ctx, "mnist_models", {"zoo": "model/zoo", "models": [dynamic]}, {})
    text = mnist_models.render_mnist_models(ctx, saved, None)
    assert "| EM routing (Hinton et al. 2018) | em, 3 iterations | no | not yet measured |" in text
    assert "What is missing is a trained EM-routing model directory in `model/zoo`" in text
    assert "capsnet-export runs/capsnet-em-small/best_val.pt --out model/zoo/capsnet-em-mnist" in text
    em = {"name": "capsnet-em-small", "architecture": "em", "routing": {"algorithm": "em", "iterations": 3}}
    saved = common.save_result(ctx, "mnist_models", {"zoo": "model/zoo", "models": [dynamic, em]}, {})
    assert "EM routing: not yet measured" not in mnist_models.render_mnist_models(ctx, saved, None)


def test_mnist_section_shows_how_each_bundled_model_was_trained(tmp_path: Path) -> None:
    history = [
        {"epoch": 1, "test_error": 0.0699, "val_error": 0.07},
        {"epoch": 2, "test_error": 0.014, "val_error": 0.0138},
        {"epoch": 3, "test_error": 0.0106, "val_error": 0.014},
    ]
    card = {
        "name": "capsnet-em-mnist",
        "training": {
            "epochs": 2,
            "history": history,
            "train_config": {"preset": "small"},
            "checkpoint": {"file": "best_val.pt"},
        },
    }
    summary = mnist_models.training_summary(card)
    assert summary is not None
    assert summary["test_error_by_epoch"] == [0.0699, 0.014, 0.0106] and summary["val_error_by_epoch"][1] == 0.0138
    assert mnist_models.tested_on(64) == ", on the first 64 test digits only" and mnist_models.tested_on(10_000) == ""
    assert summary["curve"] == "docs/training/capsnet-em-mnist/training_curve.png"  # the bundled model's, committed
    assert mnist_models.training_summary({"name": "x"}) is None  # a card without its run: no paragraph
    int8 = {**card, "name": "capsnet-em-mnist-int8", "quantization": {"method": "percentile"}, "parent": {"name": "p"}}
    assert mnist_models.training_summary(int8) == {"quantized_from": "p"}  # its parent's run is not repeated
    assert mnist_models.training_summary({"name": "x", "training": {"history": history}})["curve"] is None
    ctx = context(tmp_path)
    em = {"name": "capsnet-em-mnist", "architecture": "em", "parameters": 68444, "routing": {}, "training": summary}
    q = {"name": "q8", "architecture": "em", "routing": {}, "training": {"quantized_from": "capsnet-em-mnist"}}
    saved = common.save_result(ctx, "mnist_models", {"zoo": "z", "models": [em, q]}, {})
    text = mnist_models.render_mnist_models(ctx, saved, None)
    assert "**q8**: the static int8 quantization of `capsnet-em-mnist` (no training of its own)." in text
    assert (
        "**capsnet-em-mnist** (small preset, 68,444 parameters): epoch 2, the epoch with the lowest validation " in text
    )
    assert (
        "Test error by epoch (%): 6.99, 1.40, 1.06." in text
        and "(%, held-out training images): 7.00, 1.38, 1.40." in text
    )
    assert "moving average" not in text and summary["averaged"] is None
    history[1]["ema"] = history[2]["ema"] = 0.999  # the errors of epochs 2-3 are the weight average's
    averaged = mnist_models.training_summary(card)
    assert averaged is not None and averaged["averaged"].startswith("Epochs 2–3: test and validation errors are")
    link = Path(text.split("![training curve of capsnet-em-mnist](")[1].split(")")[0])
    assert (ctx.out / link).resolve() == (common.REPO_ROOT / summary["curve"]).resolve()


def test_a_warm_started_run_names_the_model_it_began_from(tmp_path: Path) -> None:
    init = {"path": "/x/model/zoo/parent", "name": "parent-mnist", "version": "3", "capsnet_onnx_sha256": "ab"}
    card = {
        "name": "capsnet-mnist",
        "training": {
            "epochs": 1,
            "history": [{"epoch": 1, "test_error": 0.0033}],
            "checkpoint": {"file": "best.pt"},
            "init_from": init,
        },
    }
    summary = mnist_models.training_summary(card)
    model = {"name": "capsnet-mnist", "architecture": "dynamic", "parameters": 5, "routing": {}, "training": summary}
    ctx = context(tmp_path)
    text = mnist_models.render_mnist_models(ctx, common.save_result(ctx, "mnist_models", {"models": [model]}, {}), None)
    assert "(5 parameters, started from `parent-mnist` version 3): epoch 1, the epoch with the lowest test" in text
    assert mnist_models.started_from("runs/a") == "`runs/a`"  # an older card's bare path
    assert mnist_models.started_from({"path": "runs/b"}) == "`runs/b`"


@pytest.mark.parametrize("multimnist", [False, True])
def test_costs_counts_what_the_report_trains(multimnist: bool) -> None:
    exp = costs.Experiment("t", "dynamic", 36 if multimnist else 28, {}, multimnist=multimnist, preset="tiny")
    row = costs.measure(exp, batch=2, seconds=0.01, amp=False)
    size = (1, exp.canvas, exp.canvas)
    counted = compute.model_costs("dynamic", CapsNetConfig.tiny(image_size=exp.canvas).to_dict(), size)
    if multimnist:  # a second reconstruction per image
        assert row["train_flops_per_image"] > counted["train_flops_per_image"]
    else:
        assert row["train_flops_per_image"] == counted["train_flops_per_image"]
    assert row["images_per_s"] > 0
    assert row["parameters"] == count_parameters(CapsNet(CapsNetConfig.tiny(image_size=exp.canvas)))


def test_sections_say_where_their_models_trained() -> None:
    cpu = {"cpu_model": "AMD EPYC", "cpu_count": 2, "torch_threads": 1, "nice": 19, "load_average": [12.5, 9.0, 8.0]}
    assert compute.trained_on(cpu) == (
        "2 CPUs (AMD EPYC), 1 torch thread, at nice 19; load average 12.5 when the result was saved"
    )
    assert (
        compute.trained_on({"processor": "x86", "cpu_count": 8, "torch_threads": 8}) == "8 CPUs (x86), 8 torch threads"
    )
    assert compute.trained_on({**cpu, "gpu": "NVIDIA A100"}) == "a NVIDIA A100 GPU"


def test_update_rewrites_only_the_named_sections_and_keeps_the_rest(
    synthetic_mnist: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("CAPSNET_DATA_DIR", raising=False)  # about the CLI without MNIST: not the environment's
    out = tmp_path / "docs"
    base = ["--tiny", "--out", str(out), "--zoo", str(tmp_path / "zoo"), "--device", "cpu"]
    update = [*base, "--data-dir", str(synthetic_mnist), "--sections", "baseline", "--update"]
    assert build.main(update) == 2
    assert f"there is no {out / 'REPORT.md'}" in capsys.readouterr().err
    assert build.main([*base, "--sections", "none"]) == 0
    report = out / "REPORT.md"
    hand_written = "## 8. Written by hand\n\nKept as it is.\n"
    report.write_text(report.read_text() + "\n" + hand_written)
    before = report.read_text()
    assert build.main(update) == 0
    after = report.read_text()
    assert "baseline CNN (this run)" in after and after.endswith(hand_written)
    assert after.split("## 2.")[0] == before.split("## 2.")[0]  # the header and section 1 untouched
    assert after.split("## 3.")[1] == before.split("## 3.")[1]  # and everything after section 2
    report.write_text(before.replace("## 4. MultiMNIST", "## 4. Renamed"))
    assert build.main([*update[:-2], "multimnist", "--update"]) == 2
    assert "has no section '## 4. MultiMNIST' to rewrite" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        build.main([*base, "--sections", "none", "--update"])
    assert "--update needs --sections naming the sections to rewrite" in capsys.readouterr().err


def test_progress_says_how_far_a_run_got_inside_its_next_epoch(tmp_path: Path) -> None:
    rows = [{"epoch": 1, "seconds": 1800.0}]
    between = compute.progress(rows, 4, 100, 1000, (tmp_path, 32))  # no last.pt: nothing inside an epoch
    assert "next_epoch" not in between and between["train_hours"] == 0.5 and between["images_done"] == 100
    save_checkpoint(tmp_path / "last.pt", {"epoch": 1, "mid_epoch": {"step": 3, "ranks": [{"seconds": 900.0}]}})
    inside = compute.progress(rows, 4, 100, 1000, (tmp_path, 32))
    assert inside["next_epoch"] == {"steps_done": 3, "steps": 4, "hours": 0.25}  # ceil(100 / 32) steps per epoch
    assert compute.progress_line("CNN", inside) == (
        "CNN: **unfinished**, 1 of 4 epochs of 100 images (100 of 400 training images) in 0.50 h of training, "
        "and 3 of the 4 steps of epoch 2 (0.25 h)."
    )
    assert "next_epoch" not in compute.progress(rows * 4, 4, 100, 1000, (tmp_path, 32))  # finished


def test_multimnist_section_renders_a_partial_run_with_its_composites_per_epoch(
    synthetic_mnist: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    for module in (common, loop):
        monkeypatch.setattr(module, "within_budget", lambda deadline, last: deadline is not None and last is None)
    ctx = context(tmp_path, synthetic_mnist)
    ctx.sizes = replace(Sizes.tiny(), epochs=2, epoch_images=24, test_subset=16)
    ctx.runs, ctx.deadline = tmp_path / "runs", time.monotonic() + 3600
    with pytest.raises(common.Unfinished) as stopped:
        multimnist_section.run_multimnist(ctx)
    assert stopped.value.partial is not None
    result, arrays = stopped.value.partial
    assert result["config"]["composites_per_epoch"] == 24 and result["history"][0]["test_n"] == 16
    text = multimnist_section.render_multimnist(ctx, common.save_result(ctx, "multimnist", result, arrays), None)
    assert "2 epochs of 24 composites per epoch, each epoch's from 24 training digits sampled afresh" in text
    assert (
        "each of the first 16 test digits" in text and "CapsNet: **unfinished**, 1 of 2 epochs of 24 composites" in text
    )
    assert "| CapsNet (this run) | 239,008 | 1 | 24 |" in text and "**Partial result.**" in text
    assert "**What is left.**" not in text  # the run itself is unfinished: the partial note says how to go on
    result["progress"] |= {"finished": True, "epochs_planned": 1}
    text = multimnist_section.render_multimnist(ctx, common.save_result(ctx, "multimnist", result, arrays), None)
    assert "**What is left.** 24 of the paper's 60,000,000 training composites are done (1/2,500,000 of them)" in text
    assert "**Partial result.**" not in text and "--epochs 2" in text


def test_further_note_doubles_the_epochs_and_estimates_the_time() -> None:
    prog = {"epochs_planned": 10, "epochs_done": 10, "train_hours": 0.83}
    note = compute.further_note("python -m training.report --epochs 10 --runs r", prog, "More is left.")
    assert note.startswith("**What is left.** More is left. `python -m training.report --epochs 20 --runs r` trains")
    assert "trains 10 more epochs" in note and "about 0.8 h more of training" in note
    assert "`python -m training.report --runs r --epochs 20`" in compute.further_note(
        "python -m training.report --runs r", prog, ""
    )
    fresh = compute.further_note("python -m training.report --epochs=10 --max-minutes 30", prog, "")
    assert "`python -m training.report --epochs 20 --max-minutes 30` trains all 20 epochs from the start" in fresh
    assert "about 1.7 h more of training" in fresh and "is repeated until it exits 0" in fresh
    assert compute.closing_note("c", {**prog, "finished": True}, None) == []  # finished, nothing short: no note
    assert compute.closing_note("c", {**prog, "finished": False}, None)[0].startswith("**Partial result.**")


def test_a_result_is_partial_while_any_of_its_models_is_unfinished(tmp_path: Path) -> None:
    ctx = context(tmp_path)

    def saved(result: dict[str, Any]) -> common.Saved:
        return common.save_result(ctx, "affine", result, {})

    assert common.is_partial(saved({"progress": {"finished": False}}))
    assert not common.is_partial(saved({"progress": {"finished": True}}))
    models = {"baseline": {"progress": {"finished": True}}, "dynamic": {"progress": {"finished": False}}}
    assert common.is_partial(saved({"models": models, "histories": {}}))
    models["dynamic"]["progress"]["finished"] = True
    assert not common.is_partial(saved({"models": models, "histories": {}}))
    assert not common.is_partial(saved({"models": [{"name": "capsnet-mnist"}]}))  # section 1's list of models


@pytest.mark.parametrize("best, below_paper", [(0.95, True), (0.995, False)])
def test_the_affine_section_gives_each_models_last_epoch_and_flags_a_low_match_point(
    tmp_path: Path, best: float, below_paper: bool
) -> None:
    def rows(accs: list[float]) -> list[dict[str, Any]]:
        return [
            {"epoch": i + 1, "test_error": 1 - a, "affine_error": 1 - a / 2, "affine_n": 10} for i, a in enumerate(accs)
        ]

    histories = {"baseline": rows([0.9, best]), "dynamic": rows([0.94, best, 0.999])}
    models = {arch: {"parameters": 1, "inference_flops_per_image": 1e9} for arch in histories}
    result = {"histories": histories, "models": models, "matched": affine.match_accuracy(histories)}
    ctx = context(tmp_path)
    text = affine.render_affine(ctx, common.save_result(ctx, "affine", result, {}), None)
    assert ("below the paper's match point" in text) is below_paper
    assert "Each model's last epoch:" in text and "| CapsNet | 3 | 99.90% | 49.95% |" in text
    assert "**What is left.**" not in text  # without the runs' progress nothing is said about going on
    done = {"epochs_planned": 3, "epochs_done": 3, "images_per_epoch": 60, "images_done": 180}
    train = {"epochs": 3, "batch_size": 8, "lr": 0.001, "lr_decay": 0.96}
    for arch in models:
        models[arch] |= {
            "progress": {**done, "images_planned": 180, "train_hours": 0.25, "finished": True},
            "model_config": {},
            "train_config": train,
            "train_flops_per_image": 1e9,
        }
    result["train_digits"] = 60
    saved = common.save_result(ctx, "affine", result, {})
    saved.command = "python -m training.report --sections affine --runs runs --epochs 3 --max-minutes 30"
    text = affine.render_affine(ctx, saved, None)
    assert ("**What is left.** The models are compared at 95.00% MNIST accuracy" in text) is below_paper
    assert ("`python -m training.report --sections affine --runs runs --epochs 6 --max-minutes 30`" in text) is (
        below_paper
    )


# --- evaluating every N epochs (--eval-every) -------------------------------------------------------------------


def test_match_accuracy_and_the_affine_section_use_evaluated_epochs_only(tmp_path: Path) -> None:
    """Epochs without test columns (not evaluated) are neither matched, tabled nor drawn."""

    def rows(accs: list[float | None]) -> list[dict[str, Any]]:
        return [
            {"epoch": i + 1, "train_loss": 0.1}
            if a is None
            else {"epoch": i + 1, "train_loss": 0.1, "test_error": 1 - a, "affine_error": 1 - a / 2, "affine_n": 10}
            for i, a in enumerate(accs)
        ]

    histories = {"baseline": rows([None, 0.95, None, 0.97]), "dynamic": rows([None, 0.96, None])}
    matched = affine.match_accuracy(histories)
    assert matched is not None and matched["target_mnist_accuracy"] == pytest.approx(0.96)
    assert matched["picks"]["baseline"]["epoch"] == 4 and matched["picks"]["dynamic"]["epoch"] == 2
    assert affine.match_accuracy({"baseline": rows([0.9]), "dynamic": rows([None])}) is None
    models = {arch: {"parameters": 1, "inference_flops_per_image": 1e9} for arch in histories}
    ctx = context(tmp_path)
    result = {"histories": histories, "models": models, "matched": matched}
    text = affine.render_affine(ctx, common.save_result(ctx, "affine", result, {}), None)
    assert "Each model's last evaluated epoch:" in text and "| CapsNet | 2 | 96.00% | 48.00% |" in text
    assert (ctx.figures / "affine_vs_mnist.png").stat().st_size > 1000
    waiting = {"histories": {"baseline": histories["baseline"], "dynamic": rows([None])}, "models": {}}
    text = affine.render_affine(ctx, common.save_result(ctx, "affine", waiting | {"matched": None}, {}), None)
    assert "No comparison yet: CapsNet has no epoch evaluated." in text and "The evaluated epochs so far:" in text
    assert "| Baseline CNN | 2 |" in text and "| Baseline CNN | 1 |" not in text


def test_the_compute_sentences_say_how_often_the_models_were_evaluated() -> None:
    train = {"epochs": 8, "batch_size": 128, "lr": 0.001, "lr_decay": 0.99, "test_subset": 2000}
    costs = {"train_flops_per_image": 10**9, "inference_flops_per_image": 10**9}
    assert "evaluated after every epoch on the first 2,000" in compute.compute_sentence(train, 60_000, costs)
    sentence = compute.compute_sentence(train | {"eval_every": 4}, 60_000, costs)
    assert "evaluated every 4 epochs and wherever training stopped on the first 2,000 test digits" in sentence


def test_report_cli_passes_eval_every_to_the_trainings(synthetic_mnist: Path, tmp_path: Path) -> None:
    parser = build.build_parser()
    assert build.sizes_from(parser, parser.parse_args(["--tiny"])).eval_every == 1
    ctx = context(tmp_path, synthetic_mnist)
    ctx.sizes = build.sizes_from(parser, parser.parse_args(["--tiny", "--eval-every", "3"]))
    assert common.train_config(ctx, "baseline").eval_every == 3 == affine.affine_config(ctx, "dynamic").eval_every


@pytest.mark.parametrize("section", ["baseline", "multimnist"])
def test_sections_train_with_eval_every_and_render_the_epochs_not_evaluated(
    section: str, synthetic_mnist: Path, tmp_path: Path
) -> None:
    """Three epochs, every 2nd evaluated: epoch 1 has no test error; the last is always evaluated."""
    ctx = context(tmp_path, synthetic_mnist)
    ctx.sizes = replace(Sizes.tiny(), epochs=3, eval_every=2, test_subset=16)
    runner, render = {
        "baseline": (baseline.run_baseline, baseline.render_baseline),
        "multimnist": (multimnist_section.run_multimnist, multimnist_section.render_multimnist),
    }[section]
    result, arrays = runner(ctx)
    assert [row.get("test_n") for row in result["history"]] == [None, 16, 16]
    config = result["train_config"] if section == "baseline" else result["config"]
    assert config["eval_every"] == 2
    text = render(ctx, common.save_result(ctx, section, result, arrays), None)
    assert "every 2 epochs and wherever training stopped" in text and "after every epoch" not in text
    if section == "baseline":
        assert [p["epoch"] for p in baseline.cumulative(result["history"], 64, 10**9)] == [2, 3]
        assert "| baseline CNN (this run) | 53,038 | 0.01 | 192 |" in text  # its last point: 3 epochs of 64
    else:
        assert result["test_epoch"] == 3 and "| CapsNet (this run) | 239,008 | 3 |" in text
        del result["history"][-1]["test_error"]  # a run stopped after an epoch it did not evaluate
        result |= multimnist_section.last_tested(result["history"])
        text = render(ctx, common.save_result(ctx, section, result, arrays), None)
        assert "| CapsNet (this run) | 239,008 | 3 (tested after epoch 2) |" in text

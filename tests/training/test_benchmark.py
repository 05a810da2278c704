"""The training benchmark script runs and prints its figures (speed itself is never asserted)."""

from __future__ import annotations

import json

import pytest

from training import benchmark


def test_benchmark_prints_machine_and_rates(capsys: pytest.CaptureFixture[str]) -> None:
    args = ["--preset", "tiny", "--device", "cpu", "--batch-size", "4", "--train-steps", "1", "--seconds", "0.05"]
    assert benchmark.main(args) == 0
    result = json.loads(capsys.readouterr().out)
    assert result["machine"]["device"] == "cpu"
    for key in ("train_images_per_s_batch4", "infer_images_per_s_batch1", "infer_images_per_s_batch128"):
        assert result[key] > 0, key
    ort = result["ort_float32_infer_images_per_s_batch32"]
    assert ort > 0
    assert result["train_to_ort_ratio"] == pytest.approx(result["train_images_per_s_batch4"] / ort, rel=0.01, abs=1e-3)


def test_em_benchmark_prints_the_comparison_with_the_dynamic_model(capsys: pytest.CaptureFixture[str]) -> None:
    args = ["--arch", "em", "--preset", "tiny", "--device", "cpu", "--batch-size", "2", "--train-steps", "1"]
    assert benchmark.main([*args, "--seconds", "0.02", "--routing-iterations", "3"]) == 0
    result = json.loads(capsys.readouterr().out)
    assert result["routing_iterations"] == 3  # the paper's count, not the trained default (2)
    cmp = result["em_vs_dynamic"]
    assert set(cmp["train_images_per_s_batch32"]) == {"em", "dynamic"}
    assert list(cmp["onnx_images_per_s_em"]) == [str(b) for b in benchmark.ORT_BATCHES]
    assert all(v > 0 for v in cmp["onnx_images_per_s_em"].values())
    best = cmp["onnx_images_per_s_em"][str(cmp["onnx_best_batch_em"])]
    assert cmp["onnx_ratio"] == pytest.approx(best / cmp["onnx_images_per_s_dynamic_batch32"], abs=1e-3)
    assert cmp["targets"] == {"train_ratio": 0.15, "onnx_ratio": 0.14}

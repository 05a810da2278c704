"""The training benchmark script runs and prints its figures (speed itself is never asserted)."""

from __future__ import annotations

import json

import pytest

from training.benchmarks import speed as benchmark


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


def test_benchmark_tunes_malloc_as_training_does_unless_asked_not_to(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    calls: list[str] = []
    monkeypatch.setattr(benchmark, "keep_freed_memory", lambda: calls.append("tuned") or True)
    args = ["--preset", "tiny", "--device", "cpu", "--batch-size", "2", "--train-steps", "1", "--seconds", "0.02"]
    assert benchmark.main(args) == 0
    assert json.loads(capsys.readouterr().out)["malloc"] == "tuned as capsnet-train (keep_freed_memory)"
    assert benchmark.main([*args, "--glibc-malloc-defaults"]) == 0
    assert json.loads(capsys.readouterr().out)["malloc"] == "glibc defaults"
    assert calls == ["tuned"]
    monkeypatch.setattr(benchmark, "keep_freed_memory", lambda: False)  # another C library: nothing tuned
    assert benchmark.main(args) == 0
    assert json.loads(capsys.readouterr().out)["malloc"] == "the C library's defaults (not glibc)"


def test_em_benchmark_prints_the_comparison_with_the_dynamic_model(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(benchmark, "usable_cpus", lambda: 2)  # parallel callers even on one core
    args = ["--arch", "em", "--preset", "tiny", "--device", "cpu", "--batch-size", "2", "--train-steps", "1"]
    assert benchmark.main([*args, "--seconds", "0.02", "--routing-iterations", "3"]) == 0
    result = json.loads(capsys.readouterr().out)
    assert result["routing_iterations"] == 3  # the paper's count, not the trained default (2)
    cmp = result["em_vs_dynamic"]
    assert set(cmp["train_images_per_s_batch32"]) == {"em", "dynamic"}
    assert list(cmp["onnx_images_per_s_em"]) == [str(b) for b in benchmark.ORT_BATCHES]
    assert all(v > 0 for v in cmp["onnx_images_per_s_em"].values())
    assert list(cmp["onnx_images_per_s_em_parallel"]) == [str(b) for b in benchmark.PARALLEL_BATCHES]
    assert cmp["onnx_parallel_callers"] == 2 and cmp["onnx_images_per_s_dynamic_batch32_parallel"] > 0
    # each model at its best: EM over batches and both modes, the dynamic model at batch 32 in either mode
    modes = {"serial": cmp["onnx_images_per_s_em"], "parallel": cmp["onnx_images_per_s_em_parallel"]}
    best_em = modes[cmp["onnx_best_em"]["mode"]][str(cmp["onnx_best_em"]["batch"])]
    assert best_em == max(v for rates in modes.values() for v in rates.values())
    dynamic = max(cmp["onnx_images_per_s_dynamic_batch32"], cmp["onnx_images_per_s_dynamic_batch32_parallel"])
    assert cmp["onnx_ratio"] == pytest.approx(best_em / dynamic, abs=1e-3)
    serial = max(cmp["onnx_images_per_s_em"].values()) / cmp["onnx_images_per_s_dynamic_batch32"]
    assert cmp["onnx_ratio_serial"] == pytest.approx(serial, abs=1e-3)
    assert cmp["targets"] == {"train_ratio": 0.15, "onnx_ratio": 0.14}
    assert cmp["onnx_rounds"] == benchmark.ORT_ROUNDS and len(cmp["onnx_ratio_per_round"]) == benchmark.ORT_ROUNDS
    assert max(cmp["onnx_ratio_per_round"]) > 0


def test_em_rates_are_the_best_of_alternated_rounds(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Each rate is its best round; the rounds alternate between the models, and each round's ratio is kept."""
    monkeypatch.setattr(benchmark, "usable_cpus", lambda: 2)
    calls: list[tuple[str, int]] = []
    em_rates = iter([100.0, 300.0, 200.0])  # EM at its one parallel batch, round by round
    dynamic_rates = iter([1000.0, 1000.0, 2000.0])

    def parallel(self: benchmark.OnnxTimer, batch: int, seconds: float, callers: int) -> float:
        name = "dynamic" if batch == 32 else "em"
        calls.append((name, batch))
        return next(dynamic_rates) if name == "dynamic" else next(em_rates)

    monkeypatch.setattr(benchmark, "PARALLEL_BATCHES", (1,))
    monkeypatch.setattr(benchmark.OnnxTimer, "serial", lambda self, batch, seconds: 1.0)
    monkeypatch.setattr(benchmark.OnnxTimer, "parallel", parallel)
    args = ["--arch", "em", "--preset", "tiny", "--device", "cpu", "--batch-size", "2", "--train-steps", "1"]
    assert benchmark.main([*args, "--seconds", "0.01", "--rounds", "3"]) == 0
    cmp = json.loads(capsys.readouterr().out)["em_vs_dynamic"]
    assert calls == [("em", 1), ("dynamic", 32)] * 3  # alternated, round by round
    assert cmp["onnx_images_per_s_em_parallel"] == {"1": 300.0}
    assert cmp["onnx_images_per_s_dynamic_batch32_parallel"] == 2000.0
    assert cmp["onnx_ratio"] == 0.15  # best of each: 300 / 2000
    assert cmp["onnx_ratio_per_round"] == [0.1, 0.3, 0.1]


def test_rounds_below_1_are_a_usage_error(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exc:
        benchmark.main(["--arch", "em", "--rounds", "0"])
    assert exc.value.code == 2
    assert "--rounds must be at least 1, got 0" in capsys.readouterr().err


def test_cpu_time_mode_runs_on_one_thread_and_says_so(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    threads: list[int | None] = []
    create = benchmark.create_session
    monkeypatch.setattr(benchmark, "create_session", lambda g, p, t=None: threads.append(t) or create(g, p, t))
    monkeypatch.setattr(benchmark.torch, "set_num_threads", lambda n: threads.append(n))
    args = ["--preset", "tiny", "--device", "cpu", "--batch-size", "2", "--train-steps", "1", "--seconds", "0.02"]
    assert benchmark.main([*args, "--cpu-time"]) == 0
    result = json.loads(capsys.readouterr().out)
    assert result["clock"] == "cpu, 1 thread"
    assert result["train_images_per_s_batch2"] > 0 and result["peak_rss_gib_after_training"] > 0
    assert threads == [1, 1]  # torch, then the ONNX Runtime session


def test_ort_profile_prints_only_the_profile(capsys: pytest.CaptureFixture[str]) -> None:
    assert benchmark.main(["--arch", "em", "--preset", "tiny", "--ort-profile", "1", "2"]) == 0
    result = json.loads(capsys.readouterr().out)
    assert set(result) == {"arch", "preset", "ort_profile"}
    assert list(result["ort_profile"]) == ["1", "2"]
    for profile in result["ort_profile"].values():
        shares = profile["nodes"]
        assert 0 < len(shares) <= benchmark.PROFILE_TOP and 0.0 < sum(shares.values()) <= 1.0 + 1e-6
        assert list(shares.values()) == sorted(shares.values(), reverse=True)
        assert any(k.startswith("MatMul [") for k in shares)  # the vote and routing products
        assert profile["kernel_ms_per_run"] > 0 and profile["images_per_cpu_s_while_profiling"] > 0


def test_ort_profile_rejects_a_batch_below_1(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exc:
        benchmark.main(["--ort-profile", "0"])
    assert exc.value.code == 2
    assert "--ort-profile batches must be at least 1, got 0" in capsys.readouterr().err


def test_em_comparison_when_parallel_callers_are_faster(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(benchmark, "usable_cpus", lambda: 2)
    # far above any real rate, so parallel is the best mode for both models even on a fast, quiet machine
    # (at 1e6 the tiny dynamic model's serial rate sometimes beat its faked 31,250 img/s and the ratio's base moved)
    monkeypatch.setattr(benchmark.OnnxTimer, "parallel", lambda self, batch, s, c: 1e9 / batch)
    args = ["--arch", "em", "--preset", "tiny", "--device", "cpu", "--batch-size", "2", "--train-steps", "1"]
    assert benchmark.main([*args, "--seconds", "0.02"]) == 0
    cmp = json.loads(capsys.readouterr().out)["em_vs_dynamic"]
    assert cmp["onnx_best_em"] == {"mode": "parallel", "batch": 1}
    assert cmp["onnx_images_per_s_dynamic_batch32_parallel"] > cmp["onnx_images_per_s_dynamic_batch32"]
    assert cmp["onnx_ratio"] == pytest.approx(1e9 / cmp["onnx_images_per_s_dynamic_batch32_parallel"], abs=1e-3)
    serial = cmp["onnx_images_per_s_em"]
    assert cmp["onnx_largest_batch_vs_best"] == pytest.approx(serial["64"] / max(serial.values()), abs=1e-3)

"""The load benchmark runs end to end on tiny models and prints its tables (speed itself is never asserted)."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import numpy as np
import pytest

from service import benchmark, loadgen
from service.flops import GemmProbe, onnx_flops_per_image
from service.runtime.repository import scan_repository
from tests.service.conftest import NO_DECODER, TINY
from tests.service.live_server import running_server

EXTERNAL = [d for d in ("hey", "wrk") if shutil.which(d)]


@pytest.mark.slow
def test_benchmark_prints_raw_and_service_tables(
    model_repository: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "bench.json"
    args = ["--model-repository", str(model_repository), "--models", f"{TINY},{NO_DECODER}", "--threads", "1",
            "--batches", "1,4", "--kinds", "v1-png,v2-binary,grpc", "--drivers", "python", "--concurrency", "1,4",
            "--duration", "0.4", "--rounds", "2", "--json", str(out)]  # fmt: skip
    benchmark.main(args)
    text = capsys.readouterr().out
    assert "| model | raw ONNX Runtime batch |" in text and "| model | request | driver | concurrency |" in text
    assert "load generators: python: built-in asyncio client" in text
    assert f"{TINY}, v1 PNG via python at concurrency 1: p50" in text
    assert f"served v1 PNG at concurrency 4 via python: {NO_DECODER}" in text
    assert "of this machine's float32 GEMM rate" in text
    assert f"{TINY}, gRPC via python at concurrency 1: p50" in text and "(target <= +0.5 ms)" in text
    assert f"{TINY}, gRPC at concurrency 4:" in text and "(target >= 0.85)" in text
    result = json.loads(out.read_text())
    assert [(r["model"], r["batch"]) for r in result["raw"]] == [(m, b) for m in (TINY, NO_DECODER) for b in (1, 4)]
    assert result["command"].startswith("python -m service.benchmark --model-repository") and result["produced_at"]
    cells = [(h["model"], h["kind"], h["concurrency"]) for h in result["http"]]
    assert cells == [(m, k, c) for m in (TINY, NO_DECODER) for k in ("v1-png", "v2-binary", "grpc") for c in (1, 4)]
    assert all(h["errors"] == 0 and h["throughput"] > 0 and h["raw_cpu_ms"] > 0 for h in result["http"])
    if os.path.exists("/proc/self/stat"):
        assert all(h["server_cpu_ms"] > 0 for h in result["http"])
    if os.path.exists("/proc/self/status"):
        assert result["server_peak_rss_mib"] > 10


@pytest.mark.slow
@pytest.mark.skipif(not EXTERNAL, reason="neither hey nor wrk is installed (apt-get install hey wrk)")
@pytest.mark.parametrize("kind", [k for k in loadgen.KINDS if k != "grpc"])  # gRPC: the built-in client only
def test_outside_drivers_send_every_request_kind(model_repository: Path, kind: str) -> None:
    """hey and wrk, run as subprocesses, get 200s for each request kind (a wrong body or header would not)."""
    card = next(m.card for m in scan_repository(model_repository) if m.name == TINY)
    assert card is not None
    with running_server(model_repository) as (base, _):
        port = int(base.rsplit(":", 1)[1])
        for driver in EXTERNAL:
            result = loadgen.run_load(driver, "127.0.0.1", port, loadgen.payload(card, kind), 2, 1.0)
            assert result.requests > 0 and result.errors == 0, (driver, result)
            if driver == "wrk":
                assert result.percentiles_ms is not None and result.percentiles_ms["p50"] > 0
            else:
                assert len(result.latencies_s) == result.requests


def test_absent_tools_are_skipped_and_named(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(loadgen.shutil, "which", lambda name: None)
    usable, notes = loadgen.available_drivers(["python", "hey", "wrk"])
    assert usable == ["python"]
    assert notes["hey"] == "not installed, skipped (apt-get install hey)"
    assert notes["wrk"] == "not installed, skipped (apt-get install wrk)"


def test_unknown_kind_or_driver_is_a_usage_error(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_info:
        benchmark.parse_args(["--drivers", "ab"])
    assert exit_info.value.code == 2
    assert "unknown request kind or driver ['ab']" in capsys.readouterr().err


def test_flops_of_a_graph_and_the_gemm_probe(model_repository: Path) -> None:
    pytest.importorskip("onnx")
    flops, note = onnx_flops_per_image(model_repository / TINY / "capsnet.onnx")
    assert flops is not None and flops > 0 and note.startswith("counted with onnx shape inference")
    probe = GemmProbe(size=64)
    probe.run(0.01)
    assert np.isfinite(probe.best_gflops) and probe.best_gflops > 0


def test_cpu_busy_percent_from_two_proc_stat_samples(monkeypatch: pytest.MonkeyPatch) -> None:
    samples = iter(["cpu  100 0 100 700 100 0 0 0 0 0\ncpu0 …", "cpu  250 0 150 800 100 0 0 0 0 0\ncpu0 …"])

    class FakePath:
        def __init__(self, path: str) -> None:
            assert path == "/proc/stat"

        def read_text(self) -> str:
            return next(samples)

    monkeypatch.setattr(benchmark, "Path", FakePath)
    assert benchmark.cpu_busy_percent(seconds=0.0) == 66.7  # 200 busy of 300 jiffies
    monkeypatch.setattr(benchmark, "Path", lambda path: (_ for _ in ()).throw(OSError("no /proc")))
    assert benchmark.cpu_busy_percent(seconds=0.0) is None

"""The load benchmark runs end to end on a tiny model and prints its tables (speed itself is never asserted)."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from service import benchmark


@pytest.mark.slow
def test_benchmark_prints_raw_and_service_tables(
    model_repository: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "bench.json"
    args = ["--model-repository", str(model_repository), "--model", "tiny", "--threads", "1", "--batches", "1,4",
            "--concurrency", "1,4", "--duration", "0.4", "--rounds", "2", "--json", str(out)]  # fmt: skip
    benchmark.main(args)
    text = capsys.readouterr().out
    assert "| raw ONNX Runtime batch |" in text and "| HTTP concurrency |" in text and "| gRPC concurrency |" in text
    assert "HTTP, concurrency 1: service p50" in text and "gRPC, concurrency 1: service p50" in text
    result = json.loads(out.read_text())
    assert [r["batch"] for r in result["raw"]] == [1, 4]
    assert result["command"].startswith("python -m service.benchmark --model-repository") and result["produced_at"]
    for protocol in ("http", "grpc"):
        assert [h["concurrency"] for h in result[protocol]] == [1, 4]
        assert all(h["errors"] == 0 and h["throughput"] > 0 for h in result[protocol])
    if os.path.exists("/proc/self/status"):
        assert result["server_peak_rss_mib"] > 10
        assert "peak resident memory" in text


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

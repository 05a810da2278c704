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
    assert "| raw ONNX Runtime batch |" in text and "service concurrency" in text
    assert "concurrency 1: service p50" in text
    result = json.loads(out.read_text())
    assert [r["batch"] for r in result["raw"]] == [1, 4]
    assert result["command"].startswith("python -m service.benchmark --model-repository") and result["produced_at"]
    assert [h["concurrency"] for h in result["http"]] == [1, 4]
    assert all(h["errors"] == 0 and h["throughput"] > 0 for h in result["http"])
    if os.path.exists("/proc/self/status"):
        assert result["server_peak_rss_mib"] > 10
        assert "peak resident memory" in text

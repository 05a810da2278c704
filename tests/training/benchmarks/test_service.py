"""The load benchmark runs end to end on tiny models and prints its tables (speed itself is never asserted)."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import httpx
import pytest

from service.grpc import protocol
from service.runtime.card import ModelCard
from service.runtime.repository import scan_repository
from tests.service.conftest import NO_DECODER, TINY
from tests.service.live_server import free_port, running_server
from training.benchmarks import loadgen
from training.benchmarks import service as benchmark
from training.benchmarks.flops import FLOPS_NOTE, onnx_flops_per_image

EXTERNAL = [d for d in ("hey", "wrk") if shutil.which(d)]
H2LOAD = shutil.which("h2load")


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
    assert f"{TINY}, gRPC via python at concurrency 4:" in text and "(target >= 0.85)" in text
    result = json.loads(out.read_text())
    assert [(r["model"], r["batch"]) for r in result["raw"]] == [(m, b) for m in (TINY, NO_DECODER) for b in (1, 4)]
    assert result["command"].startswith("python -m training.benchmarks.service --model-repository")
    assert result["produced_at"]
    cells = [(h["model"], h["kind"], h["concurrency"]) for h in result["http"]]
    assert cells == [(m, k, c) for m in (TINY, NO_DECODER) for k in ("v1-png", "v2-binary", "grpc") for c in (1, 4)]
    assert all(h["errors"] == 0 and h["throughput"] > 0 and h["raw_cpu_ms"] > 0 for h in result["http"])
    assert all(h["driver_cpu_ms"] > 0 for h in result["http"])  # the built-in clients: this process's CPU time
    if os.path.exists("/proc/self/stat"):
        assert all(h["server_cpu_ms"] > 0 and h["loop_cpu_ms"] >= 0 for h in result["http"])
        assert all(h["loop_cpu_ms"] > 0 for h in result["http"] if h["kind"] == "v1-png")  # HTTP runs on the loop
        assert "| of which event loop (ms) | driver CPU per request (ms) |" in text
        assert f"{TINY}, gRPC via python at concurrency 4:" in text and "  CPU bound: " in text
    if os.path.exists("/proc/self/status"):
        assert result["server_peak_rss_mib"] > 10
    benchmark.main(["--from-json", str(out)])  # the saved run prints the same report, measuring nothing
    assert text.endswith(capsys.readouterr().out)


def test_a_missing_saved_run_is_a_usage_error(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_info:
        benchmark.main(["--from-json", str(tmp_path / "absent.json")])
    assert exit_info.value.code == 2
    assert f"--from-json {tmp_path / 'absent.json'}: no such file" in capsys.readouterr().err


@pytest.mark.slow
def test_benchmark_measures_parallel_runs_raw_and_served(
    model_repository: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Two threads: raw ONNX Runtime also with two callers on a single-thread session, the service with two
    parallel runs; each served row is judged against the better raw figure alongside."""
    out = tmp_path / "bench.json"
    args = ["--model-repository", str(model_repository), "--models", TINY, "--threads", "2", "--batches", "1,4",
            "--kinds", "v1-png", "--drivers", "python", "--concurrency", "1,4", "--duration", "0.4", "--rounds", "2",
            "--json", str(out)]  # fmt: skip
    benchmark.main(args)
    text = capsys.readouterr().out
    assert "| 4 ×2 callers, 1 thread |" in text and "parallel runs 2;" in text
    result = json.loads(out.read_text())
    assert [(r["model"], r["batch"]) for r in result["raw_parallel"]] == [(TINY, 1), (TINY, 4)]
    assert all(r["throughput"] > 0 for r in result["raw_parallel"])
    assert all(h["raw_parallel_throughput"] > 0 and h["errors"] == 0 for h in result["http"])


def test_parallel_runs_cannot_exceed_the_threads() -> None:
    with pytest.raises(SystemExit) as exit_info:
        benchmark.parse_args(["--threads", "1", "--parallel-runs", "2"])
    assert exit_info.value.code == 2


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
            assert result.driver_cpu_s is not None and result.driver_cpu_s > 0, (driver, result)  # the subprocess's
            if driver == "wrk":
                assert result.percentiles_ms is not None and result.percentiles_ms["p50"] > 0
            else:
                assert len(result.latencies_s) == result.requests


@pytest.mark.slow
@pytest.mark.skipif(H2LOAD is None, reason="h2load is not installed (apt-get install nghttp2-client)")
def test_h2load_drives_grpc_and_counts_grpc_errors(model_repository: Path) -> None:
    """h2load's calls are real ModelInfer successes (the server counts them OK); a message the server refuses stops
    the run before h2load starts, since h2load would take its HTTP 200 for a success."""
    card = next(m.card for m in scan_repository(model_repository) if m.name == TINY)
    assert card is not None
    grpc_port = free_port()
    with running_server(model_repository, CAPSNET_GRPC_PORT=str(grpc_port)) as (base, _):
        request = loadgen.payload(card, "grpc")
        result = loadgen.run_load("h2load", "127.0.0.1", grpc_port, request, 4, 1.0)
        assert result.requests > 0 and result.errors == 0 and len(result.latencies_s) == result.requests
        metrics = httpx.get(f"{base}/metrics").text
        ok = sum(
            float(line.rsplit(" ", 1)[1])
            for line in metrics.splitlines()
            if line.startswith("capsnet_http_requests_total{") and "/ModelInfer" in line and 'status="OK"' in line
        )
        # h2load's calls and the sample call; calls left in flight when the window ended may have finished too
        assert result.requests + 1 <= ok <= result.requests + 1 + 4
        assert loadgen.grpc_failures(metrics) == 0
        unknown = loadgen.Payload(request.path, request.content_type, infer_message_for(card, "no-such-model"))
        with pytest.raises(RuntimeError, match=r"a sample ModelInfer call to .* failed: NOT_FOUND: .*no-such-model"):
            loadgen.run_load("h2load", "127.0.0.1", grpc_port, unknown, 4, 1.0)
        assert loadgen.grpc_failures(httpx.get(f"{base}/metrics").text) == 1


def infer_message_for(card: ModelCard, model_name: str) -> bytes:
    message = protocol.ModelInferRequest.FromString(loadgen.payload(card, "grpc").body)
    message.model_name = model_name
    return bytes(message.SerializeToString())


def test_grpc_framing_and_failure_count() -> None:
    assert loadgen.grpc_frame(b"abc") == b"\x00\x00\x00\x00\x03abc"
    metrics = "\n".join(
        [
            'capsnet_http_requests_total{method="POST",protocol="grpc",route="/inference.GRPCInferenceService/'
            'ModelInfer",status="OK"} 40.0',
            'capsnet_http_requests_total{method="POST",protocol="grpc",route="/inference.GRPCInferenceService/'
            'ModelInfer",status="CANCELLED"} 4.0',
            'capsnet_http_requests_total{method="POST",protocol="grpc",route="/inference.GRPCInferenceService/'
            'ModelInfer",status="UNAVAILABLE"} 3.0',
            'capsnet_http_requests_total{method="POST",protocol="grpc",route="/inference.GRPCInferenceService/'
            'ModelMetadata",status="NOT_FOUND"} 5.0',
            'capsnet_http_requests_total{method="POST",protocol="http",route="/v2/models/{name}/infer",'
            'status="503"} 7.0',
        ]
    )
    assert loadgen.grpc_failures(metrics) == 3


def test_hey_is_timed_by_its_own_clock_not_the_subprocess() -> None:
    """The window runs from hey's start to its last response, not over its start-up and CSV output."""
    header = "response-time,DNS+dialup,DNS,Request-write,Response-delay,Response-read,status-code,offset\n"
    rows = ["0.0020,0,0,0,0,0,200,0.0010", "0.0030,0,0,0,0,0,503,1.9950", "0.0025,0,0,0,0,0,200,1.9990"]
    result = loadgen.hey_result(header + "\n".join(rows) + "\n", elapsed=2.2)
    assert (result.requests, result.errors) == (3, 1)
    assert result.seconds == pytest.approx(2.0015)  # the last response: offset 1.9990 + 0.0025
    assert result.latencies_s == [0.002, 0.003, 0.0025]
    nothing = loadgen.hey_result(header, elapsed=2.2)
    assert (nothing.requests, nothing.seconds) == (0, 2.2)


def test_cpu_bound_of_a_saturated_service() -> None:
    """Every CPU busy at the measured CPU per request bounds the rate; the target leaves a server CPU budget."""
    row = benchmark.HttpRow(
        model="m", kind="v1-png", driver="hey", concurrency=32, requests=100, errors=0, throughput=600.0, p50_ms=50.0,
        p99_ms=90.0, server_cpu_ms=3.0, raw_throughput=700.0, raw_cpu_ms=2.4, raw_batch1_p50_ms=None,
        raw_parallel_throughput=800.0, loop_cpu_ms=0.5, driver_cpu_ms=0.125,
    )  # fmt: skip
    (line,) = benchmark.cpu_bound_lines(row, cpus=2, target=0.8)
    # raw best is the serial 700 img/s (the parallel 800 is printed beside it, not judged against):
    # 2000 ms / 3.125 ms = 640 req/s = 0.91 × 700; at 0.8 × 700 = 560 req/s the server may use 3.571 - 0.125 ms
    assert "2 CPUs ÷ (server 3.00 + hey 0.12 ms per request) = 640.0 req/s = 0.91 × raw best" in line
    assert "(served: 94% of it); 0.8 × raw best needs <= 3.45 ms of server CPU per request" in line
    assert "(raw ONNX Runtime: 2.40 ms per image)" in line
    no_proc = benchmark.HttpRow(**{**row.__dict__, "server_cpu_ms": None})
    assert benchmark.cpu_bound_lines(no_proc, cpus=2, target=0.8) == []


def test_throughput_targets_are_judged_under_load_only() -> None:
    """A run at concurrency 1 alone gets its latency verdict, not a throughput one (the targets are for load)."""
    row = benchmark.HttpRow(
        model="m", kind="v1-png", driver="hey", concurrency=1, requests=100, errors=0, throughput=300.0, p50_ms=2.8,
        p99_ms=4.0, server_cpu_ms=4.0, raw_throughput=700.0, raw_cpu_ms=2.4, raw_batch1_p50_ms=1.7,
        raw_parallel_throughput=800.0, loop_cpu_ms=0.8, driver_cpu_ms=0.2,
    )  # fmt: skip
    result = {"http": [row], "raw": {}, "gemm": {}, "flops_per_image": {}, "machine": {"cpus_usable": 2}}
    lines = benchmark.summary_lines(result)
    latency = "m, v1 PNG via hey at concurrency 1: p50 2.80 ms vs raw batch-1 p50 1.70 ms: +1.10 ms (target <= +1.0 ms)"
    assert lines == [latency]
    loaded = benchmark.HttpRow(**{**row.__dict__, "concurrency": 32, "raw_batch1_p50_ms": None})
    lines = benchmark.summary_lines({**result, "http": [row, loaded]})
    assert lines[0] == (  # judged against the serial 700 img/s (the reference); the parallel 800 beside it
        "m, v1 PNG via hey at concurrency 32: 300.0 req/s = 0.43 × raw ONNX Runtime's best batched throughput "
        "alongside (700.0 img/s, one session) (target >= 0.8); 0.38 × raw with parallel callers (800.0 img/s)"
    )
    assert "CPU bound" in lines[1] and lines[2] == latency


def test_drivers_speak_their_kinds() -> None:
    assert [d for d in loadgen.DRIVERS if loadgen.drives(d, "grpc")] == ["python", "h2load"]
    assert [d for d in loadgen.DRIVERS if loadgen.drives(d, "v1-png")] == ["python", "hey", "wrk"]
    assert benchmark.drivers_for("grpc", ["hey", "wrk"]) == ["python"]  # gRPC is measured whatever was asked
    assert benchmark.drivers_for("v1-png", ["hey", "h2load"]) == ["hey"]
    with pytest.raises(ValueError, match="h2load drives gRPC requests only"):
        loadgen.run_load("h2load", "127.0.0.1", 1, loadgen.Payload("/v1/classify", "image/png", b""), 1, 0.1)


def test_absent_tools_are_skipped_and_named(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(loadgen.shutil, "which", lambda name: None)
    usable, notes = loadgen.available_drivers(["python", "hey", "wrk", "h2load"])
    assert usable == ["python"]
    assert notes["hey"] == "not installed, skipped (apt-get install hey)"
    assert notes["wrk"] == "not installed, skipped (apt-get install wrk)"
    assert notes["h2load"] == "not installed, skipped (apt-get install nghttp2-client)"


def test_unknown_kind_or_driver_is_a_usage_error(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_info:
        benchmark.parse_args(["--drivers", "ab"])
    assert exit_info.value.code == 2
    assert "unknown request kind or driver ['ab']" in capsys.readouterr().err


def test_flops_of_a_model_leave_nothing_out(model_repository: Path) -> None:
    pytest.importorskip("onnx")
    flops, note = onnx_flops_per_image(model_repository / TINY / "capsnet.onnx")
    assert flops is not None and flops > 0 and note == FLOPS_NOTE  # every product's shapes were known


def test_an_int8_model_is_compared_with_its_parent() -> None:
    """The int8 target compares a quantized model with the float32 model it came from (its card's parent), not with
    whichever model the run listed first; runs saved before parents were recorded fall back to the "-int8" name."""

    def served(model: str, throughput: float) -> benchmark.HttpRow:
        return benchmark.HttpRow(
            model=model, kind="v1-png", driver="wrk", concurrency=32, requests=100, errors=0, throughput=throughput,
            p50_ms=40.0, p99_ms=60.0, server_cpu_ms=3.0, raw_throughput=700.0, raw_cpu_ms=2.4,
            raw_batch1_p50_ms=None, raw_parallel_throughput=None, loop_cpu_ms=0.5, driver_cpu_ms=0.03,
        )  # fmt: skip

    rows = [served("a-em", 600.0), served("a-mnist", 650.0), served("q8", 1100.0)]
    result = {"http": rows, "raw": {"a-em": [], "a-mnist": [], "q8": []}, "gemm": {}, "flops_per_image": {}}
    result |= {"machine": {"cpus_usable": 2}, "parents": {"a-em": None, "a-mnist": None, "q8": "a-mnist"}}
    lines = [line for line in benchmark.summary_lines(result) if line.startswith("served v1 PNG")]
    assert lines == [
        "served v1 PNG at concurrency 32 via wrk: a-mnist 650.0 req/s = 1.08 × a-em (600.0 req/s)",
        "served v1 PNG at concurrency 32 via wrk: q8 1100.0 req/s = 1.69 × its parent a-mnist (650.0 req/s) "
        "(target >= 1.25)",
    ]
    del result["parents"]
    rows.append(served("a-mnist-int8", 900.0))
    result["raw"]["a-mnist-int8"] = []
    lines = [line for line in benchmark.summary_lines(result) if line.startswith("served v1 PNG") and "int8" in line]
    assert lines == [
        "served v1 PNG at concurrency 32 via wrk: a-mnist-int8 900.0 req/s = 1.38 × its parent a-mnist (650.0 req/s) "
        "(target >= 1.25)"
    ]

"""Section 7: the service under load, rendered from the JSON `python -m training.benchmarks.service --json` writes."""

from __future__ import annotations

import json
import logging
from datetime import datetime, timezone
from typing import Any

from training.report.common import (
    Context,
    figure,
    md_table,
    not_measured,
    rel,
    shown,
)

log = logging.getLogger(__name__)

SERVICE_LOAD_FILE = "service_load.json"  # written by the service's load benchmark, rendered when present


def cell(value: Any) -> str:
    return f"{value:,.2f}" if isinstance(value, float) else str(value)


def dict_rows(rows: list[dict[str, Any]]) -> str:
    headers = list(dict.fromkeys(k for x in rows for k in x))
    return md_table(headers, [[cell(x.get(h, "")) for h in headers] for x in rows])


def render_service(ctx: Context) -> str:
    """The service's load benchmark (`python -m training.benchmarks.service --json FILE`), when its JSON is here."""
    out = ["## 7. The service under load", ""]
    path = ctx.results / SERVICE_LOAD_FILE
    if not path.is_file():
        reason = (
            "The service's throughput and latency at concurrency 1–64 and its peak resident memory come from the "
            "service's load benchmark: run "
            f"`python -m training.benchmarks.service --json {shown(path)}` and rerun this command."
        )
        return not_measured(out, reason)
    data = json.loads(path.read_text())
    if not isinstance(data, dict):
        return not_measured(out, f"{shown(path)} is not the load benchmark's JSON object")
    produced = data.get("produced_at") or datetime.fromtimestamp(path.stat().st_mtime, timezone.utc).isoformat(
        timespec="seconds"
    )
    command = data.get("command") or "python -m training.benchmarks.service"
    out += [f"_Produced {produced} by `{command}`, saved as `{rel(ctx, path)}`._", ""]
    tables = {"http": "HTTP service, one image per request, by concurrency", "raw": "ONNX Runtime alone, by batch"}
    for key, title in tables.items():
        rows = data.get(key)
        if isinstance(rows, list) and rows and all(isinstance(x, dict) for x in rows):
            out += [f"**{title}**", "", dict_rows(rows), ""]
    memory = {k: v for k, v in data.items() if "rss" in k.lower()}
    if isinstance(memory.get("server_peak_rss_mib"), int | float):
        out += [
            f"Peak resident memory of the service process under this load: {memory['server_peak_rss_mib']:.0f} MiB.",
            "",
        ]
    else:
        out += ["Peak resident memory of the service under load: **not yet measured** (not in the JSON).", ""]
    http = data.get("http")
    if (
        isinstance(http, list)
        and len(http) > 1
        and all(isinstance(r, dict) and "p50_ms" in r and "throughput" in r for r in http)
    ):
        chart = ctx.figures / "service_load.png"
        with figure(chart, figsize=(8, 3.2)) as fig:
            left, right = fig.subplots(1, 2)
            levels = [r["concurrency"] for r in http]
            left.plot(levels, [r["throughput"] for r in http], "o-", label="service")
            if all(isinstance(r.get("raw_throughput"), int | float) for r in http):
                left.plot(levels, [r["raw_throughput"] for r in http], "s--", label="ONNX Runtime alone, best batch")
            left.set(xscale="log", xlabel="concurrent clients", ylabel="images/s", ylim=(0, None))
            left.legend(fontsize=8)
            for key in ("p50_ms", "p99_ms"):
                if all(isinstance(r.get(key), int | float) for r in http):
                    right.plot(levels, [r[key] for r in http], "o-", label=key.replace("_ms", ""))
            right.set(xscale="log", yscale="log", xlabel="concurrent clients", ylabel="latency (ms)")
            right.legend(fontsize=8)
        out += [f"![service throughput and latency by concurrency]({rel(ctx, chart)})", ""]
    skip = {*tables, *memory, "command", "produced_at"}
    rest = {k: v for k, v in data.items() if k not in skip}
    out += ["```json", json.dumps(rest, indent=1), "```", ""]
    return "\n".join(out)

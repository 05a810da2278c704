"""Service settings: one pydantic-settings class, every field overridable by a `CAPSNET_` environment variable."""

from __future__ import annotations

import difflib
import logging
import math
from collections.abc import Mapping
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import Field, field_validator, model_validator
from pydantic_settings import BaseSettings, NoDecode, SettingsConfigDict

from service.machine import usable_cpus

REPO_ROOT = Path(__file__).resolve().parents[2]
BUNDLED_REPOSITORY = REPO_ROOT / "model" / "zoo"
CGROUP_ROOT = Path("/sys/fs/cgroup")
DEFAULT_PORT = 8000
# CAPSNET_* variables that are not service settings: the training commands' data directory, the benchmark's and
# the tests' own. `unknown_variables` does not warn about them.
OTHER_VARIABLES = ("CAPSNET_DATA_DIR", "CAPSNET_BENCH", "CAPSNET_CHROMIUM", "CAPSNET_UPDATE_SCREENSHOT")

logger = logging.getLogger(__name__)


class ConfigError(ValueError):
    """A setting the service cannot start with (e.g. an unreadable file it names); `capsnet-serve` exits with it."""


def cgroup_cpu_limit(root: Path = CGROUP_ROOT) -> float | None:
    """CPUs the container may use by its CFS quota (cgroup v2 `cpu.max`, else v1 `cfs_quota_us`); None if unlimited
    or unreadable (then the CPUs the process may run on decide)."""
    try:
        return _read_cpu_limit(root)
    except (OSError, ValueError, ZeroDivisionError) as e:
        logger.warning("ignoring the cgroup CPU quota under %s: %s", root, e)
        return None


def _read_cpu_limit(root: Path) -> float | None:
    v2 = root / "cpu.max"
    if v2.is_file():
        quota, _, period = v2.read_text().strip().partition(" ")
        if quota != "max" and period:
            return int(quota) / int(period)
        return None
    for v1 in (root / "cpu", root / "cpu,cpuacct", root):
        quota_file, period_file = v1 / "cpu.cfs_quota_us", v1 / "cpu.cfs_period_us"
        if quota_file.is_file() and period_file.is_file():
            quota_us, period_us = int(quota_file.read_text()), int(period_file.read_text())
            return quota_us / period_us if quota_us > 0 and period_us > 0 else None
    return None


def default_intra_op_threads(root: Path = CGROUP_ROOT) -> int:
    """The CPU quota rounded up, capped by the CPUs this process may run on; never the host's core count alone."""
    available = usable_cpus()
    limit = cgroup_cpu_limit(root)
    if limit is None:
        return available
    return max(1, min(available, math.ceil(limit)))


class Settings(BaseSettings):
    """Every setting is read from the environment as `CAPSNET_<NAME>` (e.g. `CAPSNET_MAX_BATCH_SIZE=64`)."""

    model_config = SettingsConfigDict(env_prefix="CAPSNET_", protected_namespaces=("settings_",))

    model_repository: Path = Field(
        default=BUNDLED_REPOSITORY, description="Directory whose sub-directories are model directories."
    )
    default_model: str | None = Field(
        default=None,
        description="Model served by /v1/classify etc.; unset: the ready model with the lowest test error on its card.",
    )
    model_control: Literal["none", "explicit", "poll"] = Field(
        default="none",
        description="none: load every model at start-up, no repository API; explicit: load and unload by the "
        "repository API (load_models at start-up); poll: rescan the repository every poll_seconds "
        "(docs/model-management.md).",
    )
    load_models: Annotated[list[str], NoDecode] = Field(
        default_factory=list,
        description="With model_control=explicit: the models loaded at start-up, comma-separated ('*': all).",
    )
    poll_seconds: float = Field(
        default=10.0, gt=0.0, description="With model_control=poll: seconds between two scans of the repository."
    )
    host: str = Field(default="127.0.0.1", description="Address `capsnet-serve` binds to.")
    port: int = Field(default=DEFAULT_PORT, ge=0, le=65535, description="Port `capsnet-serve` listens on.")
    grpc_port: int = Field(
        default=DEFAULT_PORT + 1,
        ge=0,
        le=65535,
        description="Port of the gRPC Open Inference Protocol and health services (same host); 0 turns gRPC off. "
        "Unset: the HTTP port + 1 (8001 beside the default 8000).",
    )
    log_level: Literal["critical", "error", "warning", "info", "debug"] = "info"
    access_log: bool = Field(default=False, description="Log one line per request (the metrics count them anyway).")
    fast_path: bool = Field(
        default=True,
        description="Serve plain classify/capsules requests (no query string) by a lean handler in front of the "
        "FastAPI routes (same responses; anything else still goes to the routes).",
    )

    provider: Literal["auto", "cuda", "cpu"] = Field(
        default="auto", description="ONNX Runtime execution provider; auto = CUDA where a GPU is visible, else CPU."
    )
    intra_op_threads: int = Field(
        default_factory=default_intra_op_threads,
        ge=1,
        description="ONNX Runtime intra-op threads; default: the container's CPU quota (cgroup), not the host's cores.",
    )
    parallel_runs: int | None = Field(
        default=None,
        ge=1,
        description="Most ONNX Runtime runs at once on the CPU when requests queue up, each on one intra-op thread "
        "(a lone batch still runs on every intra-op thread); at most intra_op_threads; unset: intra_op_threads. "
        "1: runs take turns, each on every thread (no second, single-thread session per graph). On a GPU runs take "
        "turns.",
    )
    warmup_runs: int = Field(default=2, ge=0, description="Warm-up inferences per batch shape before ready.")

    max_batch_size: int = Field(default=32, ge=1, description="Most images in one ONNX Runtime run.")
    max_queue_delay_ms: float = Field(
        default=0.0,
        ge=0.0,
        description="Extra time a batch waits for more requests once the model is free; 0 = run what is queued.",
    )
    max_queue_size: int = Field(default=256, ge=1, description="Requests waiting per model before 503s.")
    request_timeout_s: float = Field(default=30.0, gt=0.0, description="Per-request inference deadline (504 after).")
    shutdown_timeout_s: float = Field(default=25.0, ge=0.0, description="How long shutdown waits for requests.")
    shutdown_read_grace_s: float = Field(
        default=1.0,
        ge=0.0,
        description="On SIGTERM, how long connections already made are still read before the server stops "
        "accepting: requests a client had sent are answered, not reset.",
    )

    max_body_bytes: int = Field(default=10 * 1024 * 1024, ge=1, description="Largest request body (413 above).")
    max_images_per_request: int = Field(default=64, ge=1, description="Most images (or batch rows) per request.")
    max_image_pixels: int = Field(
        default=4_000_000,
        ge=1,
        description="Largest image (width × height, e.g. 2000×2000), checked from its header before decoding.",
    )
    max_request_pixels: int = Field(
        default=16_000_000,
        ge=1,
        description="Most pixels of all the images of one request together, checked from their headers before any "
        "is decoded.",
    )
    max_image_bytes: int = Field(
        default=10 * 1024 * 1024, ge=1, description="Largest encoded image (a file part or decoded base64), in bytes."
    )

    http_max_header_bytes: int = Field(
        default=32 * 1024,
        ge=1024,
        description="Largest request head (request line and headers), in bytes (431 above; the connection closes).",
    )
    http_max_headers: int = Field(default=100, ge=8, description="Most header fields in a request (431 above).")
    http_head_timeout_s: float = Field(
        default=10.0,
        gt=0.0,
        description="Time a connection has to send a request's whole head once it began (408, then closed).",
    )
    http_body_timeout_s: float = Field(
        default=30.0,
        gt=0.0,
        description="Time a request has to send its whole body once its head is read (408, then closed).",
    )
    http_idle_timeout_s: float = Field(
        default=5.0,
        gt=0.0,
        description="How long a connection may stay open without a request: after it opens, and between requests.",
    )
    http_max_connections: int = Field(
        default=512,
        ge=1,
        description="Most open HTTP connections; one more is answered 503 and closed at once.",
    )

    auth_tokens_file: Path | None = Field(
        default=None,
        description="File of bearer tokens, one per line (# comments); set: /v1 and /v2 (but health) need one.",
    )
    auth_metrics: bool = Field(default=False, description="With auth_tokens_file: /metrics needs a token too.")

    @model_validator(mode="before")
    @classmethod
    def _grpc_port_beside_http(cls, values: Any) -> Any:
        """An unset gRPC port is the HTTP port + 1, so that any `--port` (or `make serve PORT=...`) works alone."""
        if isinstance(values, dict) and values.get("grpc_port") is None and "port" in values:
            try:
                port = int(values["port"])
            except (TypeError, ValueError):
                return values  # the port's own validation names the problem
            if 0 < port < 65535:
                return {**values, "grpc_port": port + 1}
        return values

    @field_validator("auth_tokens_file", mode="before")
    @classmethod
    def _no_empty_path(cls, value: object) -> object:
        """An empty value is a mistake (e.g. an unset variable in a template), not "authentication off"."""
        if isinstance(value, str) and not value.strip():
            raise ValueError("empty path; unset the variable to turn authentication off")
        return value

    @field_validator("load_models", mode="before")
    @classmethod
    def _comma_separated(cls, value: object) -> object:
        if isinstance(value, str):
            return [name.strip() for name in value.split(",") if name.strip()]
        return value

    @model_validator(mode="after")
    def _load_models_need_explicit(self) -> Settings:
        if self.load_models and self.model_control != "explicit":
            raise ValueError(
                f"load_models ({','.join(self.load_models)}) needs model_control=explicit; with "
                f"{self.model_control!r} every model of the repository is loaded"
            )
        return self

    @model_validator(mode="after")
    def _parallel_runs_within_threads(self) -> Settings:
        if self.parallel_runs is not None and self.parallel_runs > self.intra_op_threads:
            raise ValueError(
                f"parallel_runs ({self.parallel_runs}) exceeds intra_op_threads ({self.intra_op_threads}): each "
                "parallel run takes one intra-op thread"
            )
        return self

    @property
    def run_slots(self) -> int:
        """ONNX Runtime runs at once under load (`parallel_runs`, default the intra-op threads)."""
        return self.parallel_runs or self.intra_op_threads

    @model_validator(mode="after")
    def _metrics_auth_needs_tokens(self) -> Settings:
        if self.auth_metrics and self.auth_tokens_file is None:
            raise ValueError("auth_metrics needs auth_tokens_file (CAPSNET_AUTH_TOKENS_FILE): no token to ask for")
        return self

    @model_validator(mode="after")
    def _distinct_ports(self) -> Settings:
        if self.grpc_port and self.grpc_port == self.port:
            raise ValueError(f"grpc_port and port are both {self.port}: gRPC needs a port of its own (0 turns it off)")
        return self


def env_name(field: str) -> str:
    """The environment variable of a setting, e.g. `max_image_pixels` -> `CAPSNET_MAX_IMAGE_PIXELS`."""
    return f"{Settings.model_config.get('env_prefix', '')}{field}".upper()


def closest(name: str, choices: list[str]) -> str | None:
    """The choice most like `name` (a misspelling's likely intent), or None when none is close."""
    found = difflib.get_close_matches(name, choices, n=1, cutoff=0.6)
    return found[0] if found else None


def unknown_variables(environ: Mapping[str, str]) -> list[tuple[str, str | None]]:
    """The CAPSNET_* variables of `environ` that are no setting (nor one of OTHER_VARIABLES), each with the closest
    setting's variable (None: nothing close), sorted by name."""
    prefix = str(Settings.model_config.get("env_prefix", "")).upper()
    fields = [field.upper() for field in Settings.model_fields]
    unknown = sorted(
        name
        for name in environ
        if name.upper().startswith(prefix)
        and name.upper().removeprefix(prefix) not in fields
        and not name.upper().startswith(OTHER_VARIABLES)
    )
    found = []
    for name in unknown:
        match = closest(name.upper().removeprefix(prefix), fields)
        found.append((name, None if match is None else prefix + match))
    return found

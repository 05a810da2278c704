"""The FastAPI app (`create_app`) and the `capsnet-serve` command (`main`)."""

from __future__ import annotations

import argparse
import asyncio
import errno
import json
import logging
import os
import signal
import socket
import sys
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import uvicorn
from fastapi import FastAPI, Security
from fastapi.openapi.utils import get_openapi
from fastapi.staticfiles import StaticFiles
from fastapi.telemetry import TelemetryConfig
from pydantic import ValidationError
from pydantic.json_schema import models_json_schema

from service.api.connection import ConnectionLimits, guarded_protocol
from service.api.deps import admin_auth, bearer_auth
from service.api.fastpath import FastPath
from service.api.middleware import ServiceMiddleware
from service.api.routes import explain, explorer, health, inference, metrics, models, repository, v2
from service.api.routes.docs import install_docs
from service.api.schemas import DecodeRequest, ErrorV1, ErrorV2, ImagesRequest, InferenceRequest
from service.core.auth import TokenStore
from service.core.config import ConfigError, Settings, closest, unknown_variables
from service.core.errors import describe_errors, install_error_handlers
from service.core.metrics import Metrics
from service.grpc.server import GrpcServer
from service.runtime.ood import one_blas_thread
from service.runtime.registry import ModelRegistry
from service.runtime.repository import model_directories

logger = logging.getLogger(__name__)

DESCRIPTION = """Capsule Networks (Sabour et al. 2017; Hinton et al. 2018) served with ONNX Runtime.

* **v1** — application API: classify, capsule poses, reconstructions, the pose-perturbation figure, and
  decoding of edited poses. Images as multipart files or JSON (base64 or raw arrays of the model's input size).
* **v2** — the Open Inference Protocol (KServe v2) REST API, for stock clients.
* Errors are JSON: `{"error": "...", "type": "..."}` under v1, `{"error": "..."}` under v2.
"""

# FastAPI's OpenTelemetry hooks look up the global providers on every request; the service exports its own
# Prometheus metrics (service.core.metrics), so they stay off.
NO_TELEMETRY: TelemetryConfig = {"tracing": False, "metrics": False, "logs": False, "operation_spans": False}


@asynccontextmanager
async def lifespan(app: FastAPI) -> AsyncIterator[None]:
    """Start gRPC (unless CAPSNET_GRPC_PORT is 0) and load the models in the background (readiness stays false
    until warm-up is over); at shutdown, drain gRPC calls, then the models' queues."""
    registry: ModelRegistry = app.state.registry
    settings: Settings = app.state.settings
    grpc_server = None
    if settings.grpc_port:
        grpc_server = GrpcServer(
            registry, settings, app.state.metrics, check_token=app.state.check_token, check_admin=app.state.check_admin
        )
        grpc_server.start()
        registry.listeners.append(grpc_server.update_health)  # readiness changes as models load and unload
    loading = asyncio.create_task(registry.start(), name="load-models")
    loading.add_done_callback(_log_failure)
    health = asyncio.create_task(_update_grpc_health(loading, grpc_server), name="grpc-health")
    try:
        yield
    finally:
        if not loading.done():
            await asyncio.wait([loading])
        await health
        if grpc_server is not None:
            await asyncio.get_running_loop().run_in_executor(None, grpc_server.stop)
        await registry.close()
        logger.info("shut down: queued requests finished")


async def _update_grpc_health(loading: asyncio.Task[None], grpc_server: GrpcServer | None) -> None:
    await asyncio.wait([loading])
    if grpc_server is not None:
        grpc_server.update_health()


def _log_failure(task: asyncio.Task[None]) -> None:
    if not task.cancelled() and task.exception() is not None:
        logger.error("loading the models failed", exc_info=task.exception())


def openapi_with_bodies(app: FastAPI) -> Callable[[], dict[str, Any]]:
    """The OpenAPI schema, plus the JSON bodies that routes parse themselves (for multipart/JSON choice)."""

    def openapi() -> dict[str, Any]:
        if app.openapi_schema:
            return app.openapi_schema
        schema = get_openapi(title=app.title, version=app.version, description=app.description, routes=app.routes)
        _, defs = models_json_schema(
            [(m, "validation") for m in (ImagesRequest, DecodeRequest, InferenceRequest)],
            ref_template="#/components/schemas/{model}",
        )
        schemas = schema.setdefault("components", {}).setdefault("schemas", {})
        schemas.update(defs["$defs"])
        # Validation errors are answered 400 by install_error_handlers: FastAPI's default 422 never happens. A 422
        # a route declares itself (reject_ood's out_of_distribution) stays.
        for operation in (op for path in schema["paths"].values() for op in path.values()):
            responses = operation.get("responses", {})
            if "HTTPValidationError" in json.dumps(responses.get("422", {})):
                del responses["422"]
        for unused in ("HTTPValidationError", "ValidationError"):
            schemas.pop(unused, None)
        app.openapi_schema = schema
        return schema

    return openapi


def include_routers(app: FastAPI, settings: Settings) -> None:
    """Every route; with a token file, /v1 and /v2 (but their health checks) need a bearer token, the repository
    API one with the admin scope, and /metrics too with `auth_metrics`. The explorer page, its static files and
    the API docs hold no data: always open."""
    auth = settings.auth_tokens_file is not None
    guard = [Security(bearer_auth)] if auth else []
    for module, error in ((models, ErrorV1), (inference, ErrorV1), (explain, ErrorV1), (v2, ErrorV2)):
        unauthorized: dict[int | str, dict[str, Any]] = {401: {"model": error, "description": "no valid bearer token"}}
        app.include_router(module.router, dependencies=guard, responses=unauthorized if auth else None)
    forbidden: dict[int | str, dict[str, Any]] = {403: {"model": ErrorV2, "description": "not an admin token"}}
    admin = [Security(admin_auth)] if auth else []
    app.include_router(repository.router, dependencies=admin, responses=forbidden if auth else None)
    app.include_router(metrics.router, dependencies=guard if settings.auth_metrics else [])
    for router in (v2.health_router, health.router, explorer.router):
        app.include_router(router)


def create_app(settings: Settings | None = None) -> FastAPI:
    """The app; the models load when its lifespan starts. ConfigError for an unreadable or empty token file."""
    settings = settings or Settings()
    one_blas_thread()
    app = FastAPI(
        title="capsnet-serve",
        version=v2.server_version(),
        description=DESCRIPTION,
        lifespan=lifespan,
        docs_url=None,  # install_docs serves /docs and /redoc from local assets, not a CDN
        redoc_url=None,
        telemetry=NO_TELEMETRY,
    )
    app.state.settings = settings
    app.state.tokens = TokenStore.from_file(settings.auth_tokens_file) if settings.auth_tokens_file else None
    app.state.metrics = Metrics()
    # the bearer-token checks of gRPC calls, the same tokens as HTTP's: (token or None) -> allowed; None: open
    tokens: TokenStore | None = app.state.tokens
    app.state.check_token = tokens.check if tokens is not None else None
    app.state.check_admin = tokens.check_admin if tokens is not None else None
    app.state.registry = ModelRegistry(settings, app.state.metrics)
    install_error_handlers(app)
    include_routers(app, settings)
    if settings.fast_path:  # inside ServiceMiddleware (added after it, so wrapped by it): counted and size-limited
        app.add_middleware(FastPath, state=app.state)
    app.add_middleware(
        ServiceMiddleware,
        metrics=app.state.metrics,
        max_bytes=settings.max_body_bytes,
        activity=app.state.registry.slots.activity,
    )
    install_docs(app)
    if explorer.STATIC_DIR.is_dir():
        app.mount("/static", StaticFiles(directory=explorer.STATIC_DIR), name="static")
    app.openapi = openapi_with_bodies(app)  # type: ignore[method-assign]
    return app


async def _load_only(settings: Settings) -> dict[str, Any]:
    registry = ModelRegistry(settings, Metrics())
    await registry.start()
    await registry.close()
    return {
        "ready": registry.all_ready,
        "default_model": registry.default_name,
        "models": {
            n: {"state": m.state.value, "provider": m.provider, "error": m.error} for n, m in registry.models.items()
        },
    }


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="capsnet-serve",
        description="Serve every model of a model repository over HTTP (v1 API, Open Inference Protocol v2) and gRPC "
        "(Open Inference Protocol, grpc.health.v1).",
        epilog="Every setting can also be given as a CAPSNET_* environment variable (see docs/settings.md); "
        "options given here win.",
    )
    parser.add_argument("--host", help="address to bind (default: CAPSNET_HOST or 127.0.0.1)")
    parser.add_argument("--port", type=int, help="port to listen on (default: CAPSNET_PORT or 8000)")
    parser.add_argument(
        "--grpc-port", type=int, help="gRPC port; 0 turns gRPC off (default: CAPSNET_GRPC_PORT or the port + 1)"
    )
    parser.add_argument(
        "--model-repository",
        type=Path,
        help="directory of model directories, or one model directory (default: CAPSNET_MODEL_REPOSITORY or the "
        "bundled model/zoo)",
    )
    parser.add_argument(
        "--model-control",
        choices=["none", "explicit", "poll"],
        help="none: load every model at start-up; explicit: load and unload by the repository API; poll: rescan "
        "the repository every CAPSNET_POLL_SECONDS (default: CAPSNET_MODEL_CONTROL or none)",
    )
    parser.add_argument(
        "--load-model",
        action="append",
        metavar="NAME",
        help="with --model-control explicit: a model to load at start-up, repeatable; '*' loads every model "
        "(default: CAPSNET_LOAD_MODELS or none)",
    )
    parser.add_argument(
        "--log-level",
        choices=["critical", "error", "warning", "info", "debug"],
        help="log level (default: CAPSNET_LOG_LEVEL or info)",
    )
    parser.add_argument(
        "--dry-run",
        action="store_true",
        help="load and warm up every model, print their state as JSON and exit (1 if any failed) (default: off)",
    )
    return parser.parse_args(argv)


def free_port(host: str, start: int, count: int = 1) -> int | None:
    """The first port from `start` up (at most 100 tried) such that it and the `count - 1` after it are free."""
    for port in range(max(start, 1024), min(start + 100, 65536 - count)):
        try:
            for candidate in range(port, port + count):
                _probe(host, candidate).close()
        except OSError:
            continue
        return port
    return None


def _probe(host: str, port: int) -> socket.socket:
    """A socket bound to host:port as the servers bind theirs (SO_REUSEADDR: a port in TIME_WAIT counts as free)."""
    family = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)[0][0]
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as uvicorn and gRPC do: restart over TIME_WAIT
    try:
        sock.bind((host, port))
    except OSError:
        sock.close()
        raise
    return sock


def bind_advice(error: OSError, host: str, port: int, option: str) -> str:
    """What to do about a failed bind, naming the setting at fault: the address, or the port (with a free one)."""
    if isinstance(error, socket.gaierror) or error.errno == errno.EADDRNOTAVAIL:
        return "not an address of this machine; choose another with --host or CAPSNET_HOST (e.g. 127.0.0.1 or 0.0.0.0)"
    variable = option.replace("-", "_").upper()
    setting = f"--{option} or CAPSNET_{variable}"
    suggestion = free_port(host, port + 1, 2 if option == "port" else 1)  # a free HTTP port has a free gRPC port + 1
    example = f" (e.g. --{option} {suggestion}, or make serve {variable}={suggestion})" if suggestion else ""
    if error.errno == errno.EACCES:
        return f"ports below 1024 need privileges; choose another with {setting}{example}"
    return f"choose another with {setting}{example}"


def listening_socket(host: str, port: int, grpc_port: int = 0) -> socket.socket:
    """The server's socket, bound before any model loads, so that a taken port fails at once with one clear line;
    `grpc_port` (0: none) is checked the same way (gRPC binds it when the app starts)."""
    try:
        sock = _probe(host, port)
    except OSError as e:
        advice = bind_advice(e, host, port, "port")
        sys.exit(f"capsnet-serve: cannot listen on {host}:{port}: {e.strerror or e}; {advice}")
    if grpc_port:
        check_grpc_port(host, grpc_port)
    address = f"[{host}]" if ":" in host else host
    logger.info("listening on http://%s:%d (Ctrl-C to quit)", address, sock.getsockname()[1])
    return sock


def check_grpc_port(host: str, port: int) -> None:
    """Exit with one line when the gRPC port cannot be bound, before any model loads (gRPC binds it at start-up)."""
    try:
        _probe(host, port).close()
    except OSError as e:
        sys.exit(
            f"capsnet-serve: cannot listen for gRPC on {host}:{port}: {e.strerror or e}; "
            f"{bind_advice(e, host, port, 'grpc-port')}; --grpc-port 0 turns gRPC off"
        )


def warn_unknown_variables() -> None:
    """A warning per CAPSNET_* variable that is no setting (a misspelling would otherwise be ignored in silence)."""
    for name, match in unknown_variables(os.environ):
        hint = f"did you mean {match}?" if match else "see capsnet-serve --help and the settings page"
        logger.warning("ignoring %s: no such setting; %s", name, hint)


def check_repository(settings: Settings) -> None:
    """Exit with one line when the repository holds no model directory or lacks CAPSNET_DEFAULT_MODEL."""
    try:
        found = model_directories(settings.model_repository)
    except OSError as e:
        sys.exit(f"capsnet-serve: {e}")
    if not found:
        sys.exit(
            f"capsnet-serve: no model directories (with model.json) in {settings.model_repository}: pass a "
            "directory of model directories, or one model directory"
        )
    if found == [settings.model_repository]:
        logger.info("%s is a model directory: serving it alone", settings.model_repository)
    names = sorted(path.resolve().name for path in found)
    if settings.default_model is not None and settings.default_model not in names:
        match = closest(settings.default_model, names)
        sys.exit(
            f"capsnet-serve: the default model {settings.default_model!r} (CAPSNET_DEFAULT_MODEL) is not in "
            f"{settings.model_repository}, which holds {names}"
            + (f"; did you mean {match!r}?" if match else "; unset it to serve the one with the lowest test error")
        )


class DrainingServer(uvicorn.Server):
    """uvicorn's server, but on SIGTERM it first keeps reading for `read_grace_s`.

    uvicorn's shutdown closes every connection whose request it has not parsed yet, and the listening socket
    with the connections still in its backlog: under load, requests a client had already sent when the signal
    came would be reset. Reading on for a moment turns them into requests in flight, which shutdown drains.
    """

    def __init__(self, config: uvicorn.Config, read_grace_s: float) -> None:
        super().__init__(config)
        self.read_grace_s = read_grace_s

    async def shutdown(self, sockets: list[socket.socket] | None = None) -> None:
        if self.read_grace_s > 0:
            logger.info("SIGTERM: reading requests already sent for %.1f s, then draining", self.read_grace_s)
            await asyncio.sleep(self.read_grace_s)
        await super().shutdown(sockets)


def http_server(settings: Settings, app: FastAPI) -> DrainingServer:
    """The uvicorn server for `app`, its request tasks made known to the fast path; its connections bounded by the
    `http_*` settings (service.api.connection); no `server` banner, `nosniff` on every response."""
    refused = app.state.metrics.connections_refused
    limits = ConnectionLimits.from_settings(settings, refused=lambda reason: refused.labels(reason=reason).inc())
    config = uvicorn.Config(
        app,
        host=settings.host,
        port=settings.port,
        log_level=settings.log_level,
        access_log=settings.access_log,
        http=guarded_protocol(limits),  # one write per response (service.api.coalesce), limits checked
        timeout_graceful_shutdown=round(settings.shutdown_timeout_s),
        server_header=False,
        headers=[("X-Content-Type-Options", "nosniff")],
    )
    server = DrainingServer(config, settings.shutdown_read_grace_s)
    # uvicorn's request tasks, one per HTTP request read on any connection until it is answered: the fast path
    # runs a request on the event loop when it is the only one (service.api.fastpath, `FastPath.alone`)
    app.state.http_tasks = server.server_state.tasks
    return server


def serve(settings: Settings, app: FastAPI) -> None:
    """Run `app` until SIGTERM or Ctrl-C; exit 1 if it could not start."""
    sock = listening_socket(settings.host, settings.port, settings.grpc_port)
    # uvicorn drains on SIGTERM, then re-raises the signal with the handler it found; this one makes a
    # graceful shutdown exit with status 0 instead of dying by the signal.
    signal.signal(signal.SIGTERM, lambda signum, frame: sys.exit(0))
    server = http_server(settings, app)
    server.run(sockets=[sock])
    if not server.started:
        sys.exit(1)


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    overrides = {
        "host": args.host,
        "port": args.port,
        "grpc_port": args.grpc_port,
        "model_repository": args.model_repository,
        "model_control": args.model_control,
        "load_models": args.load_model,
        "log_level": args.log_level,
    }
    try:
        settings = Settings(**{k: v for k, v in overrides.items() if v is not None})
    except ValidationError as e:
        problems = describe_errors(e.errors(), whole="settings")
        sys.exit(f"capsnet-serve: invalid settings (CAPSNET_* variables or options): {problems}")
    logging.basicConfig(level=settings.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    warn_unknown_variables()
    check_repository(settings)
    try:
        app = create_app(settings)
    except ConfigError as e:
        sys.exit(f"capsnet-serve: {e}")
    if args.dry_run:
        report = asyncio.run(_load_only(settings))
        print(json.dumps(report, indent=2))
        sys.exit(0 if report["ready"] else 1)
    serve(settings, app)


if __name__ == "__main__":
    main()

"""Liveness and readiness for Kubernetes probes."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse

from service.api.deps import RegistryDep
from service.core.auth import TokenStore, bearer_token

router = APIRouter(tags=["health"])


@router.get("/health/live", summary="Liveness: the process answers")
async def live() -> dict[str, str]:
    return {"status": "live"}


@router.get(
    "/health/ready",
    summary="Readiness: models loaded and warmed up",
    responses={503: {"description": "still loading, or no model could be loaded"}},
)
async def ready(request: Request, registry: RegistryDep) -> JSONResponse:
    """200 once loading and warm-up are over and at least one model serves (a broken model is listed, and the
    others keep serving); 503 before that. `/v2/health/ready` is the stricter protocol check: every model.
    With bearer tokens on, the models and the load error (which name models) are shown only with a valid token:
    the status code is all a probe needs."""
    body: dict[str, Any] = {"ready": registry.ready}
    tokens: TokenStore | None = request.app.state.tokens
    if tokens is None or tokens.check(bearer_token(request.headers.get("authorization"))):
        body["models"] = {name: state.value for name, state in registry.states().items()}
        if registry.load_error:
            body["error"] = registry.load_error
    return JSONResponse(body, status_code=200 if registry.ready else 503)

"""The model repository extension over REST, as Triton implements it: the index, load and unload.

Off with CAPSNET_MODEL_CONTROL=none (403); load and unload need `explicit`. With a token file, every route needs
a token with the admin scope. Bodies are optional JSON; errors are `{"error": "<message>"}` as under /v2.
(No `from __future__ import annotations` here: FastAPI must resolve the routes' annotations at runtime.)
"""

from dataclasses import asdict
from typing import Annotated, Any

from fastapi import APIRouter, Path, Request, Response
from fastapi.responses import JSONResponse
from pydantic import BaseModel, ConfigDict

from service.api.deps import RegistryDep
from service.api.inputs import parse_json, parse_model
from service.api.schemas import ErrorV2
from service.core.errors import InvalidInput

router = APIRouter(tags=["v2 model repository"])

ERRORS: dict[int | str, dict[str, Any]] = {code: {"model": ErrorV2} for code in (400, 401, 403, 404)}
NameParam = Annotated[str, Path(description="model name (a folder of the model repository)")]
IGNORED_PARAMETERS = {"unload_dependents"}  # models here have no dependents


class IndexRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")

    repository_name: str = ""
    ready: bool = False


class ModelRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")

    parameters: dict[str, Any] | None = None


class IndexEntry(BaseModel):
    name: str
    version: str
    state: str
    reason: str


async def optional_body(request: Request, model: type[BaseModel]) -> Any:
    """The JSON body parsed as `model` (an empty body is `{}`)."""
    body = await request.body()
    return parse_model(model, parse_json(body) if body.strip() else {})


def check_parameters(parameters: dict[str, Any] | None) -> None:
    unsupported = sorted(set(parameters or {}) - IGNORED_PARAMETERS)
    if unsupported:
        raise InvalidInput(
            f"parameter {unsupported[0]!r} is not supported: models load from the repository folder as they are "
            "(no configuration override or uploaded files)"
        )


@router.post(
    "/v2/repository/index",
    summary="Every model of the repository and every version with its state",
    response_model=list[IndexEntry],
    responses=ERRORS,
)
async def repository_index(request: Request, registry: RegistryDep) -> JSONResponse:
    """READY, UNAVAILABLE (with the `reason`), LOADING or UNLOADING per version; a model not loaded has version
    "". Body (optional): `{"ready": true}` lists the ready versions only."""
    registry.require_control(change=False)
    body: IndexRequest = await optional_body(request, IndexRequest)
    return JSONResponse([asdict(row) for row in await registry.index(ready_only=body.ready)])


@router.post(
    "/v2/repository/models/{name}/load",
    summary="Load a model, or reload its changed versions (zero downtime)",
    response_class=Response,
    responses={200: {"description": "loaded (empty body)"}, **ERRORS},
)
async def repository_load(request: Request, registry: RegistryDep, name: NameParam) -> Response:
    """Loads the versions its version policy serves; a new or changed version is warmed up beside the one serving
    before it takes the new requests. 400 naming every version that failed (what served before keeps serving)."""
    registry.require_control(change=True)
    body: ModelRequest = await optional_body(request, ModelRequest)
    check_parameters(body.parameters)
    await registry.load(name)
    return Response(status_code=200)


@router.post(
    "/v2/repository/models/{name}/unload",
    summary="Unload every version of a model once its requests have finished",
    response_class=Response,
    responses={200: {"description": "unloaded (empty body)"}, **ERRORS},
)
async def repository_unload(request: Request, registry: RegistryDep, name: NameParam) -> Response:
    """Answers once every version has drained (requests in flight finish) and released its memory."""
    registry.require_control(change=True)
    body: ModelRequest = await optional_body(request, ModelRequest)
    check_parameters(body.parameters)
    await registry.unload(name)
    return Response(status_code=200)

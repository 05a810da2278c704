"""Typed dependencies: the settings, the model registry, the model a route addresses, and the bearer-token check."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Annotated, Any

from fastapi import Depends, Path, Request
from fastapi.dependencies.models import Dependant
from fastapi.security import HTTPBearer
from starlette.requests import HTTPConnection

from service.core.auth import ADMIN, INVALID_TOKEN, MISSING_TOKEN, NOT_ADMIN, WRONG_SCHEME, TokenStore, bearer_token
from service.core.config import Settings
from service.core.errors import Forbidden, InvalidInput, Unauthorized
from service.runtime.model import ServedModel
from service.runtime.registry import ModelRegistry


async def get_settings(request: Request) -> Settings:
    settings: Settings = request.app.state.settings
    return settings


async def get_registry(request: Request) -> ModelRegistry:
    registry: ModelRegistry = request.app.state.registry
    return registry


SettingsDep = Annotated[Settings, Depends(get_settings)]
RegistryDep = Annotated[ModelRegistry, Depends(get_registry)]


def query_parameters(dependant: Dependant) -> frozenset[str]:
    """The query parameters a route's function reads: its own and its dependencies' (by the names clients send)."""
    names = {p.alias for p in dependant.query_params}
    for sub in dependant.dependencies:
        names |= query_parameters(sub)
    return frozenset(names)


def route_query_parameters(route: Any) -> frozenset[str]:
    """The query parameters a route takes: those its function reads and those its OpenAPI declares (`version`,
    which `addressed_model` reads itself)."""
    declared = (getattr(route, "openapi_extra", None) or {}).get("parameters", [])
    return query_parameters(route.dependant) | {p["name"] for p in declared if p.get("in") == "query"}


_ROUTE_QUERY_PARAMETERS: dict[int, frozenset[str]] = {}  # id(route) -> its query parameters, computed once


async def known_query_parameters(request: Request) -> None:
    """400 for a query parameter the route does not read (e.g. `topk` for `top_k`), naming the ones it does."""
    if not request.scope["query_string"]:
        return
    route = request.scope["route"]
    valid = _ROUTE_QUERY_PARAMETERS.get(id(route))
    if valid is None:
        valid = _ROUTE_QUERY_PARAMETERS[id(route)] = route_query_parameters(route)
    unknown = sorted(set(request.query_params) - valid)
    if unknown:
        names = ", ".join(repr(n) for n in unknown)
        accepted = f"valid ones: {', '.join(sorted(valid))}" if valid else "it takes none"
        raise InvalidInput(f"unknown query parameter {names} for {request.url.path}; {accepted}")


async def named_model(
    registry: RegistryDep, name: Annotated[str, Path(description="model name")]
) -> AsyncIterator[ServedModel]:
    """The model's newest serving version, held (`ServedModel.lease`) until the request has been answered."""
    with registry.get(name).lease() as model:
        yield model


async def addressed_model(request: Request) -> AsyncIterator[ServedModel]:
    """The model a v1 operation addresses: `/v1/models/{name}/<op>` names it, `/v1/<op>` means the default; the
    `version` query parameter picks a version (default: the newest serving). Held until answered. Checks the
    query string first (`known_query_parameters`): one dependency level per request."""
    await known_query_parameters(request)
    registry: ModelRegistry = request.app.state.registry  # read directly: one dependency level per request
    name = request.path_params.get("name")
    version = request.query_params.get("version") or None
    model = registry.default() if name is None else registry.get(name, version)
    if version is not None and model.version != version:  # a version of the default model
        model = registry.get(model.name, version)
    with model.lease():
        yield model


ModelDep = Annotated[ServedModel, Depends(addressed_model)]
# `addressed_model` reads `name` from the path itself, so the routes that have it document it with this.
MODEL_NAME_PARAMETER: dict[str, Any] = {
    "name": "name",
    "in": "path",
    "required": True,
    "description": "model name",
    "schema": {"type": "string", "title": "Name"},
}
VERSION_PARAMETER: dict[str, Any] = {
    "name": "version",
    "in": "query",
    "required": False,
    "description": "model version (default: the newest ready one)",
    "schema": {"type": "string", "title": "Version"},
}


class BearerAuth(HTTPBearer):
    """401 unless `Authorization: Bearer <token>` carries a token of the app's TokenStore.

    An HTTPBearer, so that the routes it guards declare the scheme in OpenAPI (the Authorize button of /docs).
    """

    async def __call__(self, request: HTTPConnection) -> None:
        token_scopes(request)


def token_scopes(request: HTTPConnection) -> frozenset[str]:
    """The scopes of the request's bearer token; Unauthorized (saying why) when it carries no valid token."""
    tokens: TokenStore = request.app.state.tokens
    header = request.headers.get("authorization")
    token = bearer_token(header)
    scopes = tokens.scopes(token)
    if scopes is not None:
        return scopes
    if header is None:
        raise Unauthorized(MISSING_TOKEN)
    if token is None:
        raise Unauthorized(WRONG_SCHEME)
    raise Unauthorized(INVALID_TOKEN, invalid_token=True)


class AdminAuth(HTTPBearer):
    """With a token file: 401 without a valid token, 403 for a token without the admin scope; open without one."""

    async def __call__(self, request: HTTPConnection) -> None:
        if request.app.state.tokens is not None and ADMIN not in token_scopes(request):
            raise Forbidden(NOT_ADMIN)


bearer_auth = BearerAuth(
    scheme_name="bearer",
    description="A token from the service's CAPSNET_AUTH_TOKENS_FILE.",
    auto_error=False,
)

admin_auth = AdminAuth(
    scheme_name="bearer",
    description="A token from the service's CAPSNET_AUTH_TOKENS_FILE.",  # the same scheme as bearer_auth's
    auto_error=False,
)

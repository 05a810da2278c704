"""Typed dependencies: the settings, the model registry, the model a route addresses, and the bearer-token check."""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import Depends, Path, Request
from fastapi.dependencies.models import Dependant
from fastapi.security import HTTPBearer
from starlette.requests import HTTPConnection

from service.core.auth import INVALID_TOKEN, MISSING_TOKEN, WRONG_SCHEME, TokenStore, bearer_token
from service.core.config import Settings
from service.core.errors import InvalidInput, Unauthorized
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
    """The query parameters a route reads: its own and those of its dependencies (by the names clients send)."""
    names = {p.alias for p in dependant.query_params}
    for sub in dependant.dependencies:
        names |= query_parameters(sub)
    return frozenset(names)


_ROUTE_QUERY_PARAMETERS: dict[int, frozenset[str]] = {}  # id(route) -> its query parameters, computed once


async def known_query_parameters(request: Request) -> None:
    """400 for a query parameter the route does not read (e.g. `topk` for `top_k`), naming the ones it does."""
    if not request.scope["query_string"]:
        return
    route = request.scope["route"]
    valid = _ROUTE_QUERY_PARAMETERS.get(id(route))
    if valid is None:
        valid = _ROUTE_QUERY_PARAMETERS[id(route)] = query_parameters(route.dependant)
    unknown = sorted(set(request.query_params) - valid)
    if unknown:
        names = ", ".join(repr(n) for n in unknown)
        accepted = f"valid ones: {', '.join(sorted(valid))}" if valid else "it takes none"
        raise InvalidInput(f"unknown query parameter {names} for {request.url.path}; {accepted}")


async def named_model(registry: RegistryDep, name: Annotated[str, Path(description="model name")]) -> ServedModel:
    return registry.get(name)


async def addressed_model(request: Request) -> ServedModel:
    """The model a v1 operation addresses: `/v1/models/{name}/<op>` names it, `/v1/<op>` means the default.
    Checks the query string first (`known_query_parameters`): one dependency level per request."""
    await known_query_parameters(request)
    registry: ModelRegistry = request.app.state.registry  # read directly: one dependency level per request
    name = request.path_params.get("name")
    return registry.default() if name is None else registry.get(name)


ModelDep = Annotated[ServedModel, Depends(addressed_model)]
# `addressed_model` reads `name` from the path itself, so the routes that have it document it with this.
MODEL_NAME_PARAMETER: dict[str, Any] = {
    "name": "name",
    "in": "path",
    "required": True,
    "description": "model name",
    "schema": {"type": "string", "title": "Name"},
}


class BearerAuth(HTTPBearer):
    """401 unless `Authorization: Bearer <token>` carries a token of the app's TokenStore.

    An HTTPBearer, so that the routes it guards declare the scheme in OpenAPI (the Authorize button of /docs).
    """

    async def __call__(self, request: HTTPConnection) -> None:
        tokens: TokenStore = request.app.state.tokens
        header = request.headers.get("authorization")
        token = bearer_token(header)
        if tokens.check(token):
            return
        if header is None:
            raise Unauthorized(MISSING_TOKEN)
        if token is None:
            raise Unauthorized(WRONG_SCHEME)
        raise Unauthorized(INVALID_TOKEN, invalid_token=True)


bearer_auth = BearerAuth(
    scheme_name="bearer",
    description="A token from the service's CAPSNET_AUTH_TOKENS_FILE.",
    auto_error=False,
)

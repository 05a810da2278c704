"""Typed dependencies: the settings, the metrics, the model registry and the model a route addresses."""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import Depends, Path, Request

from service.core.config import Settings
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


async def named_model(registry: RegistryDep, name: Annotated[str, Path(description="model name")]) -> ServedModel:
    return registry.get(name)


async def addressed_model(request: Request) -> ServedModel:
    """The model a v1 operation addresses: `/v1/models/{name}/<op>` names it, `/v1/<op>` means the default."""
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

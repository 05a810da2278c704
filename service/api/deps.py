"""Typed dependencies: the settings, the metrics, the model registry and the model a route addresses."""

from __future__ import annotations

from typing import Annotated

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


async def default_model(registry: RegistryDep) -> ServedModel:
    return registry.default()

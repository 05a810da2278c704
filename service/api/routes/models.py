"""v1 model list and model details (the card)."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Depends

from service.api.deps import RegistryDep, known_query_parameters, named_model
from service.api.schemas import ErrorV1, ModelDetail, ModelList, ModelSummary
from service.runtime.model import ServedModel

router = APIRouter(tags=["v1"], dependencies=[Depends(known_query_parameters)])


def summary(model: ServedModel) -> ModelSummary:
    card, raw = model.card, model.raw_card or {}
    return ModelSummary(
        name=model.name,
        version=card.version if card else raw.get("version"),
        state=model.state.value,
        ready=model.ready,
        error=model.error,
        architecture=card.architecture if card else raw.get("architecture"),
        description=card.description if card else raw.get("description"),
        classes=card.classes if card else None,
        pose_shape=card.pose_shape if card else None,
        has_decoder=model.has_decoder,
        has_explanation=card is not None and card.explanation is not None,
        ood_calibrated=card is not None and card.ood_calibration is not None,
        execution_provider=model.provider,
    )


@router.get("/v1/models", summary="The served models")
async def list_models(registry: RegistryDep) -> ModelList:
    """Every model of the repository, including broken ones (with `ready: false` and the `error`)."""
    return ModelList(default_model=registry.default_name, models=[summary(m) for m in registry.models.values()])


@router.get("/v1/models/{name}", summary="One model and its card", responses={404: {"model": ErrorV1}})
async def get_model(model: Annotated[ServedModel, Depends(named_model)]) -> ModelDetail:
    """The model's state, execution provider and its full card (`model.json`)."""
    return ModelDetail(**summary(model).model_dump(), card=model.raw_card)

"""v1 model list and model details (the card)."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Depends

from service.api.deps import RegistryDep, known_query_parameters, named_model
from service.api.schemas import ErrorV1, ModelDetail, ModelList, ModelSummary, VersionState
from service.explanation import explain_methods
from service.runtime.model import ServedModel
from service.runtime.model_dir import without_machine_paths

router = APIRouter(tags=["v1"], dependencies=[Depends(known_query_parameters)])


def summary(model: ServedModel, versions: list[ServedModel] | None = None) -> ModelSummary:
    """The model's version `model` (its serving one) and the states of every loaded version."""
    card, raw = model.card, model.raw_card or {}
    return ModelSummary(
        name=model.name,
        version=card.version if card else raw.get("version"),
        state=model.state.value,
        ready=model.ready,
        error=without_machine_paths(model.error),
        architecture=card.architecture if card else raw.get("architecture"),
        description=card.description if card else raw.get("description"),
        classes=card.classes if card else None,
        pose_shape=card.pose_shape if card else None,
        has_decoder=model.has_decoder,
        has_explanation=card is not None and card.explanation is not None,
        explain_methods=explain_methods(card) if card is not None else [],
        ood_calibrated=card is not None and card.ood_calibration is not None,
        execution_provider=model.provider,
        versions=[
            VersionState(version=m.version, state=m.state.value, ready=m.serving, error=without_machine_paths(m.error))
            for m in (versions if versions is not None else [model])
        ],
    )


@router.get("/v1/models", summary="The served models")
async def list_models(registry: RegistryDep) -> ModelList:
    """Every model loaded, including broken ones (with `ready: false` and the `error`), with its versions."""
    return ModelList(
        default_model=registry.default_name,
        models=[summary(m, registry.versions(name)) for name, m in registry.models.items()],
    )


@router.get("/v1/models/{name}", summary="One model and its card", responses={404: {"model": ErrorV1}})
async def get_model(model: Annotated[ServedModel, Depends(named_model)], registry: RegistryDep) -> ModelDetail:
    """The model's state, provider, versions and the serving one's full card (`model.json`), no machine paths."""
    card = without_machine_paths(model.raw_card)
    return ModelDetail(**summary(model, registry.versions(model.name)).model_dump(), card=card)

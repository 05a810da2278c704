"""v1 explain: which parts of the image routed their votes to a class (the routing map), as JSON or a PNG overlay.

`/v1/models/{name}/explain` and `/v1/explain` (the default model). The map comes from the model's
explanation output (docs/model-card.md); a model without one answers 409.
(No `from __future__ import annotations` here: FastAPI must resolve the routes' annotations at runtime.)
"""

from typing import Annotated

import numpy as np
from fastapi import APIRouter, Query, Request, Response
from starlette.concurrency import run_in_threadpool

from service.api.deps import ModelDep, SettingsDep
from service.api.routes.inference import (
    ADDRESSES,
    DECIMALS,
    ERRORS,
    IMAGES_BODY,
    PNG_RESPONSE,
    ClassQuery,
    FormatQuery,
    OptionsDep,
    check_class,
    classify_images,
    image_2d,
    json_response,
    rounded,
)
from service.api.schemas import ExplainResponse, Explanation
from service.core.errors import InvalidInput, ModelCapabilityError
from service.explanation import input_heatmap, overlay_png
from service.runtime.card import ModelCard
from service.runtime.model import ServedModel

MAX_SCALE = 32


def require_explanation(model: ServedModel) -> ModelCard:
    card = model.require_ready()
    if card.explanation is None:
        raise ModelCapabilityError(
            f"model {model.name!r} cannot explain its routing: its graph has no explanation output (role "
            f"'explanation'; outputs: {[o.name for o in card.outputs]}). Dynamic-routing models exported before it "
            "existed gain it with `capsnet-export --from-model-dir DIR --out DIR --force`"
        )
    return card


async def explain(
    request: Request,
    model: ModelDep,
    settings: SettingsDep,
    options: OptionsDep,
    class_index: ClassQuery = None,
    format: FormatQuery = "json",
    scale: Annotated[int, Query(ge=1, le=MAX_SCALE, description="format=png: upscale the overlay by this factor")] = 8,
) -> Response:
    """Per image: the final coupling coefficients c_ij of the primary capsules to the predicted class (or
    `class`), weighted by the length of their prediction vectors |û_j|i| and summed over the capsule types
    into the PrimaryCaps grid (`grid`), then spread over each cell's receptive field in the input
    (`heatmap`). `format=png` takes one image and returns the heatmap in colour over the input."""
    card = require_explanation(model)
    check_class(card, class_index)
    info, images, outputs = await classify_images(request, model, card, settings, options)
    if format == "png" and len(info) != 1:
        raise InvalidInput(f"format=png returns one image but the request has {len(info)}; use format=json")
    assert card.explanation is not None
    maps = outputs[card.explanation.name]  # (N, K, rows, columns)
    predicted = outputs[card.scores.output].argmax(axis=1)
    chosen = predicted if class_index is None else np.full_like(predicted, class_index)
    field = card.receptive_field
    grids = maps[np.arange(len(info)), chosen]  # (N, rows, columns)
    heat = [input_heatmap(g, field.size, field.stride, card.image_size) for g in grids]
    if format == "png":
        picture = await run_in_threadpool(overlay_png, image_2d(card, images[0]), heat[0], scale)
        return Response(picture, media_type="image/png")
    totals = maps.reshape(len(info), -1).sum(axis=1)
    return json_response(
        ExplainResponse(
            model=card.name,
            model_version=card.version,
            receptive_field=field.model_dump(),
            explanations=[
                Explanation(
                    index=i,
                    class_=int(chosen[i]),
                    label=card.classes[int(chosen[i])],
                    predicted_class=int(predicted[i]),
                    share=round(float(grids[i].sum() / totals[i]) if totals[i] > 0 else 0.0, DECIMALS),
                    grid=rounded(grids[i]),
                    heatmap=rounded(heat[i]),
                    preprocessing=info[i],
                )
                for i in range(len(info))
            ],
        )
    )


def build_router() -> APIRouter:
    router = APIRouter(tags=["v1"])
    for prefix, suffix, which, parameters in ADDRESSES:
        router.add_api_route(
            f"{prefix}/explain",
            explain,
            methods=["POST"],
            response_model=ExplainResponse,
            operation_id=f"explain_{suffix}",
            summary=f"Routing explanation: where the votes for a class came from ({which})",
            responses={**ERRORS, **PNG_RESPONSE},
            openapi_extra={**IMAGES_BODY, **({"parameters": parameters} if parameters else {})},
        )
    return router


router = build_router()

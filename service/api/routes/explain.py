"""v1 explain: which parts of the image the class score rests on (occlusion) or where the routing sent the votes
(the routing map), as JSON or a PNG overlay.

`/v1/models/{name}/explain` and `/v1/explain` (the default model); `method` picks the map (docs/explanations.md
has what each means and how faithful it measured). Occlusion works for every model; the routing map needs the
model's explanation output (docs/model-card.md), and a model without one answers 409.
(No `from __future__ import annotations` here: FastAPI must resolve the routes' annotations at runtime.)
"""

from typing import Annotated

import numpy as np
from fastapi import APIRouter, Query, Request, Response
from starlette.concurrency import run_in_threadpool

from service.api.deps import ModelDep, SettingsDep
from service.api.inputs import read_images
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
    image_2d,
    json_response,
    rounded,
)
from service.api.schemas import ExplainResponse, Explanation
from service.core.errors import InvalidInput, ModelCapabilityError
from service.explanation import (
    DEFAULT_METHOD,
    OCCLUSION_TILE,
    Method,
    input_heatmap,
    occluded_copies,
    occlusion_grid,
    occlusion_grid_size,
    occlusion_tiles,
    overlay_png,
)
from service.runtime.batcher import Tensors
from service.runtime.card import ModelCard
from service.runtime.model import ServedModel

MAX_SCALE = 32
OCCLUSION_CHUNK = 8  # occluded copies per request to the batcher: a classify request waits for one chunk at most


def require_explanation(model: ServedModel) -> ModelCard:
    card = model.require_ready()
    if card.explanation is None:
        raise ModelCapabilityError(
            f"model {model.name!r} has no routing map: its graph has no explanation output (role 'explanation'; "
            f"outputs: {[o.name for o in card.outputs]}); method=occlusion works for it. Dynamic-routing models "
            "exported before the output existed gain it with `capsnet-export --from-model-dir DIR --out DIR --force`"
        )
    return card


async def batched_scores(model: ServedModel, card: ModelCard, images: np.ndarray) -> np.ndarray:
    """The scores (M, K) of `images` (M, *image_shape), through the model's batcher in chunks of at most
    OCCLUSION_CHUNK rows (and the model's batch size), one after the other: requests that arrive meanwhile queue
    between the chunks, or share their runs, rather than wait for the whole map."""
    chunk = min(OCCLUSION_CHUNK, model.max_batch_size or OCCLUSION_CHUNK)
    parts = [np.zeros((0, len(card.classes)), np.float32)]
    for start in range(0, len(images), chunk):
        outputs = await model.infer(images[start : start + chunk])
        parts.append(outputs[card.scores.output])
    return np.concatenate(parts)


async def occlusion(
    model: ServedModel, card: ModelCard, images: np.ndarray, class_index: int | None
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Per image (N, *image_shape): its scores (N, K), the class explained (N,) and the drop of that class's score
    when each inked tile is blacked out (N, rows, columns). The images and all their occluded copies are scored
    together, the images first."""
    planes = [image_2d(card, image) for image in images]
    tiles = [occlusion_tiles(plane) for plane in planes]
    copies = np.concatenate([occluded_copies(plane, t) for plane, t in zip(planes, tiles, strict=True)])
    rows = np.concatenate([images, copies.reshape(len(copies), *card.image_shape)]).astype(np.float32, copy=False)
    everything = await batched_scores(model, card, rows)
    scores, occluded = everything[: len(images)], everything[len(images) :]
    chosen = scores.argmax(axis=1) if class_index is None else np.full(len(images), class_index)
    grids, offset = [], 0
    for i, t in enumerate(tiles):
        base = float(scores[i, chosen[i]])
        grids.append(
            occlusion_grid(base, occluded[offset : offset + len(t), chosen[i]], t, occlusion_grid_size(card.image_size))
        )
        offset += len(t)
    return scores, chosen, np.stack(grids)


def routing(
    card: ModelCard, outputs: Tensors, class_index: int | None
) -> tuple[np.ndarray, np.ndarray, np.ndarray, list[float]]:
    """Per image: its scores (N, K), the class explained (N,), that class's routing map (N, rows, columns) and its
    share of all routed vote strength."""
    assert card.explanation is not None
    scores, maps = outputs[card.scores.output], outputs[card.explanation.name]  # (N, K), (N, K, rows, columns)
    n = len(scores)
    chosen = scores.argmax(axis=1) if class_index is None else np.full(n, class_index)
    grids = maps[np.arange(n), chosen]
    totals = maps.reshape(n, -1).sum(axis=1)
    share = [round(float(g.sum() / t), DECIMALS) if t > 0 else 0.0 for g, t in zip(grids, totals, strict=True)]
    return scores, chosen, grids, share


async def explain(
    request: Request,
    model: ModelDep,
    settings: SettingsDep,
    options: OptionsDep,
    class_index: ClassQuery = None,
    method: Annotated[
        Method,
        Query(
            description="occlusion (default): how much the class score falls when each 4×4 tile of the input is "
            "blacked out; routing: where the primary capsules routed their votes (dynamic-routing models only)"
        ),
    ] = DEFAULT_METHOD,
    format: FormatQuery = "json",
    scale: Annotated[int, Query(ge=1, le=MAX_SCALE, description="format=png: upscale the overlay by this factor")] = 8,
) -> Response:
    """Per image, a map over the input of what the predicted class (or `class`) rests on (`method`): on a grid
    (`grid`, each cell seeing the input through `receptive_field`) and per input pixel (`heatmap`). `format=png`
    takes one image and returns the heatmap in colour over the input."""
    card = require_explanation(model) if method == "routing" else model.require_ready()
    check_class(card, class_index)
    batch = await read_images(request, card, settings, options)
    info, images = batch.info, batch.array
    if format == "png" and len(info) != 1:
        raise InvalidInput(f"format=png returns one image but the request has {len(info)}; use format=json")
    share: list[float | None] = [None] * len(info)
    if method == "routing":
        scores, chosen, grids, shares = routing(card, await model.infer(images), class_index)
        share = list(shares)
        size, stride = card.receptive_field.size, card.receptive_field.stride
    else:
        scores, chosen, grids = await occlusion(model, card, images, class_index)
        size = stride = OCCLUSION_TILE
    predicted = scores.argmax(axis=1)
    heat = [input_heatmap(g, size, stride, card.image_size) for g in grids]
    if format == "png":
        shown = heat[0] if method == "routing" else np.maximum(heat[0], 0.0)  # occlusion: the tiles the class needs
        picture = await run_in_threadpool(overlay_png, image_2d(card, images[0]), shown, scale)
        return Response(picture, media_type="image/png", headers={"X-Explanation-Method": method})
    return json_response(
        ExplainResponse(
            model=card.name,
            model_version=card.version,
            method=method,
            receptive_field={"size": size, "stride": stride},
            explanations=[
                Explanation(
                    index=i,
                    class_=int(chosen[i]),
                    label=card.classes[int(chosen[i])],
                    predicted_class=int(predicted[i]),
                    score=round(float(scores[i, chosen[i]]), DECIMALS),
                    share=share[i],
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
            summary=f"Explanation: what the class score rests on (occlusion) or the routing map ({which})",
            responses={**ERRORS, **PNG_RESPONSE},
            openapi_extra={**IMAGES_BODY, **({"parameters": parameters} if parameters else {})},
        )
    return router


router = build_router()

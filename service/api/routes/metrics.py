"""Prometheus exposition."""

from __future__ import annotations

from fastapi import APIRouter, Request, Response
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

router = APIRouter(tags=["metrics"])


@router.get("/metrics", summary="Prometheus metrics", response_class=Response)
async def metrics(request: Request) -> Response:
    registry = request.app.state.registry
    for name in list(registry.entries):  # queue depth is exact at scrape time
        for model in registry.versions(name):
            for graph, depth in model.queue_depth().items():
                request.app.state.metrics.queue_depth.labels(model=name, version=model.version, graph=graph).set(depth)
    return Response(generate_latest(request.app.state.metrics.registry), media_type=CONTENT_TYPE_LATEST)

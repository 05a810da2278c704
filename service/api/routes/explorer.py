"""The page at `/`: the explorer from service/static/ where it is installed, else a short index of the API."""

from __future__ import annotations

from pathlib import Path

from fastapi import APIRouter
from fastapi.responses import FileResponse, HTMLResponse, Response

STATIC_DIR = Path(__file__).resolve().parents[2] / "static"
INDEX_FILE = STATIC_DIR / "index.html"

PLACEHOLDER = """<!doctype html>
<html lang="en"><head><meta charset="utf-8"><meta name="viewport" content="width=device-width, initial-scale=1">
<title>capsnet-serve</title></head>
<body><h1>capsnet-serve</h1>
<p>Capsule Networks on ONNX Runtime.</p>
<ul>
<li><a href="/docs">API documentation (OpenAPI)</a></li>
<li><a href="/v1/models">Served models</a></li>
<li><a href="/health/ready">Readiness</a></li>
<li><a href="/metrics">Metrics</a></li>
</ul></body></html>
"""

# The page loads nothing from elsewhere: scripts, styles and images come from this service (blob: for the
# reconstructions it fetches, data: for canvas snapshots), and it talks only to this service's API.
CONTENT_SECURITY_POLICY = (
    "default-src 'self'; img-src 'self' blob: data:; connect-src 'self'; object-src 'none'; "
    "base-uri 'none'; form-action 'none'; frame-ancestors 'none'"
)

router = APIRouter()


@router.get("/", include_in_schema=False)
async def index() -> Response:
    if INDEX_FILE.is_file():
        return FileResponse(
            INDEX_FILE, media_type="text/html", headers={"Content-Security-Policy": CONTENT_SECURITY_POLICY}
        )
    return HTMLResponse(PLACEHOLDER)

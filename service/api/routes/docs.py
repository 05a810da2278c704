"""The API documentation pages, `/docs` (Swagger UI) and `/redoc`, with their assets served from this service.

FastAPI's defaults load Swagger UI and ReDoc from a CDN, so the pages stay blank without internet; the assets
come from the `fastapi-offline` package instead and are mounted at `ASSETS_PATH`.
"""

from __future__ import annotations

from importlib.resources import files
from pathlib import Path

from fastapi import APIRouter, FastAPI, Request
from fastapi.openapi.docs import get_redoc_html, get_swagger_ui_html, get_swagger_ui_oauth2_redirect_html
from fastapi.responses import HTMLResponse
from fastapi.staticfiles import StaticFiles

ASSETS_PATH = "/docs-assets"
ASSETS_DIR = Path(str(files("fastapi_offline") / "static"))

# The pages may load only from this service: ReDoc's bundle also points at a logo on its CDN, which this blocks.
CONTENT_SECURITY_POLICY = (
    "default-src 'self'; script-src 'self' 'unsafe-inline'; style-src 'self' 'unsafe-inline'; "
    "img-src 'self' data:; worker-src 'self' blob:; connect-src 'self'; object-src 'none'; base-uri 'none'"
)

router = APIRouter(include_in_schema=False)


def _page(response: HTMLResponse) -> HTMLResponse:
    response.headers["Content-Security-Policy"] = CONTENT_SECURITY_POLICY
    return response


def _url(request: Request, path: str) -> str:
    """`path` under the prefix the service is mounted at (its ASGI root_path)."""
    return f"{request.scope.get('root_path', '')}{path}"


def _asset(request: Request, name: str) -> str:
    return _url(request, f"{ASSETS_PATH}/{name}")


@router.get("/docs")
async def swagger_ui(request: Request) -> HTMLResponse:
    app = request.app
    return _page(
        get_swagger_ui_html(
            openapi_url=_url(request, app.openapi_url),
            title=f"{app.title} - Swagger UI",
            oauth2_redirect_url="/docs/oauth2-redirect",
            swagger_js_url=_asset(request, "swagger-ui-bundle.js"),
            swagger_css_url=_asset(request, "swagger-ui.css"),
            swagger_favicon_url=_asset(request, "favicon.png"),
        )
    )


@router.get("/docs/oauth2-redirect")
async def swagger_ui_redirect() -> HTMLResponse:
    return get_swagger_ui_oauth2_redirect_html()


@router.get("/redoc")
async def redoc(request: Request) -> HTMLResponse:
    app = request.app
    return _page(
        get_redoc_html(
            openapi_url=_url(request, app.openapi_url),
            title=f"{app.title} - ReDoc",
            redoc_js_url=_asset(request, "redoc.standalone.js"),
            redoc_favicon_url=_asset(request, "favicon.png"),
            with_google_fonts=False,
        )
    )


def install_docs(app: FastAPI) -> None:
    """Serve `/docs` and `/redoc` from local assets (create the app with `docs_url=None, redoc_url=None`)."""
    app.include_router(router)
    app.mount(ASSETS_PATH, StaticFiles(directory=ASSETS_DIR), name="docs-assets")

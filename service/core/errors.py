"""The service's errors and the one place that turns them into HTTP responses.

v2 (Open Inference Protocol) routes answer `{"error": "<message>"}` exactly, as the protocol says; every
other route answers `{"error": "<message>", "type": "<error type>"}`.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Mapping
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.requests import ClientDisconnect

logger = logging.getLogger(__name__)

V2_PREFIX = "/v2"


class ServiceError(Exception):
    """Base class: `status` is the HTTP status, `type` a stable machine-readable name, str(self) the message."""

    status: int = 500
    type: str = "internal_error"

    def __init__(self, message: str, *, headers: dict[str, str] | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.headers = headers or {}


class InvalidInput(ServiceError):
    status, type = 400, "invalid_input"


class Unauthorized(ServiceError):
    """No valid bearer token; the message never repeats what the client sent."""

    status, type = 401, "unauthorized"

    def __init__(self, message: str, *, invalid_token: bool = False) -> None:
        challenge = 'Bearer error="invalid_token"' if invalid_token else "Bearer"
        super().__init__(message, headers={"WWW-Authenticate": challenge})


class Forbidden(ServiceError):
    """A valid request the server is not configured to allow (model control off, a token without the scope)."""

    status, type = 403, "forbidden"


class ModelLoadFailed(ServiceError):
    """A model (version) could not be loaded; whatever served before keeps serving."""

    status, type = 400, "model_load_failed"


class ModelNotFound(ServiceError):
    status, type = 404, "model_not_found"


class ModelCapabilityError(ServiceError):
    """The model cannot do what was asked (e.g. reconstruct without a decoder)."""

    status, type = 409, "model_capability"


class OutOfDistribution(ServiceError):
    """An image the model's calibrated 'not a digit' score rejects, when the client asked for rejection."""

    status, type = 422, "out_of_distribution"


class NonFiniteOutput(ServiceError):
    """The model computed NaN or infinity for the request's input: never sent as numbers (JSON has none for them)."""

    status, type = 422, "non_finite_output"


class PayloadTooLarge(ServiceError):
    status, type = 413, "payload_too_large"


class UnsupportedMediaType(ServiceError):
    status, type = 415, "unsupported_media_type"


class ServiceUnavailable(ServiceError):
    """Base for 503s: they carry `Retry-After` (seconds)."""

    status, type = 503, "unavailable"

    def __init__(self, message: str, *, retry_after_s: int = 1) -> None:
        super().__init__(message, headers={"Retry-After": str(retry_after_s)})


class ModelNotReady(ServiceUnavailable):
    type = "model_not_ready"


class Overloaded(ServiceUnavailable):
    type = "overloaded"


class ShuttingDown(ServiceUnavailable):
    type = "shutting_down"


class InferenceTimeout(ServiceError):
    status, type = 504, "timeout"


def error_body(path: str, message: str, error_type: str) -> dict[str, Any]:
    if path == V2_PREFIX or path.startswith(V2_PREFIX + "/"):
        return {"error": message}
    return {"error": message, "type": error_type}


def error_response(
    request: Request, status: int, message: str, error_type: str, headers: dict[str, str] | None = None
) -> JSONResponse:
    return JSONResponse(error_body(request.url.path, message, error_type), status_code=status, headers=headers)


def service_error_response(method: str, path: str, exc: ServiceError) -> JSONResponse:
    """The answer to a ServiceError raised while serving `method path` (5xx are logged: they are ours)."""
    if exc.status >= 500:
        logger.warning("%s %s -> %d: %s", method, path, exc.status, exc.message)
    return JSONResponse(error_body(path, exc.message, exc.type), status_code=exc.status, headers=exc.headers)


# Where a request validation error points: the first element of its `loc`.
SOURCES = {"query": "query parameter", "path": "path parameter", "body": "body field", "header": "header"}


def describe_errors(errors: Iterable[Mapping[str, Any]], *, request: bool = False, whole: str = "body") -> str:
    """Pydantic errors as one line, "<where>: <message>" joined by "; ".

    `request=True` reads FastAPI's request locations, e.g. "query parameter 'top_k': Input should be greater
    than or equal to 1"; otherwise the location is the dotted field path ("images.0.data"), or `whole` when the
    error is about the object itself.
    """
    parts = []
    for err in errors:
        loc = [str(p) for p in err.get("loc", ())]
        if request:
            where = SOURCES.get(loc[0] if loc else "", "input")
            name = ".".join(loc[1:])
            where = f"{where} '{name}'" if name else where
        else:
            where = ".".join(loc) or whole
        parts.append(f"{where}: {err.get('msg')}")
    return "; ".join(parts) or "invalid request"


HTTP_TYPES = {404: "not_found", 405: "method_not_allowed"}
# The status recorded for a request whose client went away before sending its whole body (nginx's 499): nobody
# reads the answer, but the metrics and the access log say what happened.
CLIENT_CLOSED_REQUEST = 499


def http_error_message(request: Request, status: int, detail: str, headers: Mapping[str, str]) -> str:
    """Starlette's bare "Not Found" / "Method Not Allowed", said in full: which route, which methods to use."""
    if status == 404:  # the path is not echoed: a client's bytes never come back in a page or a log reader
        return f"no route for {request.method} at this path; see /docs for the routes"
    if status == 405 and headers.get("Allow"):
        allowed = ", ".join(m for m in headers["Allow"].split(", ") if m != "HEAD") or headers["Allow"]
        return f"method {request.method} is not allowed at this path; use {allowed}"
    return detail


def install_error_handlers(app: FastAPI) -> None:
    """Map every error to JSON in one place; nothing reaches the client as an HTML page or a bare 500."""

    async def service_error(request: Request, exc: Exception) -> JSONResponse:
        assert isinstance(exc, ServiceError)
        return service_error_response(request.method, request.url.path, exc)

    async def validation_error(request: Request, exc: Exception) -> JSONResponse:
        assert isinstance(exc, RequestValidationError)
        return error_response(request, 400, describe_errors(exc.errors(), request=True), "invalid_input")

    async def http_error(request: Request, exc: Exception) -> JSONResponse:
        assert isinstance(exc, StarletteHTTPException)
        headers = dict(exc.headers or {})
        message = http_error_message(request, exc.status_code, str(exc.detail), headers)
        error_type = HTTP_TYPES.get(exc.status_code, "http_error")
        return error_response(request, exc.status_code, message, error_type, headers)

    async def client_gone(request: Request, exc: Exception) -> JSONResponse:
        assert isinstance(exc, ClientDisconnect)
        logger.info("%s %s: the client disconnected before sending the whole body", request.method, request.url.path)
        message = "the client disconnected before sending the whole body"
        return error_response(request, CLIENT_CLOSED_REQUEST, message, "client_disconnected")

    async def unexpected_error(request: Request, exc: Exception) -> JSONResponse:
        logger.exception("unhandled error in %s %s", request.method, request.url.path, exc_info=exc)
        return error_response(request, 500, "internal server error", "internal_error")

    app.add_exception_handler(ServiceError, service_error)
    app.add_exception_handler(RequestValidationError, validation_error)
    app.add_exception_handler(StarletteHTTPException, http_error)
    app.add_exception_handler(ClientDisconnect, client_gone)  # a network event, not a server error (no traceback)
    app.add_exception_handler(Exception, unexpected_error)

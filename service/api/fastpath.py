"""The hot v1 operations (classify and capsules, default or named model) served by one pure-ASGI handler in
front of FastAPI's router: no routing, dependency solving or response classes per request.

It takes only the plain case: `POST` with no query string, a `Content-Length` body, a valid bearer token
where one is needed, a ready model and an image media type. Everything else goes on untouched to the FastAPI
route, so every option and status stays exactly as the route answers it. The response is built by the route's
own function (`classify_result`, `capsules_result`), so both answer with the same JSON. Errors once the body is
read (a bad image, too many, an overloaded model) are answered here by the handlers' own function
(`service_error_response`), so a body is parsed once and a batch never runs twice.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from pydantic import BaseModel
from starlette.datastructures import State
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from service.api.inputs import IMAGE_MEDIA, ImageBatch, images_from_body, media_of
from service.api.routes.inference import (
    ADDRESSES,
    DEFAULT_OPTIONS,
    DEFAULT_TOP_K,
    capsules_result,
    check_top_k,
    classify_result,
)
from service.core.auth import TokenStore, bearer_token
from service.core.errors import ServiceError, service_error_response
from service.runtime.batcher import Tensors
from service.runtime.card import ModelCard
from service.runtime.model import ServedModel
from service.runtime.registry import ModelRegistry

# The routes' own addresses: "/v1" (default model) and "/v1/models/{name}".
(DEFAULT_ADDRESS, *_), (NAMED_ADDRESS, *_) = ADDRESSES
DEFAULT_PREFIX = DEFAULT_ADDRESS + "/"
NAMED_PREFIX = NAMED_ADDRESS.removesuffix("{name}")
WANTED_HEADERS = (b"content-length", b"content-type", b"authorization")


@dataclass(frozen=True)
class FastOperation:
    """A v1 operation the fast path serves: what it checks before reading the body, and its response."""

    check: Callable[[ModelCard], None]
    result: Callable[[ModelCard, ImageBatch, Tensors], BaseModel]


OPERATIONS = {
    "classify": FastOperation(
        check=lambda card: check_top_k(card, DEFAULT_TOP_K),
        result=lambda card, batch, outputs: classify_result(
            card, batch.info, batch.array, outputs, DEFAULT_TOP_K, include_input=False, reject_ood=False
        ),
    ),
    "capsules": FastOperation(
        check=lambda card: None,
        result=lambda card, batch, outputs: capsules_result(
            card, batch.info, batch.array, outputs, include_input=False, reject_ood=False
        ),
    ),
}


def address(path: str) -> tuple[str, str | None] | None:
    """(operation, model name or None for the default model) of a path the fast path serves, else None."""
    if path.startswith(NAMED_PREFIX):
        name, slash, operation = path[len(NAMED_PREFIX) :].partition("/")
        return (operation, name) if name and slash and operation in OPERATIONS else None
    operation = path[len(DEFAULT_PREFIX) :] if path.startswith(DEFAULT_PREFIX) else ""
    return (operation, None) if operation in OPERATIONS else None


def route_template(operation: str, named: bool) -> str:
    return f"{NAMED_ADDRESS}/{operation}" if named else f"{DEFAULT_PREFIX}{operation}"


@dataclass(frozen=True)
class RouteTemplate:
    """What ServiceMiddleware reads of `scope["route"]` to label the metrics: the route's path template."""

    path: str


def json_headers(length: int) -> list[tuple[bytes, bytes]]:
    """The headers of a JSON body, as a Starlette Response (the route's) sends them."""
    return [(b"content-length", str(length).encode()), (b"content-type", b"application/json")]


def first_headers(scope: Scope) -> dict[bytes, bytes]:
    """The first value of each header the fast path reads (as Starlette's `Headers.get` would take it)."""
    found: dict[bytes, bytes] = {}
    for key, value in scope["headers"]:
        if key in WANTED_HEADERS and key not in found:
            found[key] = value
    return found


def replay(messages: list[Message], receive: Receive) -> Receive:
    """A receive that hands out `messages` again, then reads on from the client."""
    pending = list(messages)

    async def replayed() -> Message:
        return pending.pop(0) if pending else await receive()

    return replayed


class FastPath:
    """Serves POST /v1/{classify,capsules} and /v1/models/{name}/{classify,capsules} in their plain form;
    passes every other request, and every request it cannot answer as the route would, to `app`.

    Sits inside ServiceMiddleware, which counts what it answers under the route's template (it sets
    `scope["route"]` as the router would) and has already refused bodies declared over the limit.
    """

    def __init__(self, app: ASGIApp, state: State) -> None:
        self.app, self.state = app, state
        self.templates = {
            (operation, named): RouteTemplate(route_template(operation, named))
            for operation in OPERATIONS
            for named in (False, True)
        }

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        target = self.target(scope)
        served = self.model(scope, *target) if target is not None else None
        if target is None or served is None:
            await self.app(scope, receive, send)
            return
        (operation, name), (model, card, content_type) = target, served
        with model.lease():  # a swap meanwhile lets this request finish on the version it looked up
            messages = await self.read_body(receive)
            if messages[-1]["type"] != "http.request":  # the client went away: the route answers it as it does
                await self.app(scope, replay(messages, receive), send)
                return
            scope["route"] = self.templates[operation, name is not None]
            scope["path_params"] = {} if name is None else {"name": name}
            body = b"".join(m.get("body", b"") for m in messages)
            try:  # a client error in the body is answered here, as the route's handler would: the body is parsed once
                batch = await self.read(scope, body, content_type, card)
                outputs = await model.infer(batch.array, alone=self.alone())
            except ServiceError as e:
                await service_error_response(scope["method"], scope["path"], e)(scope, receive, send)
                return
            body = OPERATIONS[operation].result(card, batch, outputs).model_dump_json(by_alias=True).encode()
            await send({"type": "http.response.start", "status": 200, "headers": json_headers(len(body))})
            await send({"type": "http.response.body", "body": body})

    def target(self, scope: Scope) -> tuple[str, str | None] | None:
        if scope["type"] != "http" or scope["method"] != "POST" or scope["query_string"] or scope.get("root_path"):
            return None
        return address(scope["path"])

    def model(self, scope: Scope, operation: str, name: str | None) -> tuple[ServedModel, ModelCard, str] | None:
        """The ready model a plain request addresses (with the request's Content-Type), or None when the route
        must answer (for any reason)."""
        headers = first_headers(scope)
        if not headers.get(b"content-length", b"").isdigit() or not self.authorized(headers.get(b"authorization")):
            return None
        registry: ModelRegistry = self.state.registry
        try:
            model = registry.default() if name is None else registry.get(name)
            card = model.require_ready()
            OPERATIONS[operation].check(card)
        except ServiceError:
            return None
        content_type = headers.get(b"content-type", b"").decode("latin-1")
        if media_of(content_type) not in IMAGE_MEDIA:  # the route answers 415 without reading the body
            return None
        return model, card, content_type

    def alone(self) -> bool:
        """uvicorn has read no HTTP request but this one, on any connection: its set of request tasks (one per
        request read, until answered; `state.http_tasks`, set by `service.main.http_server`) holds only this one.
        Unknown (another server) counts as not alone."""
        tasks: set[object] | None = getattr(self.state, "http_tasks", None)
        return tasks is not None and len(tasks) <= 1

    def authorized(self, authorization: bytes | None) -> bool:
        tokens: TokenStore | None = self.state.tokens
        return tokens is None or tokens.check(bearer_token(authorization.decode("latin-1") if authorization else None))

    @staticmethod
    async def read_body(receive: Receive) -> list[Message]:
        """Every message up to the end of the body (or a disconnect), to be replayed to whoever reads it."""
        messages = [await receive()]
        while messages[-1]["type"] == "http.request" and messages[-1].get("more_body", False):
            messages.append(await receive())
        return messages

    async def read(self, scope: Scope, body: bytes, content_type: str, card: ModelCard) -> ImageBatch:
        """The images of the request's whole body, as the route reads them (a ServiceError for a client error)."""
        return await images_from_body(content_type, body, card, self.state.settings, DEFAULT_OPTIONS)

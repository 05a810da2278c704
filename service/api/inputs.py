"""Reading images from v1 requests: multipart files, or JSON with base64 data or raw arrays."""

from __future__ import annotations

import base64
import binascii
import json
import math
from dataclasses import dataclass
from typing import Any, Literal, TypeVar

import numpy as np
from fastapi import Request
from PIL import Image
from pydantic import BaseModel, ValidationError
from starlette.concurrency import run_in_threadpool

from service.api.multipart import MalformedMultipart, TooManyParts, parse_multipart
from service.api.schemas import ImageInput, ImagesRequest, InputInfo
from service.core.config import Settings, env_name
from service.core.errors import InvalidInput, PayloadTooLarge, ServiceError, UnsupportedMediaType, describe_errors
from service.imaging import ImageDecodeError, ImageLimits, array_from_pixels, load_image, open_image, preprocess
from service.runtime.card import ModelCard

Invert = Literal["auto", "true", "false"]
INVERT_CHOICES: dict[str, bool | None] = {"auto": None, "true": True, "false": False}
M = TypeVar("M", bound=BaseModel)
# Images up to this many pixels are decoded and prepared on the event loop (well under a millisecond): for them
# a worker thread would cost more than the work. Larger ones go to a thread so the loop keeps serving.
INLINE_PIXELS = 128 * 128
IMAGE_CONTENT_TYPES = "multipart/form-data (image files) or application/json ({'images': [...]})"
# The setting behind each ImageLimits field, named in the 413 a client gets for going over it.
LIMIT_SETTINGS = {"max_pixels": "max_image_pixels", "max_bytes": "max_image_bytes"}
# JSON bodies up to this size are parsed on the event loop (a 28×28 array is ~4 KB); larger ones on a worker thread.
INLINE_JSON_BYTES = 64 * 1024
# Room in a JSON body's value budget (`check_json_values`) for the fields around the tensors.
JSON_SLACK_VALUES = 1024


@dataclass(frozen=True)
class PreprocessOptions:
    invert: bool | None
    normalize: bool


@dataclass(frozen=True)
class ImageBatch:
    """The model's input (N, *image_shape) and how each image was prepared."""

    array: np.ndarray
    info: list[InputInfo]


def media_type(request: Request) -> str:
    return media_of(request.headers.get("content-type", ""))


def media_of(content_type: str) -> str:
    """The media type of a Content-Type header value, lower case, without its parameters."""
    return content_type.split(";")[0].strip().lower()


def image_error(e: ImageDecodeError, where: str) -> ServiceError:
    message = f"{where}: {e}"
    if e.status == 413:
        setting = LIMIT_SETTINGS.get(e.limit or "")
        return PayloadTooLarge(f"{message} ({env_name(setting)})" if setting else message)
    if e.status == 415:
        return UnsupportedMediaType(message)
    return InvalidInput(message)


async def read_json(request: Request, cls: type[M], most_values: int, setting: str) -> M:
    """The body parsed as JSON into `cls`; 415 for another content type, 413 for more than `most_values` values
    (`check_json_values`, naming `setting`), 400 for malformed JSON or a body `cls` refuses."""
    if media_type(request) != "application/json":
        raise UnsupportedMediaType(
            f"unsupported content type {media_type(request) or '(none)'!r}; send application/json"
        )
    body = await request.body()
    check_json_values(body, most_values, setting)
    return await parse_body(cls, body)


def parse_json(body: bytes) -> Any:
    """JSON from the client: 400 for bytes that are not JSON, an integer too long to convert, or JSON nested too
    deeply for the parser."""
    try:
        return json.loads(body)
    except ValueError as e:  # JSONDecodeError, UnicodeDecodeError, an integer of more than 4300 digits
        raise InvalidInput(f"malformed JSON: {e}") from e
    except RecursionError as e:
        raise InvalidInput("malformed JSON: nested too deeply") from e


def check_json_values(body: bytes, most: int, setting: str) -> None:
    """413 for a JSON body with more than `most` values, before it is parsed: each comma separates two (a comma in a
    string counts too, so this is an upper bound), counted at memory speed. Parsing costs per value, not per byte:
    a body of many tiny values would otherwise hold the event loop (or the GIL) for seconds before its count is
    known."""
    if (values := body.count(b",") + 1) > most:
        raise PayloadTooLarge(
            f"JSON body too large: {values} values or more, the most a request may need is {most} ({setting})"
        )


async def parse_body(cls: type[M], body: bytes) -> M:
    """JSON `body` validated as `cls`; above INLINE_JSON_BYTES on a worker thread, so the event loop reads on."""
    if len(body) <= INLINE_JSON_BYTES:
        return parse_model(cls, parse_json(body))
    return await run_in_threadpool(lambda: parse_model(cls, parse_json(body)))


def parse_model(cls: type[M], data: Any) -> M:
    try:
        return cls.model_validate(data)
    except ValidationError as e:
        raise InvalidInput(f"invalid request body: {describe_errors(e.errors())}") from e


def decode_base64(data: str, where: str) -> bytes:
    """The bytes of base64 text or of a base64 ``data:`` URL (RFC 2397).

    Whitespace is ignored (``base64`` wraps its output at 76 columns) and missing ``=`` padding is restored.
    A ``data:`` URL must name an image/* media type (415 otherwise; none means text/plain) and say ``;base64``.
    """
    if data.startswith("data:"):
        data = data_url_payload(data, where)
    compact = "".join(data.split())
    unpadded = compact.rstrip("=")
    if len(unpadded) % 4 == 1:
        raise InvalidInput(
            f"{where}: malformed base64: {len(unpadded)} characters before the padding cannot encode whole bytes "
            "(truncated?)"
        )
    try:
        return base64.b64decode(compact + "=" * (-len(compact) % 4), validate=True)
    except (binascii.Error, ValueError) as e:
        raise InvalidInput(f"{where}: malformed base64: {e}") from e


def data_url_payload(url: str, where: str) -> str:
    """The base64 text of ``data:<media type>[;<parameter>]*;base64,<data>``, its media type checked."""
    header, comma, payload = url.partition(",")
    if not comma:
        raise InvalidInput(f"{where}: malformed data: URL (no comma)")
    media, *parameters = header.removeprefix("data:").split(";")
    media = media.strip().lower() or "text/plain"  # RFC 2397's default
    if not media.startswith("image/"):
        raise UnsupportedMediaType(f"{where}: data: URL has media type {media!r}; send an image (image/png, …)")
    if "base64" not in (p.strip().lower() for p in parameters):
        raise InvalidInput(f"{where}: only base64 data: URLs are accepted (data:{media};base64,…)")
    return payload


def prepare_image(img: Image.Image, size: tuple[int, int], options: PreprocessOptions) -> tuple[np.ndarray, bool, bool]:
    """Decode and preprocess one opened image to ``size`` (height, width)."""
    result = preprocess(load_image(img), size, invert=options.invert, normalize=options.normalize)
    return result.array, result.inverted, result.normalized


@dataclass(frozen=True)
class ImageTarget:
    """What every image of a request becomes: the model's (height, width), prepared with these options."""

    size: tuple[int, int]
    options: PreprocessOptions
    limits: ImageLimits


@dataclass(frozen=True)
class Encoded:
    """One encoded image of a request, its header read (`open_image`): its pixels not decoded yet."""

    image: Image.Image
    source: str
    filename: str | None
    where: str


def open_encoded(data: bytes, source: str, filename: str | None, where: str, limits: ImageLimits) -> Encoded:
    try:
        return Encoded(open_image(data, limits), source, filename, where)  # the per-image limits, from the header
    except ImageDecodeError as e:
        raise image_error(e, where) from e


async def prepare_encoded(encoded: Encoded, target: ImageTarget) -> tuple[np.ndarray, InputInfo]:
    img = encoded.image
    try:
        if img.width * img.height <= INLINE_PIXELS:
            array, inverted, normalized = prepare_image(img, target.size, target.options)
        else:
            array, inverted, normalized = await run_in_threadpool(prepare_image, img, target.size, target.options)
    except ImageDecodeError as e:
        raise image_error(e, encoded.where) from e
    return array, InputInfo(source=encoded.source, filename=encoded.filename, inverted=inverted, normalized=normalized)


def check_request_pixels(images: list[Encoded], settings: Settings) -> None:
    """413 when the request's images have more pixels together than `max_request_pixels` (read from headers)."""
    total = sum(e.image.width * e.image.height for e in images)
    if total > settings.max_request_pixels:
        raise PayloadTooLarge(
            f"the request's {len(images)} images have {total} pixels together, more than the limit of "
            f"{settings.max_request_pixels} ({env_name('max_request_pixels')})"
        )


def multipart_files(content_type: str, body: bytes, settings: Settings) -> list[tuple[bytes, str | None]]:
    """The file parts of a multipart body as (bytes, filename); a form field is a client mistake; 413 for more
    parts than images allowed, counted before the body is parsed."""
    try:
        parts = parse_multipart(content_type, body, max_parts=settings.max_images_per_request)
    except TooManyParts as e:
        raise PayloadTooLarge(too_many_images(str(e.parts), settings)) from e
    except MalformedMultipart as e:
        raise InvalidInput(f"malformed multipart body: {e}") from e
    for part in parts:
        if part.filename is None:
            raise InvalidInput(
                f"unexpected form field {part.name!r}: send images as file parts; options go in the query string"
            )
    return [(bytes(part.data), part.filename) for part in parts]


def too_many_images(count: str, settings: Settings) -> str:
    return (
        f"too many images: {count} in one request, the limit is {settings.max_images_per_request} "
        f"({env_name('max_images_per_request')})"
    )


def check_count(n: int, settings: Settings) -> None:
    if n == 0:
        raise InvalidInput("no images in the request")
    if n > settings.max_images_per_request:
        raise PayloadTooLarge(too_many_images(str(n), settings))


def as_model_input(arrays: list[np.ndarray], card: ModelCard) -> np.ndarray:
    # one image: a view with a batch axis (np.stack costs a dozen numpy calls, each from cold caches for a lone request)
    batch = (arrays[0][np.newaxis] if len(arrays) == 1 else np.stack(arrays)).astype(np.float32, copy=False)
    if batch[0].size != math.prod(card.image_shape):
        raise InvalidInput(f"model {card.name!r} expects images of shape {list(card.image_shape)}")
    return batch.reshape(len(arrays), *card.image_shape)


IMAGE_MEDIA = ("multipart/form-data", "application/json")  # the media types of v1 image requests


def check_image_media(content_type: str) -> str:
    """The media type of a v1 image request; 415 for one that cannot carry images (before the body is read)."""
    kind = media_of(content_type)
    if kind not in IMAGE_MEDIA:
        raise UnsupportedMediaType(f"unsupported content type {kind or '(none)'!r}; send {IMAGE_CONTENT_TYPES}")
    return kind


async def read_images(request: Request, card: ModelCard, settings: Settings, options: PreprocessOptions) -> ImageBatch:
    """All images of a v1 request, preprocessed into the model's input batch (its size from the card)."""
    content_type = request.headers.get("content-type", "")
    check_image_media(content_type)
    return await images_from_body(content_type, await request.body(), card, settings, options)


async def images_from_body(
    content_type: str, body: bytes, card: ModelCard, settings: Settings, options: PreprocessOptions
) -> ImageBatch:
    """`read_images` for a body already read (the fast path has it in hand): the same checks and errors. Every
    limit is checked before the work it bounds: the image count before parsing, every image's header (its size
    and the request's pixels) before any image is decoded."""
    limits = ImageLimits(max_pixels=settings.max_image_pixels, max_bytes=settings.max_image_bytes)
    target = ImageTarget(card.image_size, options, limits)
    kind = check_image_media(content_type)
    images: list[Encoded | np.ndarray] = []  # in request order: encoded images, or raw arrays already prepared
    if kind == "multipart/form-data":
        files = multipart_files(content_type, body, settings)
        check_count(len(files), settings)
        for i, (data, filename) in enumerate(files):
            images.append(open_encoded(data, "file", filename, f"file {i} ({filename})", limits))
    else:
        height, width = card.image_size
        check_json_values(body, settings.max_images_per_request * (height * width + 2) + JSON_SLACK_VALUES,
                          env_name("max_images_per_request"))  # fmt: skip
        parsed = await parse_body(ImagesRequest, body)
        check_count(len(parsed.images), settings)
        for i, image in enumerate(parsed.images):
            images.append(json_image(image, f"images[{i}]", target))
    check_request_pixels([e for e in images if isinstance(e, Encoded)], settings)
    arrays: list[np.ndarray] = []
    info: list[InputInfo] = []
    for item in images:
        if isinstance(item, np.ndarray):
            array, meta = item, InputInfo(source="array", inverted=False, normalized=False)  # used as sent
        else:
            array, meta = await prepare_encoded(item, target)
        arrays.append(array)
        info.append(meta)
    return ImageBatch(as_model_input(arrays, card), info)


def json_image(image: ImageInput, where: str, target: ImageTarget) -> Encoded | np.ndarray:
    """A JSON image: base64 data with its header read, or a raw array checked and scaled to [0, 1]."""
    if image.data is not None:
        return open_encoded(decode_base64(image.data, where), "base64", None, where, target.limits)
    try:
        return array_from_pixels(image.array, target.size)
    except ImageDecodeError as e:
        raise image_error(e, f"{where}.array") from e

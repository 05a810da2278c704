"""The one place that turns the service's errors into gRPC status codes, as `core/errors.py` does for HTTP."""

from __future__ import annotations

import grpc

from service.core.errors import (
    Forbidden,
    InferenceTimeout,
    InvalidInput,
    ModelCapabilityError,
    ModelLoadFailed,
    ModelNotFound,
    NonFiniteOutput,
    PayloadTooLarge,
    ServiceError,
    ServiceUnavailable,
    UnsupportedMediaType,
)

STATUS_CODES: dict[type[ServiceError], grpc.StatusCode] = {
    InvalidInput: grpc.StatusCode.INVALID_ARGUMENT,
    UnsupportedMediaType: grpc.StatusCode.INVALID_ARGUMENT,
    ModelNotFound: grpc.StatusCode.NOT_FOUND,
    NonFiniteOutput: grpc.StatusCode.INVALID_ARGUMENT,
    ModelCapabilityError: grpc.StatusCode.FAILED_PRECONDITION,
    ModelLoadFailed: grpc.StatusCode.FAILED_PRECONDITION,
    Forbidden: grpc.StatusCode.PERMISSION_DENIED,
    PayloadTooLarge: grpc.StatusCode.RESOURCE_EXHAUSTED,
    ServiceUnavailable: grpc.StatusCode.UNAVAILABLE,
    InferenceTimeout: grpc.StatusCode.DEADLINE_EXCEEDED,
}
Metadata = tuple[tuple[str, str], ...]


def grpc_status(error: ServiceError) -> tuple[grpc.StatusCode, Metadata]:
    """The status code of an error (its nearest mapped class; INTERNAL for none) and its trailing metadata.

    The HTTP headers of an error become trailing metadata under the same lower-case names: a 503's
    `Retry-After` is `retry-after` (seconds to wait before retrying).
    """
    code = next((STATUS_CODES[c] for c in type(error).__mro__ if c in STATUS_CODES), grpc.StatusCode.INTERNAL)
    return code, tuple((name.lower(), value) for name, value in error.headers.items())

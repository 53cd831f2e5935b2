"""Typed errors and the one place they become gRPC status codes (and HTTP statuses).

Handlers raise these; ``status_for`` maps them. Anything else is INTERNAL: logged with the
request id, never shown to the client (no stack traces over the wire). The HTTP front
turns a status code into its HTTP status with ``http_status_for``, beside it.
"""

from __future__ import annotations

import grpc

__all__ = [
    "AlreadyExists",
    "DeadlineExceeded",
    "EmbedError",
    "FailedPrecondition",
    "InvalidArgument",
    "NotFound",
    "RequestTooLarge",
    "ResourceExhausted",
    "Unauthenticated",
    "Unavailable",
    "http_status_for",
    "quote",
    "status_for",
]

MAX_MESSAGE_CHARS = 1024  # a status message never carries more (trailers are ~8 KiB)



class EmbedError(Exception):
    """Base: a request the service refuses, with a message naming the field and the limit."""

    code: grpc.StatusCode = grpc.StatusCode.INTERNAL


class InvalidArgument(EmbedError):
    """Empty input, id out of range, too long, unknown enum value, text too large."""

    code = grpc.StatusCode.INVALID_ARGUMENT


class NotFound(EmbedError):
    """Unknown model or version."""

    code = grpc.StatusCode.NOT_FOUND


class AlreadyExists(EmbedError):
    """A shared-memory region of that name is already registered."""

    code = grpc.StatusCode.ALREADY_EXISTS


class FailedPrecondition(EmbedError):
    """The model cannot do this (POSITION_ONLY on a model without a position table)."""

    code = grpc.StatusCode.FAILED_PRECONDITION


class ResourceExhausted(EmbedError):
    """Queue or in-flight limit reached, or the response would exceed the message size."""

    code = grpc.StatusCode.RESOURCE_EXHAUSTED


class RequestTooLarge(ResourceExhausted):
    """A request body over ``max_message_bytes``: RESOURCE_EXHAUSTED, as gRPC answers an
    oversized message; over HTTP it is 413, not the 429 of a full queue (retrying the same
    body cannot succeed)."""


class Unavailable(EmbedError):
    """No model loaded yet, or draining for shutdown: retry elsewhere."""

    code = grpc.StatusCode.UNAVAILABLE


class DeadlineExceeded(EmbedError):
    """The deadline passed before compute; no work was done."""

    code = grpc.StatusCode.DEADLINE_EXCEEDED


class Unauthenticated(EmbedError):
    """Missing or wrong bearer token."""

    code = grpc.StatusCode.UNAUTHENTICATED


def quote(value: object, limit: int = 64) -> str:
    """A client-supplied value as it may appear in a message: ``repr`` of at most ``limit``
    characters of it (control characters escaped), then how much was left out. A 200 kB
    model name must not become a 200 kB status (the client's trailer limit would turn the
    answer into RESOURCE_EXHAUSTED) or a 200 kB log line."""
    if isinstance(value, bytes):
        value = value.decode("utf-8", errors="backslashreplace")
    if not isinstance(value, str):  # numbers, bools: their repr, clipped the same way
        text = repr(value)
        return text if len(text) <= limit else f"{text[:limit]}... ({len(text)} characters)"
    if len(value) <= limit:
        return repr(value)
    return f"{value[:limit]!r}... ({len(value)} characters)"


def status_for(exc: BaseException, request_id: str = "") -> tuple[grpc.StatusCode, str]:
    """The status code and client-facing message for any exception; the message is capped
    at ``MAX_MESSAGE_CHARS`` whatever raised it (a net under ``quote``)."""
    if isinstance(exc, EmbedError):
        message = str(exc)
        if len(message) > MAX_MESSAGE_CHARS:
            message = message[:MAX_MESSAGE_CHARS] + "... (message truncated)"
        return exc.code, message
    suffix = f" (request_id={quote(request_id)})" if request_id else ""
    return grpc.StatusCode.INTERNAL, f"internal error{suffix}; see server logs"


# The REST form of the protocol (KServe v2 / Triton): every code the service answers with,
# as an HTTP status. FAILED_PRECONDITION is 400, as KServe's REST server and Triton map a
# request the model cannot serve; RESOURCE_EXHAUSTED is 429 (retry later: queue full, or a
# response too large for this request's T, whose message names the T that fits).
_HTTP_STATUS: dict[grpc.StatusCode, int] = {
    grpc.StatusCode.OK: 200,
    grpc.StatusCode.INVALID_ARGUMENT: 400,
    grpc.StatusCode.FAILED_PRECONDITION: 400,
    grpc.StatusCode.OUT_OF_RANGE: 400,
    grpc.StatusCode.UNAUTHENTICATED: 401,
    grpc.StatusCode.PERMISSION_DENIED: 403,
    grpc.StatusCode.NOT_FOUND: 404,
    grpc.StatusCode.ALREADY_EXISTS: 409,
    grpc.StatusCode.RESOURCE_EXHAUSTED: 429,
    grpc.StatusCode.CANCELLED: 499,  # the client went away (nginx's code); never sent
    grpc.StatusCode.INTERNAL: 500,
    grpc.StatusCode.UNKNOWN: 500,
    grpc.StatusCode.DATA_LOSS: 500,
    grpc.StatusCode.UNIMPLEMENTED: 501,
    grpc.StatusCode.UNAVAILABLE: 503,
    grpc.StatusCode.DEADLINE_EXCEEDED: 504,
}


def http_status_for(code: grpc.StatusCode, cause: BaseException | None = None) -> int:
    """The HTTP status of a refusal with ``code``; ``cause`` (the typed error, when there
    is one) refines it where HTTP has a sharper word: a body over the limit is 413."""
    if isinstance(cause, RequestTooLarge):
        return 413
    return _HTTP_STATUS.get(code, 500)

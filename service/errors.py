"""Typed errors and the one place they become gRPC status codes.

Handlers raise these; ``status_for`` maps them. Anything else is INTERNAL: logged with the
request id, never shown to the client (no stack traces over the wire).
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
    "ResourceExhausted",
    "Unauthenticated",
    "Unavailable",
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

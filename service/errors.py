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
    "PermissionDenied",
    "ResourceExhausted",
    "Unauthenticated",
    "Unavailable",
    "status_for",
]


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


class PermissionDenied(EmbedError):
    """The caller may not do this here: a shared-memory RPC from a non-local peer, or a
    shared-memory object another identity has registered."""

    code = grpc.StatusCode.PERMISSION_DENIED


class Unauthenticated(EmbedError):
    """Missing or wrong bearer token."""

    code = grpc.StatusCode.UNAUTHENTICATED


def status_for(exc: BaseException, request_id: str = "") -> tuple[grpc.StatusCode, str]:
    """The status code and client-facing message for any exception."""
    if isinstance(exc, EmbedError):
        return exc.code, str(exc)
    suffix = f" (request_id={request_id})" if request_id else ""
    return grpc.StatusCode.INTERNAL, f"internal error{suffix}; see server logs"

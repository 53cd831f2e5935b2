"""The HTTP front's wire helpers: bodies read within the limit, headers, JSON responses,
TLS, and the page's files (``service/rpc/http.py`` routes; nothing here knows a route)."""

from __future__ import annotations

import asyncio
import json
import re
import ssl
import time
from importlib import resources
from typing import Any

from aiohttp import web

from service.errors import InvalidArgument, RequestTooLarge

__all__ = ["HEADER_LENGTH", "deadline", "error_response", "header_length", "json_response",
           "page_files", "read_body", "server_ssl_context"]

HEADER_LENGTH = "Inference-Header-Content-Length"
_JSON = "application/json"
_TIMEOUT_UNITS = {"H": 3600.0, "M": 60.0, "S": 1.0, "m": 1e-3, "u": 1e-6, "n": 1e-9}
_PAGE_FILES = {"index.html": "text/html", "page.js": "text/javascript", "page.css": "text/css"}


def server_ssl_context(cert: str, key: str, client_ca: str = "") -> ssl.SSLContext:
    """TLS for the HTTP port from the gRPC port's files; a client CA requires client
    certificates (mTLS), as on gRPC."""
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    context.load_cert_chain(cert, key)
    if client_ca:
        context.load_verify_locations(client_ca)
        context.verify_mode = ssl.CERT_REQUIRED
    context.set_alpn_protocols(["http/1.1"])
    return context


async def read_body(request: web.BaseRequest, limit: int) -> bytes:
    """The whole body, refused (413) before reading when it declares more than ``limit``
    bytes; a body without a length is read only until it passes the limit."""
    length = request.content_length
    if length is not None and length > limit:
        raise RequestTooLarge(f"request body is {length} bytes; max_message_bytes is {limit}")
    if length is not None:
        try:
            return await request.content.readexactly(length) if length else b""
        except asyncio.IncompleteReadError as e:  # the client stopped sending: its error
            raise InvalidArgument(f"request body ended after {len(e.partial)} of its "
                                  f"Content-Length {length} bytes") from None
    data = await request.content.read(limit + 1)
    while len(data) <= limit and not request.content.at_eof():
        data += await request.content.read(limit + 1 - len(data))
    if len(data) > limit:
        raise RequestTooLarge(f"request body is over max_message_bytes {limit}")
    return data


def header_length(request: web.BaseRequest) -> int | None:
    """The ``Inference-Header-Content-Length`` header, if given."""
    value = request.headers.get(HEADER_LENGTH)
    if value is None:
        return None
    if not value.isdigit():
        raise InvalidArgument(f"{HEADER_LENGTH}={value!r} must be a non-negative integer")
    return int(value)


def deadline(value: str | None) -> float | None:
    """``grpc-timeout`` (e.g. ``250m``) as a ``time.monotonic()`` deadline."""
    if value is None:
        return None
    m = re.fullmatch(r"(\d{1,8})([HMSmun])", value.strip())
    if m is None:
        raise InvalidArgument(f"grpc-timeout={value!r} must be 1-8 digits and a unit "
                              f"(H, M, S, m, u, n), e.g. '250m'")
    return time.monotonic() + int(m.group(1)) * _TIMEOUT_UNITS[m.group(2)]


def json_response(value: Any, status: int = 200) -> web.Response:
    """``value`` as a JSON response."""
    return web.Response(body=json.dumps(value, separators=(",", ":")).encode(),
                        status=status, content_type=_JSON)


def error_response(status: int, message: str,
                   headers: dict[str, str] | None = None) -> web.Response:
    """The protocol's error body, ``{"error": "<message>"}``."""
    return web.Response(body=json.dumps({"error": message}).encode(), status=status,
                        content_type=_JSON, headers=headers)


def page_files() -> dict[str, tuple[bytes, str]]:
    """The page's static files, read once from the package (shipped as package data)."""
    root = resources.files("service.rpc") / "page"
    return {name: ((root / name).read_bytes(), kind) for name, kind in _PAGE_FILES.items()}

"""The REST front's wire helpers: bodies read within the limit, headers, JSON responses,
TLS, and the page's files (``front.py`` routes; nothing here knows a route)."""

from __future__ import annotations

import asyncio
import json
import logging
import re
import ssl
import sys
import time
from importlib import resources
from typing import Any

import grpc
from aiohttp import web
from aiohttp.http_exceptions import HttpProcessingError

from service.errors import DeadlineExceeded, EmbedError, InvalidArgument, RequestTooLarge, quote

__all__ = [
    "BODY_SECONDS",
    "HEADER_LENGTH",
    "BodyTimeout",
    "ClientGone",
    "WireLog",
    "deadline",
    "error_response",
    "header_length",
    "json_response",
    "page_files",
    "read_body",
    "server_ssl_context",
]

HEADER_LENGTH = "Inference-Header-Content-Length"
_JSON = "application/json"
_TIMEOUT_UNITS = {"H": 3600.0, "M": 60.0, "S": 1.0, "m": 1e-3, "u": 1e-6, "n": 1e-9}
BODY_SECONDS = 60.0  # the longest a request body may take to arrive, whatever its deadline
_DIGITS = re.compile(r"[0-9]{1,18}")
_PAGE_FILES = {"index.html": "text/html", "page.js": "text/javascript", "page.css": "text/css"}


class BodyTimeout(DeadlineExceeded):
    """The request body did not arrive in time: 408 over HTTP (the client's fault, not
    the server's 504), and the connection is closed."""


class ClientGone(EmbedError):
    """The connection closed mid-body: counted as CANCELLED (499), answered to nobody."""

    code = grpc.StatusCode.CANCELLED


class WireLog(logging.LoggerAdapter):
    """aiohttp's server log. A request its parser refuses (a bad request line, header or
    chunk: aiohttp answers the 4xx itself) is one warning line, the client's bytes quoted,
    without a traceback; anything else aiohttp reports keeps its traceback (a bug)."""

    def exception(self, msg: object, *args: object, exc_info: Any = True,
                  **kwargs: Any) -> None:
        exc = exc_info if isinstance(exc_info, BaseException) else sys.exc_info()[1]
        if isinstance(exc, HttpProcessingError) and 400 <= (exc.code or 0) < 500:
            self.logger.warning("%s: %d %s", str(msg) % args, exc.code,
                                quote(exc.message, 200))
            return
        self.logger.error(msg, *args, exc_info=exc_info, **kwargs)


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


async def read_body(request: web.BaseRequest, limit: int,
                    deadline: float | None = None) -> bytes:
    """The whole body in time linear in its bytes however it is framed, refused (413)
    before reading when it declares more than ``limit`` bytes; a body without a length
    is read only until it passes the limit. The body must arrive by ``deadline`` (the
    request's ``grpc-timeout``) and within ``BODY_SECONDS``, else 408: a client sending
    one byte at a time holds a connection for that long at most."""
    length = request.content_length
    if length is not None and length > limit:
        raise RequestTooLarge(f"request body is {length} bytes; max_message_bytes is {limit}")
    seconds = BODY_SECONDS if deadline is None else min(BODY_SECONDS,
                                                        deadline - time.monotonic())
    try:
        if length is not None and request.content.is_eof():
            # All of it has arrived (a small body comes with its headers): taken as it
            # is, with no timer armed and nothing awaited.
            body = request.content.read_nowait()
            if len(body) != length:
                raise asyncio.IncompleteReadError(body, length)
            return body
        async with asyncio.timeout(max(seconds, 0.0)):
            if length is not None:  # readexactly gathers the blocks and joins them once
                return await request.content.readexactly(length) if length else b""
            return await _read_chunks(request.content, limit)
    except asyncio.IncompleteReadError as e:  # the client stopped sending: its error
        raise InvalidArgument(f"request body ended after {len(e.partial)} of its "
                              f"Content-Length {length} bytes") from None
    except TimeoutError:
        raise BodyTimeout(f"request body not received within {seconds:.3g} s (the request's "
                          f"grpc-timeout, at most {BODY_SECONDS:g} s)") from None
    except ConnectionError:  # the client went away mid-body: nobody to answer
        raise ClientGone("the client closed the connection while sending the body") from None


async def _read_chunks(content: Any, limit: int) -> bytes:
    """A body without a length (chunked): each block as it arrives, kept in a list and
    joined once (``data += block`` was quadratic: 40 MiB in small chunks took 3 s)."""
    blocks: list[bytes] = []
    size = 0
    while block := await content.readany():
        size += len(block)
        if size > limit:
            raise RequestTooLarge(f"request body is over max_message_bytes {limit}")
        blocks.append(block)
    return b"".join(blocks)


def header_length(request: web.BaseRequest) -> int | None:
    """The ``Inference-Header-Content-Length`` header, if given: ASCII digits only
    (``str.isdigit`` takes ``²``, which ``int`` refuses)."""
    value = request.headers.get(HEADER_LENGTH)
    if value is None:
        return None
    if _DIGITS.fullmatch(value) is None:
        raise InvalidArgument(f"{HEADER_LENGTH}={quote(value)} must be a non-negative "
                              f"integer (at most 18 ASCII digits)")
    return int(value)


def deadline(value: str | None) -> float | None:
    """``grpc-timeout`` (e.g. ``250m``) as a ``time.monotonic()`` deadline."""
    if value is None:
        return None
    m = re.fullmatch(r"([0-9]{1,8})([HMSmun])", value.strip())
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
    root = resources.files("service.rpc.http") / "page"
    return {name: ((root / name).read_bytes(), kind) for name, kind in _PAGE_FILES.items()}

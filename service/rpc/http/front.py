"""The REST form of the Open Inference Protocol (KServe v2 / Triton HTTP), and the page.

A third front on the same engine as the native and OIP gRPC fronts, in the same process
and on the same event loop: the same admission, batcher, limits and status table. Every
``/v2`` route runs inside ``Frame.run`` (auth, draining, metrics, error→status), applied
once where the route table is registered (``HttpFront._dispatch``), never per handler;
``Refused.code`` becomes the HTTP status in ``errors.http_status_for`` and the body is
``{"error": "<message>"}``; what each route answers is ``endpoints.py``. Open without
credentials, like gRPC health and reflection: only the page's static files (they hold no
data; the page's own calls carry the token).

Why aiohttp's low-level server (``aiohttp.web.Server``): it runs on the asyncio loop the
gRPC server already uses (so a request is admitted and batched on the loop that batches
gRPC requests, with no thread hop), parses with llhttp in C, sends the ``bytes`` body the
lookup wrote in place (after the headers, never joined to them: ``send.BufferAnswer``),
and takes an ``ssl.SSLContext`` for TLS/mTLS. No ``web.Application``: the route table here is
a handful of patterns, and its router, middleware chain and signals would be work per request
for nothing. uvicorn (httptools) would need an ASGI layer and its own server lifecycle
beside gRPC's; measured figures against a ceiling and a lookup floor on this same library
are in ``bench/``.

Deadline: the ``grpc-timeout`` header, in gRPC's own syntax (``200m`` = 200 ms; units
H M S m u n), as grpc-gateway reads it from HTTP requests. Request bodies larger than
``--max-message-bytes`` are refused with 413 from their ``Content-Length`` before a byte
is read (a chunked body is read only up to the limit). A request answered before its body
was read is closed without reading the rest (``_dispatch``). An answer is sent inside the
request's in-flight slot, its bytes held in the unsent-answer budget, until its last byte
has left (docs/security.md, "The REST front").
"""

from __future__ import annotations

import asyncio
import functools
import logging
import re
import ssl
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

import grpc
from aiohttp import web

from service import tracing
from service.engine import (
    Engine,
    RestSlots,
    Slot,
    StreamBudgets,
)
from service.errors import http_status_for
from service.rpc.frame import Call, Frame, Refused
from service.rpc.http.cuda_shm import CUDA_SHM_ROUTES, CudaShmRoutes
from service.rpc.http.endpoints import SLOT, Endpoints
from service.rpc.http.send import BufferAnswer, linger, send
from service.rpc.http.wire import (
    BodyTimeout,
    WireLog,
    deadline,
    error_response,
    page_files,
)

__all__ = ["HttpFront"]

_MODEL = r"/v2/models/(?P<model>[^/]+)(?:/versions/(?P<version>[^/]+))?"
Handler = Callable[[web.BaseRequest, dict[str, str], Call], Awaitable[web.StreamResponse]]


@dataclass(frozen=True)
class Route:
    """One endpoint: method, path pattern, the ``rpc`` metric label, and its body."""

    method: str
    pattern: re.Pattern[str]
    rpc: str
    handler: Handler

    @functools.cached_property
    def label(self) -> str:
        """The ``rpc`` metric label: ``http/<rpc>``."""
        return f"http/{self.rpc}"


class HttpFront:
    """The ``/v2`` REST endpoints and the page, on the engine every front holds."""

    def __init__(self, engine: Engine, frame: Frame, traces: tracing.Tracing | None = None,
                 ui: bool = True, max_inflight: int = 0,
                 budgets: StreamBudgets | None = None) -> None:
        self.engine = engine
        # The unsent-answer budget every gRPC stream shares (--max-unsent-bytes): a REST
        # answer's bytes count in it from before its output is allocated until sent.
        self.budgets = budgets if budgets is not None else StreamBudgets(0)
        # --max-concurrent-rpcs for HTTP: aiohttp has no core-level cap as gRPC has, so the
        # refusal happens here, before the body is read or anything is admitted (0 = none).
        # A request holds its slot until the last byte of its answer has left.
        self.slots = RestSlots(max_inflight, self.budgets)
        self.frame = frame
        self.tracing = traces
        self.ui = ui
        self.max_body = engine.limits.max_message_bytes
        # Registered in one table; _dispatch puts every route inside the frame.
        e = Endpoints(engine, self.slots, self.budgets, self.max_body)
        self.routes = [
            Route("GET", re.compile(r"/v2/health/live"), "ServerLive", e.server_live),
            Route("GET", re.compile(r"/v2/health/ready"), "ServerReady", e.server_ready),
            Route("GET", re.compile(r"/v2/?"), "ServerMetadata", e.server_metadata),
            Route("GET", re.compile(_MODEL), "ModelMetadata", e.model_metadata),
            Route("GET", re.compile(_MODEL + "/ready"), "ModelReady", e.model_ready),
            Route("POST", re.compile(_MODEL + "/infer"), "ModelInfer", e.infer),
            Route("POST", re.compile(_MODEL + "/tokenize"), "Tokenize", e.tokenize),
            Route("POST", re.compile(r"/v2/repository/index"), "RepositoryIndex",
                  e.repository_index)]
        cuda = CudaShmRoutes(engine, self.max_body)
        self.routes += [Route(method, re.compile(pattern), rpc, getattr(cuda, name))
                        for method, pattern, rpc, name in CUDA_SHM_ROUTES]
        self._page = page_files() if ui else {}
        self._server: web.Server | None = None
        self._listener: Any = None
        self.port = 0

    # -- lifecycle ------------------------------------------------------------------------

    async def start(self, host: str, port: int, ssl_context: ssl.SSLContext | None,
                    reuse_port: bool = False) -> int:
        """Listen on the running loop; returns the bound port (``port`` 0 picks one)."""
        # lingering_time=0: aiohttp would otherwise read and discard up to 10 s of a body
        # the answer did not need (after a 413, 401 or 429): the connection is closed.
        self._server = web.Server(self._dispatch, access_log=None, lingering_time=0,
                                  logger=WireLog(logging.getLogger("service.http"), {}))
        self._listener = await asyncio.get_running_loop().create_server(
            self._server, host, port, ssl=ssl_context, reuse_port=reuse_port or None)
        self.port = int(self._listener.sockets[0].getsockname()[1])
        return self.port

    async def stop(self, grace: float) -> None:
        """Stop accepting; in-flight requests get ``grace`` seconds to finish."""
        if self._listener is not None:
            self._listener.close()
        if self._server is not None:
            await self._server.shutdown(grace)
        if self._listener is not None:
            await self._listener.wait_closed()

    # -- dispatch: every /v2 route inside the frame ----------------------------------------

    async def _dispatch(self, request: web.BaseRequest) -> web.StreamResponse:
        slot: Slot | None = None
        response: web.StreamResponse | None = None
        try:
            response, slot = await self._answer(request)
            unread = not request.content.is_eof()
            if unread:
                # Answered before its body was read (refused on its size, credentials or
                # the in-flight cap): the rest is never read; closing makes it cost nothing.
                response.force_close()
            # Sent here, inside the request's in-flight slot: an answer its client does
            # not read keeps the slot (and its bytes) until its last byte has left.
            await send(request, response)
        finally:
            if slot is not None:
                slot.release()
            if isinstance(response, BufferAnswer):
                response.release()
        if unread:
            await linger(request)
        return response

    async def _answer(self, request: web.BaseRequest
                      ) -> tuple[web.StreamResponse, Slot | None]:
        """The response (not yet sent) and the in-flight slot it holds, if any."""
        start_ns = time.perf_counter_ns()
        path = request.path
        if not path.startswith("/v2"):
            return self._static(request), None
        route, params = self._match(request.method, path)
        if route is None:
            allowed = [r.method for r in self.routes if r.pattern.fullmatch(path)]
            if allowed:
                return error_response(405, f"{request.method} {path}: use "
                                           f"{', '.join(allowed)}",
                                      {"Allow": ", ".join(allowed)}), None
            return error_response(404, f"no endpoint {path}; see GET /v2 and "
                                       f"/v2/models/<model>"), None
        headers = request.headers
        call = Call(route.label, params.get("model") or "", headers.get("x-request-id", ""),
                    headers.get("Authorization", ""), None, start_ns)
        timeout = headers.get("grpc-timeout")

        async def body() -> web.StreamResponse:
            if timeout is not None:  # read inside the frame: a bad value is a refusal
                call.deadline = deadline(timeout)
            return await route.handler(request, params, call)

        slot = self.slots.take()
        if slot is None:
            return error_response(429, self.slots.full_message()), None
        request[SLOT] = slot  # infer gives it back while it waits for budget
        try:
            return await self._framed(route, call, body, request), slot
        except BaseException:
            slot.release()
            raise

    async def _framed(self, route: Route, call: Call,
                      body: Callable[[], Awaitable[web.StreamResponse]],
                      request: web.BaseRequest) -> web.StreamResponse:
        """The route's body inside the frame (and its trace span, when tracing is on); a
        refusal as JSON."""
        if self.tracing is None:
            try:
                return await self.frame.run(call, body)
            except Refused as r:
                return _refusal(r)
        attributes = {"http.request.method": request.method, "url.path": request.path,
                      "rpc.system": "http", "rpc.method": route.rpc}
        with tracing.server_span(self.tracing, f"{request.method} {route.pattern.pattern}",
                                 request.headers, attributes) as end_with:
            try:
                response = await self.frame.run(call, body)
            except Refused as r:
                end_with(r.code.value[0], f"{r.code.name}: {r.message}")
                return _refusal(r)
            end_with(grpc.StatusCode.OK.value[0], "")
            return response

    def _match(self, method: str, path: str) -> tuple[Route | None, dict[str, str]]:
        for route in self.routes:
            if route.method == method:
                m = route.pattern.fullmatch(path)
                if m is not None:
                    return route, {k: v for k, v in m.groupdict().items() if v is not None}
        return None, {}

    def _static(self, request: web.BaseRequest) -> web.StreamResponse:
        name = request.path.lstrip("/") or "index.html"
        if request.method != "GET" or name not in self._page:
            why = "the page is off (--no-ui, or auth is on without --ui)" if not self.ui else ""
            return error_response(404, f"no such path {request.path}{'; ' + why if why else ''}")
        data, content_type = self._page[name]
        return web.Response(body=data, content_type=content_type,
                            headers={"Cache-Control": "no-cache"})


def _refusal(r: Refused) -> web.StreamResponse:
    """A refused request's JSON answer, with its HTTP status."""
    status = http_status_for(r.code, r.__cause__)
    if isinstance(r.__cause__, BodyTimeout):
        response = error_response(408, r.message)
        response.force_close()  # what is left of the body is never read
        return response
    return error_response(status, r.message,
                          {"WWW-Authenticate": "Bearer"} if status == 401 else None)

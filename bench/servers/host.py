"""Hosting for the reference servers: gRPC (and REST beside it) in one process until SIGTERM,
with the service's libraries (grpc.aio and aiohttp's low-level server on one event loop),
its message-size limits and a health service: the harness runs every server the same way.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import signal
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import grpc
from aiohttp import web
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_health.v1.health import aio as health_aio

from bench.harness.launch import MAX_MESSAGE_BYTES
from genproto.embedding.v1 import embedding_pb2 as pb

__all__ = ["Captured", "CapturedCell", "HttpHandler", "reference_args", "reply_fields",
           "reply_handler", "respond", "serve_forever"]

HttpHandler = Callable[[web.BaseRequest], Awaitable[web.StreamResponse]]
_SLICE = 1 << 20  # a REST body's bytes handed to the transport at once, as the service's


def reply_fields(T: int) -> pb.EmbedResponse:
    """An EmbedResponse's fields besides the tensor, as the service fills them: a reference
    reply's size matches the service's to a few bytes."""
    return pb.EmbedResponse(token_ids=range(T), model="bench", version=1,
                            checkpoint_id="0" * 64,
                            timing=pb.Timing(queue_ns=1, tokenize_ns=1, compute_ns=1, total_ns=1))


def reply_handler(service: str, reply: Callable[[pb.EmbedRequest], bytes]
                  ) -> grpc.GenericRpcHandler:
    """``Embed`` and ``EmbedStream`` of ``service`` answering each request with
    ``reply(request)``: bytes gRPC sends as they are (no serializer)."""
    async def embed(request: pb.EmbedRequest, context: grpc.aio.ServicerContext) -> bytes:
        return reply(request)

    async def embed_stream(requests: AsyncIterator[pb.EmbedRequest],
                           context: grpc.aio.ServicerContext) -> AsyncIterator[bytes]:
        async for request in requests:
            yield reply(request)

    return grpc.method_handlers_generic_handler(service, {
        "Embed": grpc.unary_unary_rpc_method_handler(
            embed, request_deserializer=pb.EmbedRequest.FromString),
        "EmbedStream": grpc.stream_stream_rpc_method_handler(
            embed_stream, request_deserializer=pb.EmbedRequest.FromString),
    })


async def respond(request: web.BaseRequest, body: bytes,
                  headers: dict[str, str]) -> web.StreamResponse:
    """A reference server's REST answer, sent as the service sends one: a small body with
    its headers in one write; a large one in views of ``_SLICE`` bytes, the headers with
    the first (``web.Response`` would join the headers and the whole body into a new
    buffer, and the transport copy what the socket does not take at once: a reference
    paying those would bound nothing)."""
    if len(body) <= _SLICE:
        return web.Response(body=body, headers=headers)
    response = _Sliced(headers=headers)
    response.content_length = len(body)
    await response.prepare(request)
    view = memoryview(body)
    for at in range(0, len(view), _SLICE):
        await response.write(view[at:at + _SLICE])
    await response.write_eof()
    return response


class _Sliced(web.StreamResponse):
    _send_headers_immediately = False  # the headers leave with the first slice


@dataclass(frozen=True)
class CapturedCell:
    """The service's REST response to one cell's request, and what that request asked."""

    body: bytes
    headers: dict[str, str]
    ids: list[int]
    datatype: str  # FP32 | FP16 | BF16


class Captured:
    """The service's own REST responses, one per cell, captured by the harness once the
    service is up (``<name>.bin``, and ``<name>.json`` for the rest); read on first use."""

    def __init__(self, folder: Path) -> None:
        self.folder = folder
        self._cells: dict[str, CapturedCell] = {}

    def put(self, name: str, cell: CapturedCell) -> None:
        """Save ``cell`` as ``name`` (the harness's side)."""
        self.folder.mkdir(parents=True, exist_ok=True)
        (self.folder / f"{name}.bin").write_bytes(cell.body)
        (self.folder / f"{name}.json").write_text(json.dumps(
            {"headers": cell.headers, "ids": cell.ids, "datatype": cell.datatype}))

    def get(self, path: str) -> CapturedCell:
        cell = self._cells.get(path)
        if cell is None:
            name = self.folder / path.lstrip("/")
            rest = json.loads(name.with_suffix(".json").read_text())
            cell = self._cells[path] = CapturedCell(name.with_suffix(".bin").read_bytes(),
                                                    **rest)
        return cell


def reference_args(prog: str, argv: Sequence[str] | None) -> argparse.Namespace:
    """A reference server's flags: gRPC ``--port``, REST ``--http-port`` answering the
    cells ``--captured`` holds, and ``--checkpoint`` or ``--dim`` as the server needs."""
    p = argparse.ArgumentParser(prog=prog)
    p.add_argument("--port", type=int, required=True)
    p.add_argument("--http-port", type=int, default=-1)
    p.add_argument("--captured", type=Path, help="the service's REST responses, per cell")
    p.add_argument("--checkpoint", type=Path, help="a models/<model>/<version> folder")
    p.add_argument("--dim", type=int, help="C of the replies")
    return p.parse_args(argv)


def serve_forever(name: str, port: int, handlers: list[grpc.GenericRpcHandler],
                  http_port: int = -1, http: HttpHandler | None = None) -> None:
    """Serve ``handlers`` on 127.0.0.1:``port`` (and ``http`` on ``http_port``) until
    SIGTERM or SIGINT."""
    async def serve() -> None:
        # so_reuseport off (grpcio turns it on by default): a port another server holds is
        # refused here, not shared with it (two references answering one port's calls).
        server = grpc.aio.server(options=[("grpc.max_send_message_length", MAX_MESSAGE_BYTES),
                                          ("grpc.max_receive_message_length", MAX_MESSAGE_BYTES),
                                          ("grpc.so_reuseport", 0)])
        server.add_generic_rpc_handlers(handlers)
        health = health_aio.HealthServicer()
        health_pb2_grpc.add_HealthServicer_to_server(health, server)
        try:
            bound = server.add_insecure_port(f"127.0.0.1:{port}")
        except RuntimeError:  # grpcio's "Failed to bind", as a log line and a traceback
            bound = 0
        if bound != port:
            raise SystemExit(f"{name}: could not bind 127.0.0.1:{port}")
        await server.start()
        loop = asyncio.get_running_loop()
        if http is not None and http_port >= 0:
            await loop.create_server(web.Server(http, access_log=None), "127.0.0.1", http_port)
        await health.set("", health_pb2.HealthCheckResponse.SERVING)  # both ports listen
        print(f"{name}: serving on 127.0.0.1:{port} (REST :{http_port})", flush=True)
        stop = asyncio.Event()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, stop.set)
        await stop.wait()
        await server.stop(grace=0.5)

    asyncio.run(serve())

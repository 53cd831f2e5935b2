"""Run a reference gRPC server (ceiling or naive) in this process until SIGTERM.

Both reference servers use the same library and flavour as the service (grpc.aio, one
event loop), the same message-size limits, and a health service, so the harness waits for
all three the same way.
"""

from __future__ import annotations

import asyncio
import signal
from collections.abc import AsyncIterator, Callable

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_health.v1.health import aio as health_aio

from genproto.embedding.v1 import embedding_pb2 as pb

__all__ = ["MAX_MESSAGE_BYTES", "reply_handler", "serve_forever"]

# The service's default --max-message-bytes: a T=1024 fp32 reply (3 MiB) needs more than
# gRPC's 4 MiB default once framing is counted only in the naive case, but keep them equal.
MAX_MESSAGE_BYTES = 64 << 20


def reply_handler(service: str, reply: Callable[[pb.EmbedRequest], bytes]
                  ) -> grpc.GenericRpcHandler:
    """Embed and EmbedStream of ``service``, answering each request with ``reply(request)``.

    No response serializer: gRPC sends the returned bytes as they are.
    """
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


async def _serve(port: int, handlers: list[grpc.GenericRpcHandler], name: str) -> None:
    server = grpc.aio.server(options=[
        ("grpc.max_send_message_length", MAX_MESSAGE_BYTES),
        ("grpc.max_receive_message_length", MAX_MESSAGE_BYTES),
    ])
    server.add_generic_rpc_handlers(handlers)
    health = health_aio.HealthServicer()
    health_pb2_grpc.add_HealthServicer_to_server(health, server)
    if server.add_insecure_port(f"127.0.0.1:{port}") != port:
        raise SystemExit(f"{name}: could not bind 127.0.0.1:{port}")
    await server.start()
    await health.set("", health_pb2.HealthCheckResponse.SERVING)
    print(f"{name}: serving on 127.0.0.1:{port}", flush=True)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    await stop.wait()
    await server.stop(grace=0.5)


def serve_forever(port: int, handlers: list[grpc.GenericRpcHandler], name: str) -> None:
    """Serve ``handlers`` on 127.0.0.1:``port`` until SIGTERM or SIGINT."""
    asyncio.run(_serve(port, handlers, name))

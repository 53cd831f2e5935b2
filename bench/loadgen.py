"""Load generator: N requests in flight against one server, every reply decoded to numpy.

One grpc.aio client in the harness process. Unary: N coroutines, each one call at a time.
Stream: one EmbedStream with a window of N requests written ahead of their replies
(replies come back in request order, so a FIFO of send times gives each latency).
Only replies that arrive inside the measurement window count; the warm-up before it lets
HTTP/2 flow control and the servers' allocators settle.
"""

from __future__ import annotations

import asyncio
import collections
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import grpc
import numpy as np

from bench.backend_host import MAX_MESSAGE_BYTES
from bench.fronts import run_oip, run_shm
from bench.naive_proto import EMBED_METHOD as NAIVE_EMBED
from bench.naive_proto import STREAM_METHOD as NAIVE_STREAM
from bench.naive_proto import NaiveResponse
from bench.window import Measurement, Window
from genproto.embedding.v1 import embedding_pb2 as pb

__all__ = ["DTYPE_ENUM", "Protocol", "measure", "protocol_for"]

DTYPE_ENUM = {"float32": pb.DTYPE_FLOAT32, "float16": pb.DTYPE_FLOAT16,
              "bfloat16": pb.DTYPE_BFLOAT16}
# numpy has no bfloat16: its bits are decoded as uint16 (zero-copy, like the others).
_ITEMSIZE = {pb.DTYPE_FLOAT32: 4, pb.DTYPE_FLOAT16: 2, pb.DTYPE_BFLOAT16: 2}
_NP_DTYPE = {pb.DTYPE_FLOAT32: np.float32, pb.DTYPE_FLOAT16: np.float16,
             pb.DTYPE_BFLOAT16: np.uint16}


@dataclass(frozen=True)
class Protocol:
    """How to call one backend: method paths, reply parser and reply decoder."""

    unary: str
    stream: str
    parse: Callable[[bytes], Any]
    decode: Callable[[Any], np.ndarray]


def _decode_tensor(resp: pb.EmbedResponse) -> np.ndarray:
    t = resp.embeddings
    return np.frombuffer(t.data, dtype=_NP_DTYPE[t.dtype]).reshape(tuple(t.shape))


def _decode_naive(resp: Any) -> np.ndarray:
    # What a client of `repeated float` does: one Python float per element into numpy.
    return np.array(resp.values, dtype=np.float32).reshape(tuple(resp.shape))


def protocol_for(backend: str) -> Protocol:
    """The ceiling and the service speak embedding.v1; the naive baseline its own reply."""
    if backend == "naive":
        return Protocol(NAIVE_EMBED, NAIVE_STREAM, NaiveResponse.FromString, _decode_naive)
    return Protocol("/embedding.v1.EmbeddingService/Embed",
                    "/embedding.v1.EmbeddingService/EmbedStream",
                    pb.EmbedResponse.FromString, _decode_tensor)


async def _unary(channel: grpc.aio.Channel, proto: Protocol, requests: list[pb.EmbedRequest],
                 concurrency: int, window: Window) -> None:
    call = channel.unary_unary(proto.unary, request_serializer=pb.EmbedRequest.SerializeToString,
                               response_deserializer=proto.parse)

    async def worker(offset: int) -> None:
        i = offset
        while (sent := time.perf_counter_ns()) < window.end:
            resp = await call(requests[i % len(requests)])
            window.done(sent, proto.decode(resp))
            i += 1

    async with asyncio.TaskGroup() as tg:  # one failed call cancels the others
        for k in range(concurrency):
            tg.create_task(worker(k))


async def _stream(channel: grpc.aio.Channel, proto: Protocol, requests: list[pb.EmbedRequest],
                  concurrency: int, window: Window) -> None:
    call = channel.stream_stream(proto.stream,
                                 request_serializer=pb.EmbedRequest.SerializeToString,
                                 response_deserializer=proto.parse)()
    slots = asyncio.Semaphore(concurrency)
    sent: collections.deque[int] = collections.deque()

    async def writer() -> None:
        i = 0
        while True:
            await slots.acquire()
            if (now := time.perf_counter_ns()) >= window.end:
                break
            sent.append(now)
            await call.write(requests[i % len(requests)])
            i += 1
        await call.done_writing()

    async def reader() -> None:
        async for resp in call:
            window.done(sent.popleft(), proto.decode(resp))
            slots.release()

    async with asyncio.TaskGroup() as tg:
        tg.create_task(writer())
        tg.create_task(reader())


async def measure(target: str, backend: str, mode: str, requests: list[pb.EmbedRequest],
                  concurrency: int, shape: tuple[int, int], warmup_s: float,
                  duration_s: float) -> Measurement:
    """Drive ``target`` for warmup_s + duration_s; count the replies of the last duration_s."""
    proto = protocol_for(backend)
    options = [("grpc.max_receive_message_length", MAX_MESSAGE_BYTES),
               ("grpc.max_send_message_length", MAX_MESSAGE_BYTES)]
    async with grpc.aio.insecure_channel(target, options=options) as channel:
        await asyncio.wait_for(channel.channel_ready(), timeout=30)
        start = time.perf_counter_ns() + int(warmup_s * 1e9)
        window = Window(start, start + int(duration_s * 1e9), shape)
        if mode == "oip":
            await run_oip(channel, requests, concurrency, window)
        elif mode == "shm":
            await run_shm(channel, requests, concurrency, window,
                          shape[1] * _ITEMSIZE[requests[0].dtype])
        else:
            run = _unary if mode == "unary" else _stream
            await run(channel, proto, requests, concurrency, window)
    return window.result()

"""Load generation (docs/performance.md, "What is measured"): N requests in flight against
one server in a mode (gRPC ``unary``, ``stream``, ``oip``, ``shm``; REST), every reply
checked, counted in a measurement window after a warm-up, with the server's CPU over it.
"""

from __future__ import annotations

import asyncio
import collections
import math
import time
from collections.abc import Awaitable, Callable, Coroutine, Sequence
from dataclasses import dataclass
from typing import Any

import grpc
import numpy as np

from bench.harness.launch import MAX_MESSAGE_BYTES, cpu_seconds
from bench.servers.naive import SERVICE_NAME, NaiveResponse, decode_naive
from client.shm import SharedMemoryRegion, rows_from_region
from genproto.embedding.v1 import embedding_pb2 as pb
from genproto.inference.v2 import grpc_service_pb2 as oip

__all__ = ["DTYPE_ENUM", "WIRE_NAMES", "Measurement", "Window", "grpc_load", "http_load",
           "measure", "percentile", "rpc"]

DTYPE_ENUM = {"float32": pb.DTYPE_FLOAT32, "float16": pb.DTYPE_FLOAT16,
              "bfloat16": pb.DTYPE_BFLOAT16}
# numpy has no bfloat16: its bits are decoded as uint16 (zero-copy, like the others).
_NP = {pb.DTYPE_FLOAT32: np.float32, pb.DTYPE_FLOAT16: np.float16, pb.DTYPE_BFLOAT16: np.uint16}
# The wire dtypes' names in the Open Inference Protocol (gRPC and REST).
WIRE_NAMES: dict[int, str] = {pb.DTYPE_FLOAT32: "FP32", pb.DTYPE_FLOAT16: "FP16",
                              pb.DTYPE_BFLOAT16: "BF16"}
_OIP_NP = {"FP32": np.float32, "FP16": np.float16, "BF16": np.uint16}
_EMBED = "/embedding.v1.EmbeddingService/"


def percentile(values: Sequence[float], q: float) -> float:
    """Nearest-rank percentile of unsorted ``values`` (nan when empty)."""
    s = sorted(values)
    return s[min(len(s) - 1, max(0, round(q * (len(s) - 1))))] if s else float("nan")


def rpc(channel: grpc.aio.Channel, method: str, request: Any, response: Any,
        stream: bool = False, prefix: str = _EMBED) -> Any:
    make = channel.stream_stream if stream else channel.unary_unary
    return make(prefix + method, request_serializer=request.SerializeToString,
                response_deserializer=response.FromString)


@dataclass(frozen=True)
class Measurement:
    """Replies completed in a window of ``seconds``, each one's latency, the server's
    CPU seconds over the window (nan when not watched), and the refusals retried in it."""

    requests: int
    seconds: float
    latencies_ns: tuple[int, ...]
    cpu_s: float = math.nan
    refused: int = 0


class Window:
    """Counts replies completed between ``warmup_s`` and ``warmup_s + duration_s`` from now."""

    def __init__(self, warmup_s: float, duration_s: float) -> None:
        self.start = time.perf_counter_ns() + int(warmup_s * 1e9)
        self.end = self.start + int(duration_s * 1e9)
        self.latencies: list[int] = []
        self.cpu_s = math.nan
        self.refused = 0  # "retry later" answers (HTTP 429), retried

    def done(self, sent: int) -> None:
        """A checked reply to a request sent at ``sent`` (perf_counter_ns)."""
        now = time.perf_counter_ns()
        if self.start <= now < self.end:
            self.latencies.append(now - sent)

    async def watch_cpu(self, pid: int) -> None:
        await asyncio.sleep(max(0.0, (self.start - time.perf_counter_ns()) / 1e9))
        before = cpu_seconds(pid)
        await asyncio.sleep(max(0.0, (self.end - time.perf_counter_ns()) / 1e9))
        self.cpu_s = cpu_seconds(pid) - before


async def measure(run: Callable[[Window], Coroutine[Any, Any, None]], warmup_s: float,
                  duration_s: float, pid: int | None = None) -> Measurement:
    """``run`` against a fresh window (and ``pid``'s CPU over it); the replies it counted."""
    window = Window(warmup_s, duration_s)
    async with asyncio.TaskGroup() as tg:  # one failed call cancels the others
        tg.create_task(run(window))
        if pid is not None:
            tg.create_task(window.watch_cpu(pid))
    return Measurement(len(window.latencies), duration_s, tuple(window.latencies),
                       window.cpu_s, window.refused)


async def _closed_loops(window: Window, concurrency: int,
                        one: Callable[[int, int], Awaitable[None]]) -> None:
    """``concurrency`` coroutines, coroutine k calling ``one(k, i)`` back to back until the
    end, i = k, k+1, ...: each one cycles through every request, from its own offset."""
    async def loop(k: int) -> None:
        i = k
        while (sent := time.perf_counter_ns()) < window.end:
            await one(k, i)
            window.done(sent)
            i += 1

    async with asyncio.TaskGroup() as tg:
        for k in range(concurrency):
            tg.create_task(loop(k))


def _check(array: np.ndarray, shape: tuple[int, int]) -> None:
    if array.shape != shape:
        raise AssertionError(f"reply shape {array.shape}, expected {shape}")


def _tensor(resp: pb.EmbedResponse) -> np.ndarray:
    t = resp.embeddings
    return np.frombuffer(t.data, dtype=_NP[t.dtype]).reshape(tuple(t.shape))


def _oip_request(request: pb.EmbedRequest) -> oip.ModelInferRequest:
    # The ModelInfer equivalent of an ids-only Embed request: input_ids INT64 [1, T].
    ids = np.asarray(request.token_ids.ids, dtype="<i8")
    tensor = oip.ModelInferRequest.InferInputTensor(name="input_ids", datatype="INT64",
                                                    shape=[1, len(ids)])
    out = oip.ModelInferRequest(
        model_name=request.model, inputs=[tensor], raw_input_contents=[ids.tobytes()],
        outputs=[oip.ModelInferRequest.InferRequestedOutputTensor(name="embeddings")])
    out.parameters["datatype"].string_param = WIRE_NAMES[request.dtype]
    return out


def _oip_rows(resp: oip.ModelInferResponse) -> np.ndarray:
    out = resp.outputs[0]
    data = np.frombuffer(resp.raw_output_contents[0], dtype=_OIP_NP[out.datatype])
    return data.reshape(tuple(out.shape)[1:])  # (T, C) of the [1, T, C] output


async def _stream(call: Any, decode: Callable[[Any], np.ndarray],
                  requests: list[pb.EmbedRequest], concurrency: int, shape: tuple[int, int],
                  window: Window) -> None:
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
            _check(decode(resp), shape)
            window.done(sent.popleft())
            slots.release()

    async with asyncio.TaskGroup() as tg:
        tg.create_task(writer())
        tg.create_task(reader())


async def _shm(channel: grpc.aio.Channel, requests: list[pb.EmbedRequest], concurrency: int,
               shape: tuple[int, int], window: Window) -> None:
    embed = rpc(channel, "Embed", pb.EmbedRequest, pb.EmbedResponse)
    register = rpc(channel, "RegisterSharedMemory", pb.RegisterSharedMemoryRequest,
                   pb.RegisterSharedMemoryResponse)
    unregister = rpc(channel, "UnregisterSharedMemory", pb.UnregisterSharedMemoryRequest,
                     pb.UnregisterSharedMemoryResponse)
    size = shape[0] * shape[1] * np.dtype(_NP[requests[0].dtype]).itemsize
    regions = [SharedMemoryRegion(f"bench{k}", size) for k in range(concurrency)]
    mine = []  # mine[k][j]: request j naming slot k's region as its output
    for region in regions:
        mine.append([pb.EmbedRequest() for _ in requests])
        for m, r in zip(mine[-1], requests):
            m.CopyFrom(r)
            m.output.region = region.name

    async def one(k: int, i: int) -> None:
        resp = await embed(mine[k][i % len(requests)])
        rows = rows_from_region(regions[k], resp.embeddings, resp.output, raw_bfloat16=True)
        _check(rows, shape)  # (T, C) view of the region, no copy
        del rows

    try:
        for region in regions:
            await register(pb.RegisterSharedMemoryRequest(region=region.region_message()))
        await _closed_loops(window, concurrency, one)
    finally:
        await unregister(pb.UnregisterSharedMemoryRequest(name=""))
        for region in regions:
            region.close()


async def grpc_load(window: Window, target: str, mode: str, requests: list[pb.EmbedRequest],
                    concurrency: int, shape: tuple[int, int], naive: bool = False) -> None:
    """Drive ``target`` in ``mode`` (unary, stream, oip, shm) until the window ends; the
    naive baseline answers ``unary`` and ``stream`` with its own reply message."""
    options = [("grpc.max_receive_message_length", MAX_MESSAGE_BYTES),
               ("grpc.max_send_message_length", MAX_MESSAGE_BYTES)]
    async with grpc.aio.insecure_channel(target, options=options) as channel:
        await asyncio.wait_for(channel.channel_ready(), timeout=30)
        if mode == "shm":
            await _shm(channel, requests, concurrency, shape, window)
            return
        reply: Any = pb.EmbedResponse
        decode: Callable[[Any], np.ndarray] = _tensor
        prefix = _EMBED
        if naive:
            prefix, reply, decode = f"/{SERVICE_NAME}/", NaiveResponse, decode_naive
        if mode == "stream":
            call = rpc(channel, "EmbedStream", pb.EmbedRequest, reply, True, prefix)()
            await _stream(call, decode, requests, concurrency, shape, window)
            return
        calls: list[Any] = list(requests)
        if mode == "oip":
            calls, decode = [_oip_request(r) for r in requests], _oip_rows
            unary = rpc(channel, "ModelInfer", oip.ModelInferRequest, oip.ModelInferResponse,
                        prefix="/inference.GRPCInferenceService/")
        else:
            unary = rpc(channel, "Embed", pb.EmbedRequest, reply, prefix=prefix)

        async def one(k: int, i: int) -> None:
            _check(decode(await unary(calls[i % len(calls)])), shape)

        await _closed_loops(window, concurrency, one)


async def http_load(window: Window, url: str, body: bytes, concurrency: int,
                    min_bytes: int) -> None:
    """``concurrency`` keep-alive clients POSTing ``body`` to ``url``; each answer must be
    200 with at least ``min_bytes`` bytes. A 429 ("retry later": the answers in flight
    hold the server's unsent-answer budget) is retried, as a client would, and counted;
    the reply's latency runs from the first try."""
    import aiohttp  # the REST client: only the REST cells need it

    connector = aiohttp.TCPConnector(limit=concurrency)
    async with aiohttp.ClientSession(connector=connector) as session:
        async def one(k: int, i: int) -> None:
            while True:
                async with session.post(url, data=body) as response:
                    data = await response.read()
                if response.status != 429:
                    break
                window.refused += 1
                await asyncio.sleep(0.01)
            if response.status != 200 or len(data) < min_bytes:
                raise RuntimeError(f"{url}: HTTP {response.status}, {len(data)} bytes: "
                                   f"{data[:300]!r}")

        await _closed_loops(window, concurrency, one)

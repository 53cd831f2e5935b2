"""Slow readers: clients that open EmbedStreams, send, and never read their answers.

One phase of ``bench.overload`` (its "slow-reader" row), on the same server: ``streams``
streams each write ``per_stream`` requests of T tokens and never read, while ``concurrency``
ordinary clients run closed-loop unary Embeds beside them. Sampled every 50 ms: the
server's RSS (``/proc/<pid>/status``). Reported: RSS before and at its peak, so the growth
the slow readers caused, against what the stream budget allows (streams x
``--max-stream-buffer-bytes``, plus what the transport buffers), and the ordinary clients'
p50/p99 and rate while it happens (and any status but OK they got).

Without a budget each stream held up to its window of 64 finished answers (64 x 1 MiB at
T=1024, C=256): 4 such clients held ~256 MiB.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from pathlib import Path
from typing import Any

import grpc
import grpc.aio

from bench.window import percentile
from genproto.embedding.v1 import embedding_pb2 as pb
from genproto.embedding.v1 import embedding_pb2_grpc as pb_grpc

__all__ = ["format_row", "rss_mib", "run_slow_readers"]


def rss_mib(pid: int) -> float:
    """Resident set size of process ``pid`` in MiB (Linux)."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return float("nan")


async def peak_rss_mib(pid: int, end: float, start: float) -> float:
    """The highest RSS of ``pid`` sampled every 50 ms until ``end`` (perf_counter), from
    ``start``."""
    peak = start
    while time.perf_counter() < end:
        peak = max(peak, rss_mib(pid))
        await asyncio.sleep(0.05)
    return peak


async def _slow_stream(stub: pb_grpc.EmbeddingServiceStub, request: pb.EmbedRequest,
                       count: int) -> None:
    """Write ``count`` requests on one stream and never read an answer."""
    call = stub.EmbedStream()
    try:
        for _ in range(count):
            await call.write(request)  # blocks once the server stops reading: fine
        await asyncio.Event().wait()  # hold the stream open, unread, until cancelled
    finally:
        call.cancel()


async def run_slow_readers(target: str, pid: int, request: pb.EmbedRequest,
                           normal: list[pb.EmbedRequest], streams: int = 4,
                           per_stream: int = 200, concurrency: int = 4,
                           seconds: float = 4.0) -> dict[str, Any]:
    """The phase: slow streams plus ordinary clients for ``seconds``; figures as a dict."""
    rss_before = rss_mib(pid)
    latencies: list[float] = []
    other: dict[str, int] = {}
    async with grpc.aio.insecure_channel(target) as slow_channel, \
            grpc.aio.insecure_channel(target) as channel:
        await asyncio.wait_for(channel.channel_ready(), timeout=30)
        slow_stub = pb_grpc.EmbeddingServiceStub(slow_channel)
        slow = [asyncio.ensure_future(_slow_stream(slow_stub, request, per_stream))
                for _ in range(streams)]
        embed = pb_grpc.EmbeddingServiceStub(channel).Embed
        end = time.perf_counter() + seconds

        async def loop(k: int) -> None:
            i = k
            while (sent := time.perf_counter()) < end:
                try:
                    await embed(normal[i % len(normal)], timeout=30)
                    latencies.append((time.perf_counter() - sent) * 1e3)
                except grpc.RpcError as e:
                    other[e.code().name] = other.get(e.code().name, 0) + 1
                i += 1

        sampler = asyncio.ensure_future(peak_rss_mib(pid, end, rss_before))
        await asyncio.gather(*(loop(k) for k in range(concurrency)))
        peak = await sampler
        for task in slow:
            task.cancel()
        for task in slow:
            with contextlib.suppress(asyncio.CancelledError, grpc.RpcError):
                await task
    return {"streams": streams, "per_stream": per_stream, "seconds": seconds,
            "rss_before_mib": rss_before, "rss_peak_mib": peak,
            "rss_growth_mib": peak - rss_before, "normal_concurrency": concurrency,
            "normal_requests": len(latencies), "normal_req_s": len(latencies) / seconds,
            "normal_p50_ms": percentile(latencies, 0.5),
            "normal_p99_ms": percentile(latencies, 0.99), "normal_other_codes": other}


def format_row(phase: dict[str, Any], answer_mib: float) -> str:
    """One line: the slow readers, what they made the server hold, and the others' latency."""
    return (f"slow readers: {phase['streams']} streams x {phase['per_stream']} requests "
            f"({answer_mib:.2f} MiB answers), never read: server RSS {phase['rss_before_mib']:.0f}"
            f" -> peak {phase['rss_peak_mib']:.0f} MiB (+{phase['rss_growth_mib']:.0f}); "
            f"{phase['normal_concurrency']} ordinary clients beside them: p50 "
            f"{phase['normal_p50_ms']:.2f} ms, p99 {phase['normal_p99_ms']:.2f} ms, "
            f"{phase['normal_req_s']:.0f} req/s"
            + (f", other codes {phase['normal_other_codes']}" if phase["normal_other_codes"]
               else ""))

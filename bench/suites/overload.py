"""The overload suite: past its queue budget, the service must refuse fast.

One service with a small ``--max-queue-tokens``: a baseline (one request in flight), then
phases with more requests in flight than the budget admits, then health checks at each
concurrency (an RPC with no work behind it: the floor of this client and machine). Per
phase: accepted p50/p99 beside the baseline's, the share refused, and the refusals' p50/p99
(RESOURCE_EXHAUSTED, from call to status) against the target; warm-ups not counted.
"""

from __future__ import annotations

import asyncio
import random
import time
from typing import Any

import grpc
import grpc.aio
from grpc_health.v1 import health_pb2, health_pb2_grpc

from bench.harness.checkpoint import VOCAB_SIZE, Shape, ensure_model
from bench.harness.config import BenchConfig
from bench.harness.launch import launch_service, start, stop
from bench.harness.load import percentile
from bench.harness.report import SuiteResult, Target
from genproto.embedding.v1 import embedding_pb2 as pb
from genproto.embedding.v1 import embedding_pb2_grpc as pb_grpc

__all__ = ["REJECT_P99_MS", "run"]

REJECT_P99_MS = 5.0
QUEUE_TOKENS, T = 1024, 512  # two requests fit the budget
_OK, _FULL = grpc.StatusCode.OK, grpc.StatusCode.RESOURCE_EXHAUSTED


async def _phase(target: str, requests: list[pb.EmbedRequest] | None, concurrency: int,
                 warmup: float, seconds: float) -> dict[str, Any]:
    """``concurrency`` closed loops for warmup + seconds; latencies (ms) by outcome.
    ``requests`` None: health checks instead of Embed."""
    ok: list[float] = []
    full: list[float] = []
    other: dict[str, int] = {}
    async with grpc.aio.insecure_channel(target) as channel:
        await asyncio.wait_for(channel.channel_ready(), timeout=30)
        embed = pb_grpc.EmbeddingServiceStub(channel).Embed
        check = health_pb2_grpc.HealthStub(channel).Check
        start = time.perf_counter() + warmup
        end = start + seconds

        async def loop(i: int) -> None:
            while (sent := time.perf_counter()) < end:
                try:
                    if requests is None:
                        await check(health_pb2.HealthCheckRequest(), timeout=30)
                    else:
                        await embed(requests[i % len(requests)], timeout=30)
                    code = _OK
                except grpc.RpcError as e:
                    code = e.code()
                done = time.perf_counter()
                i += 1
                if sent < start:
                    continue  # warm-up
                if code == _OK:
                    ok.append((done - sent) * 1e3)
                elif code == _FULL:
                    full.append((done - sent) * 1e3)
                else:
                    other[code.name] = other.get(code.name, 0) + 1

        await asyncio.gather(*(loop(k) for k in range(concurrency)))
    return {"concurrency": concurrency, "requests": len(ok) + len(full) + sum(other.values()),
            "accepted": len(ok), "rejected": len(full), "other_codes": other,
            "accepted_req_s": len(ok) / seconds,
            "accepted_p50_ms": percentile(ok, 0.5), "accepted_p99_ms": percentile(ok, 0.99),
            "rejected_p50_ms": percentile(full, 0.5), "rejected_p99_ms": percentile(full, 0.99)}


def _table(baseline: dict[str, Any], phases: list[dict[str, Any]]) -> str:
    head = (f"{'queue':>6} {'T':>5} {'c':>4} {'base p50':>9} {'base p99':>9} {'acc p50':>8} "
            f"{'acc p99':>8} {'acc/s':>7} {'refused':>8} {'rej p50':>8} {'rej p99':>8} "
            f"{'floor p99':>9}")
    lines = [head, "-" * len(head)]
    for o in phases:
        share = o["rejected"] / o["requests"] if o["requests"] else 0.0
        lines.append(
            f"{QUEUE_TOKENS:>6} {T:>5} {o['concurrency']:>4} {baseline['accepted_p50_ms']:>9.2f} "
            f"{baseline['accepted_p99_ms']:>9.2f} {o['accepted_p50_ms']:>8.2f} "
            f"{o['accepted_p99_ms']:>8.2f} {o['accepted_req_s']:>7.0f} {share:>8.0%} "
            f"{o['rejected_p50_ms']:>8.2f} {o['rejected_p99_ms']:>8.2f} {o['floor_p99_ms']:>9.2f}"
            + (f"  other codes {o['other_codes']}" if o["other_codes"] else ""))
    lines.append("(ms; baseline: one request in flight; floor: health checks at the same c, "
                 "no work behind them)")
    return "\n".join(lines)


def run(cfg: BenchConfig, log: Any = print) -> SuiteResult:
    dim, seconds, warmup, levels = 256, 4.0, 0.5, [4, 16, 64]
    extra = ["--max-queue-tokens", str(QUEUE_TOKENS), "--max-batch-tokens", str(QUEUE_TOKENS)]
    if cfg.quick:  # at C=16 a lookup takes microseconds: a batch delay keeps each request
        # queued for 50 ms, so 16 in flight overflow the budget whatever the machine's speed
        dim, seconds, warmup, levels = 16, 0.5, 0.1, [4, 16]
        extra.append("--max-batch-delay-us=50000")
    repo = ensure_model(cfg.out / ".model-overload", Shape(VOCAB_SIZE, dim, 1024))
    rng = random.Random(0)
    requests = [pb.EmbedRequest(token_ids=pb.TokenIds(
        ids=[rng.randrange(VOCAB_SIZE) for _ in range(T)])) for _ in range(8)]
    server = start([launch_service("service-overload", repo, cfg.out / "logs", *extra)]
                   )["service-overload"]
    try:
        baseline = asyncio.run(_phase(server.target, requests, 1, warmup, seconds))
        phases = [asyncio.run(_phase(server.target, requests, c, warmup, seconds))
                  for c in levels]
        for phase in phases:  # the same concurrency with nothing to do
            floor = asyncio.run(_phase(server.target, None, phase["concurrency"], warmup,
                                       seconds / 2))
            phase["floor_p50_ms"] = floor["accepted_p50_ms"]
            phase["floor_p99_ms"] = floor["accepted_p99_ms"]
    finally:
        stop([server])
    log(f"overload: {len(phases)} phases done")
    report = {"max_queue_tokens": QUEUE_TOKENS, "T": T, "C": dim, "seconds": seconds,
              "baseline": baseline, "overload": phases}
    targets = [Target(f"overload c={o['concurrency']}: refusal p99 ms", o["rejected_p99_ms"],
                      "<=", REJECT_P99_MS) for o in phases]
    return SuiteResult("overload", report, _table(baseline, phases), targets)

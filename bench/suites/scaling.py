"""The scaling suite: two ways past one process's per-message cost. Packed: 64 sequences of
T=16 per round as one ``EmbedBatch``, 64 concurrent unary ``Embed`` calls and 64 messages on
one ``EmbedStream``. Workers: ``--workers 1`` against ``--workers 2`` (one port,
SO_REUSEPORT), unary fp32 c=16 at the largest and smallest T; the load generator shares the
cores, so this is what a second process buys on a full box. Rounds interleaved.
"""

from __future__ import annotations

import asyncio
import functools
import random
import statistics
import time
from collections.abc import Awaitable, Callable
from typing import Any

import grpc

from bench.harness.checkpoint import MODEL_NAME, VOCAB_SIZE, Shape, ensure_model
from bench.harness.config import BenchConfig
from bench.harness.launch import launch_service, start, stop
from bench.harness.load import grpc_load, measure, rpc
from bench.harness.report import SuiteResult, Target, paired
from genproto.embedding.v1 import embedding_pb2 as pb

__all__ = ["packed_round", "run", "stream_round", "unary_round"]

B, T = 64, 16
Round = Callable[[grpc.aio.Channel, list[list[int]], str], Awaitable[int]]


def _embed(model: str, seq: list[int]) -> pb.EmbedRequest:
    return pb.EmbedRequest(model=model, token_ids=pb.TokenIds(ids=seq))


async def packed_round(channel: grpc.aio.Channel, seqs: list[list[int]],
                       model: str = MODEL_NAME) -> int:
    """One EmbedBatch of every sequence; returns the rows received."""
    call = rpc(channel, "EmbedBatch", pb.EmbedBatchRequest, pb.EmbedBatchResponse)
    resp = await call(pb.EmbedBatchRequest(model=model, inputs=[
        pb.EmbedInput(token_ids=pb.TokenIds(ids=s)) for s in seqs]))
    return int(resp.embeddings.shape[0])


async def unary_round(channel: grpc.aio.Channel, seqs: list[list[int]],
                      model: str = MODEL_NAME) -> int:
    """Every sequence as its own Embed, all in flight at once."""
    call = rpc(channel, "Embed", pb.EmbedRequest, pb.EmbedResponse)
    resps = await asyncio.gather(*(call(_embed(model, s)) for s in seqs))
    return sum(int(r.embeddings.shape[0]) for r in resps)


async def stream_round(channel: grpc.aio.Channel, seqs: list[list[int]],
                       model: str = MODEL_NAME) -> int:
    """Every sequence as one message of a single EmbedStream."""
    call = rpc(channel, "EmbedStream", pb.EmbedRequest, pb.EmbedResponse, stream=True)
    return sum([int(r.embeddings.shape[0]) async for r in call(
        iter([_embed(model, s) for s in seqs]))])


async def _tokens_per_s(target: str, how: Round, seqs: list[list[int]], seconds: float) -> float:
    async with grpc.aio.insecure_channel(target) as channel:
        await how(channel, seqs, MODEL_NAME)  # warm-up
        rows, t0 = 0, time.perf_counter()
        while time.perf_counter() - t0 < seconds:
            rows += await how(channel, seqs, MODEL_NAME)
        return rows / (time.perf_counter() - t0)


def run(cfg: BenchConfig, log: Any = print) -> SuiteResult:
    repo = ensure_model(cfg.model_cache, Shape(VOCAB_SIZE, cfg.dim, cfg.max_seq_len))
    rng = random.Random(0)
    seqs = [[rng.randrange(VOCAB_SIZE) for _ in range(T)] for _ in range(B)]
    ts = sorted({max(cfg.ts), min(cfg.ts)}, reverse=True)
    requests = {t: [_embed(MODEL_NAME, [rng.randrange(VOCAB_SIZE) for _ in range(t)])
                    for _ in range(8)] for t in ts}
    servers = start(launch_service(f"service-w{w}", repo, cfg.out / "logs", "--workers", str(w),
                                   device=cfg.device) for w in (1, 2))
    rounds: dict[str, Round] = {"batch": packed_round, "unary": unary_round,
                                "stream": stream_round}
    packed: dict[str, list[float]] = {name: [] for name in rounds}
    workers: dict[tuple[int, int], list[float]] = {(w, t): [] for w in (1, 2) for t in ts}
    try:
        for rep in range(cfg.reps):
            for name, how in rounds.items():
                packed[name].append(asyncio.run(_tokens_per_s(
                    servers["service-w1"].target, how, seqs, cfg.duration_s)))
            for (w, t), series in workers.items():
                load = functools.partial(grpc_load, target=servers[f"service-w{w}"].target,
                                         mode="unary", requests=requests[t], concurrency=16,
                                         shape=(t, cfg.dim))
                m = asyncio.run(measure(load, cfg.warmup_s, cfg.duration_s))
                series.append(m.requests / m.seconds * t)
            log(f"scaling: round {rep + 1}/{cfg.reps} done")
    finally:
        stop(servers.values())
    med = {k: statistics.median(v) for k, v in packed.items()}
    report: dict[str, Any] = {"B": B, "T": T, "packed_tokens_s": med,
              "stream_over_unary": paired([packed["stream"]], [packed["unary"]]),
              "workers_tokens_s": {f"w{w}/T{t}": statistics.median(v)
                                   for (w, t), v in workers.items()},
              "workers2_over_1": {t: paired([workers[(2, t)]], [workers[(1, t)]]) for t in ts}}
    lines = [f"packed, {B} x T={T} per round (tokens/s): EmbedBatch {med['batch']:.0f}   "
             f"64 unary {med['unary']:.0f}   64-message stream {med['stream']:.0f}   "
             f"(stream / unary {report['stream_over_unary']:.2f})",
             "workers (unary fp32 c=16, tokens/s; the load generator shares the cores):"]
    lines += [f"  T={t:<5} --workers 1 {report['workers_tokens_s'][f'w1/T{t}']:.0f}   "
              f"--workers 2 {report['workers_tokens_s'][f'w2/T{t}']:.0f}   "
              f"x{report['workers2_over_1'][t]:.2f}" for t in ts]
    batch = Target(f"{B} x T={T}: EmbedBatch / unary throughput",
                   paired([packed["batch"]], [packed["unary"]]), ">=", 5.0)
    return SuiteResult("scaling", report, "\n".join(lines), [batch])

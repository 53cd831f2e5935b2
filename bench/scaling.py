"""Packed batches and ``--workers``: two ways past one process's per-message cost.

    python -m bench.scaling [--reps 3] [--duration 2]

1. Packed: 64 sequences of T=16 per round, sent three ways to one service: one
   ``EmbedBatch`` (one message, one [1024, C] tensor), 64 concurrent unary ``Embed`` calls,
   and 64 messages on one ``EmbedStream``. Target: EmbedBatch tokens/s >= 5x unary.
2. Workers: the service with ``--workers 1`` and ``--workers 2`` (one port,
   SO_REUSEPORT), unary T=1024 fp32 c=16 and T=16 c=16. The load generator runs on the same
   2 cores, so this shows what a second process buys on a box that is already full; on a
   pod with its own cores, size workers to cores (docs/performance.md).
Repetitions are interleaved; figures are medians. Writes bench/results/scaling.json.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import statistics
import time
from pathlib import Path
from typing import Any

import grpc

from bench.config import BenchConfig
from bench.loadgen import measure
from bench.model import MODEL_NAME, VOCAB_SIZE, ensure_model
from bench.servers import ROOT, ServerProcess, free_port, service_argv, stop_servers, wait_serving
from bench.servers import launch as launch_server
from genproto.embedding.v1 import embedding_pb2 as pb

__all__ = ["main", "packed_round", "stream_round", "unary_round"]

B, T = 64, 16


def _ids(rng: random.Random, n: int) -> list[int]:
    return [rng.randrange(VOCAB_SIZE) for _ in range(n)]


async def packed_round(channel: grpc.aio.Channel, seqs: list[list[int]],
                       model: str = MODEL_NAME) -> int:
    """One EmbedBatch of every sequence; returns the rows received."""
    call = channel.unary_unary("/embedding.v1.EmbeddingService/EmbedBatch",
                               request_serializer=pb.EmbedBatchRequest.SerializeToString,
                               response_deserializer=pb.EmbedBatchResponse.FromString)
    resp = await call(pb.EmbedBatchRequest(model=model, inputs=[
        pb.EmbedInput(token_ids=pb.TokenIds(ids=s)) for s in seqs]))
    return int(resp.embeddings.shape[0])


async def unary_round(channel: grpc.aio.Channel, seqs: list[list[int]],
                      model: str = MODEL_NAME) -> int:
    """Every sequence as its own Embed, all in flight at once."""
    call = channel.unary_unary("/embedding.v1.EmbeddingService/Embed",
                               request_serializer=pb.EmbedRequest.SerializeToString,
                               response_deserializer=pb.EmbedResponse.FromString)
    resps = await asyncio.gather(*(call(pb.EmbedRequest(model=model,
                                                        token_ids=pb.TokenIds(ids=s)))
                                   for s in seqs))
    return sum(int(r.embeddings.shape[0]) for r in resps)


async def stream_round(channel: grpc.aio.Channel, seqs: list[list[int]],
                       model: str = MODEL_NAME) -> int:
    """Every sequence as one message of a single EmbedStream."""
    call = channel.stream_stream("/embedding.v1.EmbeddingService/EmbedStream",
                                 request_serializer=pb.EmbedRequest.SerializeToString,
                                 response_deserializer=pb.EmbedResponse.FromString)
    stream = call(iter([pb.EmbedRequest(model=model, token_ids=pb.TokenIds(ids=s))
                        for s in seqs]))
    return sum([int(r.embeddings.shape[0]) async for r in stream])


async def _tokens_per_s(target: str, how: Any, seqs: list[list[int]], seconds: float) -> float:
    async with grpc.aio.insecure_channel(target) as channel:
        await how(channel, seqs)  # warm-up
        rows, t0 = 0, time.perf_counter()
        while time.perf_counter() - t0 < seconds:
            rows += await how(channel, seqs)
        return rows / (time.perf_counter() - t0)


def _launch(repo: Path, workers: int, log_dir: Path) -> ServerProcess:
    port = free_port()
    argv = service_argv(repo, port, "--workers", str(workers), device="auto")
    return launch_server(f"service-w{workers}", argv, port, log_dir)


def run(reps: int, seconds: float, out: Path) -> dict[str, Any]:
    """Both measurements, interleaved over ``reps``; the JSON written to ``out``."""
    cfg = BenchConfig()
    repo = ensure_model(cfg.model_cache, cfg.dim, cfg.max_seq_len)
    rng = random.Random(0)
    seqs = [_ids(rng, T) for _ in range(B)]
    requests = {t: [pb.EmbedRequest(model=MODEL_NAME, token_ids=pb.TokenIds(ids=_ids(rng, t)))
                    for _ in range(8)] for t in (16, 1024)}
    servers = {w: _launch(repo, w, out / "logs") for w in (1, 2)}
    packed: dict[str, list[float]] = {"batch": [], "unary": [], "stream": []}
    workers: dict[str, list[float]] = {f"w{w}/T{t}": [] for w in (1, 2) for t in (16, 1024)}
    try:
        for server in servers.values():
            wait_serving(server, 120)
        for rep in range(reps):
            target = servers[1].target
            for name, how in (("batch", packed_round), ("unary", unary_round),
                              ("stream", stream_round)):
                packed[name].append(asyncio.run(_tokens_per_s(target, how, seqs, seconds)))
            for t in (1024, 16):
                for w, server in servers.items():
                    m = asyncio.run(measure(server.target, "service", "unary", requests[t], 16,
                                            (t, cfg.dim), 0.3, seconds))
                    workers[f"w{w}/T{t}"].append(m.requests / m.seconds * t)
            print(f"scaling: repetition {rep + 1}/{reps} done", flush=True)
    finally:
        stop_servers({str(w): s for w, s in servers.items()})
    med = {k: statistics.median(v) for k, v in {**packed, **workers}.items()}
    report = {"loadavg_before": os.getloadavg()[0], "B": B, "T": T, "reps": reps,
              "packed_tokens_s": {k: med[k] for k in packed},
              "workers_tokens_s": {k: med[k] for k in workers},
              "batch_over_unary": statistics.median(
                  b / u for b, u in zip(packed["batch"], packed["unary"])),
              "stream_over_unary": statistics.median(
                  s / u for s, u in zip(packed["stream"], packed["unary"])),
              "workers2_over_1": {t: statistics.median(
                  a / b for a, b in zip(workers[f"w2/T{t}"], workers[f"w1/T{t}"]))
                  for t in (16, 1024)}}
    out.mkdir(parents=True, exist_ok=True)
    (out / "scaling.json").write_text(json.dumps(report, indent=1))
    return report


def format_scaling(r: dict[str, Any]) -> str:
    """The lines ``make bench`` prints."""
    p, w = r["packed_tokens_s"], r["workers_tokens_s"]
    verdict = "MET    " if r["batch_over_unary"] >= 5 else "NOT MET"
    return "\n".join([
        f"packed, {r['B']} x T={r['T']} per round (tokens/s, median of {r['reps']}):",
        f"  EmbedBatch {p['batch']:.0f}   64 unary {p['unary']:.0f}   "
        f"64-message stream {p['stream']:.0f}",
        f"  [{verdict}] EmbedBatch / unary tokens/s = {r['batch_over_unary']:.2f} (target >= 5)"
        f"; stream / unary = {r['stream_over_unary']:.2f}",
        "workers (unary c=16, tokens/s; the load generator shares the 2 cores):",
        f"  T=1024 fp32: --workers 1 {w['w1/T1024']:.0f}   --workers 2 {w['w2/T1024']:.0f}   "
        f"x{r['workers2_over_1'][1024]:.2f}",
        f"  T=16   fp32: --workers 1 {w['w1/T16']:.0f}   --workers 2 {w['w2/T16']:.0f}   "
        f"x{r['workers2_over_1'][16]:.2f}"])


def main(argv: list[str] | None = None) -> None:
    """``python -m bench.scaling``."""
    p = argparse.ArgumentParser(prog="python -m bench.scaling", description=__doc__)
    p.add_argument("--reps", type=int, default=3)
    p.add_argument("--duration", type=float, default=2.0, help="seconds per measurement")
    p.add_argument("--out", type=Path, default=ROOT / "bench" / "results")
    ns = p.parse_args(argv)
    print(format_scaling(run(ns.reps, ns.duration, ns.out)))


if __name__ == "__main__":
    main()

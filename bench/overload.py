"""Overload: past its queue budget, a server must refuse fast with RESOURCE_EXHAUSTED.

    python -m bench.overload [--max-queue-tokens 1024] [--tokens 512] [--concurrency 4,16,64]

One server (``python -m service``, one worker) with a small ``--max-queue-tokens``; one
grpc.aio client process on loopback. Two phases on the same server, back to back:

* baseline: one request in flight at a time (unloaded);
* overload, once per ``--concurrency`` value: that many requests in flight, each of T
  tokens (``--tokens``), more than the queue budget admits (by default two requests fit).

Then a floor: health checks at each concurrency (an RPC with no work behind it: what this
client and machine cost alone). Reported per overload phase: p50/p99 of accepted requests
beside the baseline's, the share refused, p50/p99 of the rejections (RESOURCE_EXHAUSTED,
measured at the client from call to status) against the target p99 < 5 ms, and the
floor's p99. Latencies of the first ``--warmup`` seconds of a phase are not counted.
Then the slow-reader row (``bench.slow_reader``, ``--slow-readers`` streams that never
read their answers, beside ordinary clients): the server's RSS growth and their latency;
and its REST twin (``bench.slow_reader_http``, ``--rest-slow-readers`` connections that
each ask for a B x T answer and never read it, on a server with ``--http-port``, the
in-flight cap ``--rest-max-concurrent-rpcs`` and the budget ``--rest-max-unsent-mib``).
Writes ``<out>/overload.json`` and prints a row per phase.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import grpc
import grpc.aio
from grpc_health.v1 import health_pb2, health_pb2_grpc

from bench.model import MODEL_NAME, VOCAB_SIZE, ensure_model
from bench.servers import ServerProcess, child_env, free_port, stop_servers, wait_serving
from bench.slow_reader import format_row as format_slow_row
from bench.slow_reader import run_slow_readers
from bench.slow_reader_http import format_rest_row, infer_body, run_rest_slow_readers
from bench.window import percentile
from genproto.embedding.v1 import embedding_pb2 as pb
from genproto.embedding.v1 import embedding_pb2_grpc as pb_grpc

__all__ = ["TARGET_REJECT_P99_MS", "format_rows", "main", "run_overload"]

ROOT = Path(__file__).resolve().parent.parent
TARGET_REJECT_P99_MS = 5.0
_OK, _FULL = grpc.StatusCode.OK, grpc.StatusCode.RESOURCE_EXHAUSTED


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    """The bench's flags."""
    p = argparse.ArgumentParser(prog="python -m bench.overload", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--max-queue-tokens", type=int, default=1024)
    p.add_argument("--tokens", type=int, default=512, help="T of every request")
    p.add_argument("--concurrency", type=lambda v: [int(x) for x in v.split(",")],
                   default=[4, 16, 64], help="comma-separated: one overload phase each")
    p.add_argument("--seconds", type=float, default=4.0, help="measured seconds per phase")
    p.add_argument("--warmup", type=float, default=0.5)
    p.add_argument("--dim", type=int, default=256)
    p.add_argument("--out", type=Path, default=ROOT / "bench" / "results")
    p.add_argument("--model-cache", type=Path,
                   default=ROOT / "bench" / "results" / ".model-overload")
    p.add_argument("--slow-readers", type=int, default=4,
                   help="streams that never read, in the slow-reader row (0: no row)")
    p.add_argument("--slow-tokens", type=int, default=1024, help="T of their requests")
    p.add_argument("--rest-slow-readers", type=int, default=16,
                   help="REST clients that never read, in the REST row (0: no row)")
    p.add_argument("--rest-slow-batch", type=int, default=8,
                   help="B of their requests (T = --slow-tokens): 8 MiB answers at C=256")
    p.add_argument("--rest-max-concurrent-rpcs", type=int, default=8)
    p.add_argument("--rest-max-unsent-mib", type=int, default=32)
    p.add_argument("--server-arg", action="append", default=[],
                   help="extra flag for python -m service (repeatable)")
    return p.parse_args(argv)


def _launch(args: argparse.Namespace, repo: Path, queue_tokens: int | None = None,
            http_port: int = -1, extra: Sequence[str] = ()) -> ServerProcess:
    port = free_port()
    queue = args.max_queue_tokens if queue_tokens is None else queue_tokens
    env = child_env()
    batch = min(queue, 16384)  # the server needs batch <= queue budget
    argv = [sys.executable, "-m", "service", "--model-repository", str(repo / "models"),
            "--host", "127.0.0.1", "--grpc-port", str(port), "--http-port", str(http_port),
            "--metrics-port", "-1",
            "--device", "cpu", "--poll-seconds", "0", "--max-queue-tokens",
            str(queue), "--max-batch-tokens", str(batch), *args.server_arg, *extra]
    args.out.mkdir(parents=True, exist_ok=True)
    log = args.out / "overload-server.log"
    with log.open("wb") as fh:
        proc = subprocess.Popen(argv, cwd=ROOT, env=env, stdout=fh, stderr=subprocess.STDOUT)
    return ServerProcess("service", f"127.0.0.1:{port}", proc, log)


async def _phase(target: str, requests: list[pb.EmbedRequest] | None, concurrency: int,
                 warmup: float, seconds: float) -> dict[str, Any]:
    """``concurrency`` closed loops for warmup + seconds; latencies (ms) by outcome.

    ``requests`` None: health checks instead of Embed, i.e. an RPC with no work behind it,
    the floor this client and machine set at that concurrency.
    """
    ok: list[float] = []
    full: list[float] = []
    other: dict[str, int] = {}
    async with grpc.aio.insecure_channel(target) as channel:
        await asyncio.wait_for(channel.channel_ready(), timeout=30)
        embed = pb_grpc.EmbeddingServiceStub(channel).Embed
        check = health_pb2_grpc.HealthStub(channel).Check
        probe = health_pb2.HealthCheckRequest()
        start = time.perf_counter() + warmup
        end = start + seconds

        async def loop(k: int) -> None:
            i = k
            while (sent := time.perf_counter()) < end:
                try:
                    if requests is None:
                        await check(probe, timeout=30)
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
    n = len(ok) + len(full) + sum(other.values())
    return {"concurrency": concurrency, "seconds": seconds, "requests": n,
            "accepted": len(ok), "rejected": len(full), "other_codes": other,
            "accepted_req_s": len(ok) / seconds,
            "accepted_p50_ms": percentile(ok, 0.5), "accepted_p99_ms": percentile(ok, 0.99),
            "rejected_p50_ms": percentile(full, 0.5), "rejected_p99_ms": percentile(full, 0.99),
            "rejected_max_ms": max(full, default=float("nan"))}


def run_overload(args: argparse.Namespace) -> dict[str, Any]:
    """Start the server, run baseline then overload, stop it; write overload.json."""
    repo = ensure_model(args.model_cache, args.dim, max(1024, args.tokens, args.slow_tokens))
    rng = random.Random(0)
    requests = [pb.EmbedRequest(token_ids=pb.TokenIds(
        ids=[rng.randrange(VOCAB_SIZE) for _ in range(args.tokens)])) for _ in range(8)]
    server = _launch(args, repo)
    try:
        wait_serving(server, 120)
        baseline = asyncio.run(_phase(server.target, requests, 1, args.warmup, args.seconds))
        overload = [asyncio.run(_phase(server.target, requests, c, args.warmup, args.seconds))
                    for c in args.concurrency]
        # The same concurrency with nothing to do: what client and machine cost alone.
        floors = [asyncio.run(_phase(server.target, None, c, args.warmup, args.seconds / 2))
                  for c in args.concurrency]
    finally:
        stop_servers({"service": server})
    slow = None
    if args.slow_readers:  # a server of its own, with the default queue budget: the row
        server = _launch(args, repo, queue_tokens=262144)  # is about memory, not the queue
        try:
            wait_serving(server, 120)
            slow = asyncio.run(run_slow_readers(
                server.target, server.proc.pid, pb.EmbedRequest(token_ids=pb.TokenIds(
                    ids=[rng.randrange(VOCAB_SIZE) for _ in range(args.slow_tokens)])),
                requests, streams=args.slow_readers, concurrency=1, seconds=args.seconds))
        finally:
            stop_servers({"service": server})
    rest = _rest_slow_readers(args, repo, rng) if args.rest_slow_readers else None
    for phase, floor in zip(overload, floors):
        phase["floor_p50_ms"] = floor["accepted_p50_ms"]
        phase["floor_p99_ms"] = floor["accepted_p99_ms"]
        phase["rejection_target_met"] = (bool(phase["rejected"]) and phase["rejected_p99_ms"]
                                         < TARGET_REJECT_P99_MS)
    report = {
        "config": {"max_queue_tokens": args.max_queue_tokens, "T": args.tokens,
                   "C": args.dim, "concurrency": args.concurrency, "seconds": args.seconds,
                   "warmup": args.warmup, "server_args": args.server_arg,
                   "cpus": os.cpu_count(), "loadavg": round(os.getloadavg()[0], 2)},
        "baseline": baseline, "overload": overload,
        "target": {"name": "rejection p99 < 5 ms", "bound_ms": TARGET_REJECT_P99_MS},
    }
    if slow is not None:
        slow["answer_mib"] = args.slow_tokens * args.dim * 4 / 2**20
        report["slow_reader"] = slow
    if rest is not None:
        report["rest_slow_reader"] = rest
    (args.out / "overload.json").write_text(json.dumps(report, indent=1))
    return report


def _rest_slow_readers(args: argparse.Namespace, repo: Path,
                       rng: random.Random) -> dict[str, Any]:
    """The REST row: a server with the HTTP port, its cap and budget; the phase's figures
    with the answer's size and the bound those flags set on what unread answers hold."""
    http_port = free_port()
    budget = args.rest_max_unsent_mib << 20
    server = _launch(args, repo, queue_tokens=262144, http_port=http_port, extra=[
        "--max-concurrent-rpcs", str(args.rest_max_concurrent_rpcs),
        "--max-unsent-bytes", str(budget)])
    B, T = args.rest_slow_batch, args.slow_tokens
    slow_body = infer_body([[rng.randrange(VOCAB_SIZE) for _ in range(T)] for _ in range(B)])
    normal = [infer_body([[rng.randrange(VOCAB_SIZE) for _ in range(args.tokens)]])
              for _ in range(8)]
    try:
        wait_serving(server, 120)
        phase = asyncio.run(run_rest_slow_readers(
            http_port, server.proc.pid, MODEL_NAME, slow_body, normal,
            clients=args.rest_slow_readers, seconds=args.seconds))
    finally:
        stop_servers({"service": server})
    answer = B * T * args.dim * 4
    held = min(args.rest_max_concurrent_rpcs, args.rest_slow_readers, max(1, budget // answer))
    phase.update(answer_mib=answer / 2**20, bound_mib=held * answer / 2**20,
                 max_concurrent_rpcs=args.rest_max_concurrent_rpcs, max_unsent_bytes=budget)
    return phase


def format_rows(report: dict[str, Any]) -> str:
    """Header and a row per overload phase: accepted vs baseline, then the rejections."""
    c, b = report["config"], report["baseline"]
    head = (f"{'queue':>6} {'T':>5} {'c':>4} {'base p50':>9} {'base p99':>9} {'acc p50':>8} "
            f"{'acc p99':>8} {'acc/s':>7} {'refused':>8} {'rej p50':>8} {'rej p99':>8} "
            f"{'floor p99':>9}  "
            f"rej p99 < {TARGET_REJECT_P99_MS:g} ms")
    lines = [head, "-" * len(head)]
    for o in report["overload"]:
        share = o["rejected"] / o["requests"] if o["requests"] else 0.0
        lines.append(
            f"{c['max_queue_tokens']:>6} {c['T']:>5} {o['concurrency']:>4} "
            f"{b['accepted_p50_ms']:>9.2f} {b['accepted_p99_ms']:>9.2f} "
            f"{o['accepted_p50_ms']:>8.2f} {o['accepted_p99_ms']:>8.2f} "
            f"{o['accepted_req_s']:>7.0f} {share:>8.0%} {o['rejected_p50_ms']:>8.2f} "
            f"{o['rejected_p99_ms']:>8.2f} {o['floor_p99_ms']:>9.2f}  "
            f"{'MET' if o['rejection_target_met'] else 'NOT MET'}")
    if "slow_reader" in report:
        lines.append(format_slow_row(report["slow_reader"], report["slow_reader"]["answer_mib"]))
    if "rest_slow_reader" in report:
        r = report["rest_slow_reader"]
        lines.append(format_rest_row(r, r["answer_mib"], r["bound_mib"]))
    lines.append(f"(ms; baseline: 1 in flight, {b['accepted_req_s']:.0f} req/s; floor: health "
                 f"checks at the same c, no work behind them; load average {c['loadavg']} "
                 f"on {c['cpus']} CPUs)")
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> None:
    """``python -m bench.overload``: run, print the row, write the JSON."""
    args = parse_args(argv)
    report = run_overload(args)
    print(format_rows(report))
    for o in report["overload"]:
        if o["other_codes"]:
            print(f"other codes at c={o['concurrency']}: {o['other_codes']}")
    print(f"wrote {args.out / 'overload.json'}")


if __name__ == "__main__":
    main()

"""Where a request's server CPU goes, per path: the profile behind docs/performance.md.

    .venv/bin/python -m bench.cpu_profile [--seconds 2] [--rounds 2] [--out FILE]

Two parts, on the benchmark checkpoint (GPT-2 size, C=768, uniform random ids):

1. **Stages, in process** (``time.process_time_ns``, median of many calls, distinct ids):
   decode the request, admission (limits, ids parse and range check), the reply plan, the
   response allocation, the lookup itself (``EmbeddingTables.embed_into``: gather, add,
   cast), the finish (timing fields), a shared-memory write (``pwrite``) and, as the unit
   every pass is measured in, one plain copy of the answer's bytes. The whole handler
   (``NativeFront._embed_one``, everything but the transport) is timed too.
2. **The whole server, end to end**: a real server process under load from
   ``bench.loadgen`` (gRPC unary, stream, OIP, shared memory) and ``bench.http`` (REST,
   binary output), its user+system CPU time (every thread) read from ``/proc`` around a
   measured stretch and divided by the answers completed. What the handler does not
   account for is the transport (grpcio or aiohttp: receive, the copy into its own
   buffers, send) plus the event loop's scheduling.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import torch

from bench.config import DTYPE_BYTES
from bench.http import run_load
from bench.loadgen import DTYPE_ENUM, measure
from bench.model import MODEL_NAME, VOCAB_SIZE, ensure_model
from bench.servers import ROOT, free_port, launch, service_argv, stop_servers, wait_serving
from genproto.embedding.v1 import embedding_pb2 as pb

__all__ = ["main", "server_cpu", "stages"]

DIM = 768
MAX_SEQ_LEN = 1024
_DISTINCT = 64


class _Call:
    """What the native front reads of the frame's per-call object."""

    identity = ""
    peer = "ipv4:127.0.0.1:1"
    deadline = None

    def __init__(self) -> None:
        self.start_ns = time.perf_counter_ns()


def _median_us(fn: Callable[[int], Any], n: int) -> float:
    """Median process CPU µs of ``fn(i)`` (every thread: the batcher's compute thread too)."""
    times = []
    for i in range(n):
        t0 = time.process_time_ns()
        fn(i)
        times.append(time.process_time_ns() - t0)
    return statistics.median(times) / 1e3


async def _amedian_us(fn: Callable[[int], Awaitable[Any]], n: int) -> float:
    times = []
    for i in range(n):
        t0 = time.process_time_ns()
        await fn(i)
        times.append(time.process_time_ns() - t0)
    return statistics.median(times) / 1e3


def _request(T: int, dtype: str, seed: int) -> pb.EmbedRequest:
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(0, VOCAB_SIZE, (T,), generator=g).tolist()
    return pb.EmbedRequest(model=MODEL_NAME, dtype=DTYPE_ENUM[dtype],
                           token_ids=pb.TokenIds(ids=ids))


async def _stages(repo: Path, T: int, dtype: str, n: int) -> dict[str, float]:
    from client.shm import SharedMemoryRegion
    from service.config import ServerConfig
    from service.engine.admission import Input
    from service.engine.batcher import Timing
    from service.rpc import codec
    from service.rpc.native import _options
    from service.server import EmbeddingServer

    server = EmbeddingServer(ServerConfig(model_repository=repo / "models", grpc_port=0,
                                          http_port=-1, metrics_port=-1, poll_seconds=0,
                                          device="cpu"))
    await server.refresh()
    server.batcher.start()
    engine, front = server.engine, server.fronts[0]
    tables = engine.model(MODEL_NAME).tables
    # Distinct requests, rotated: uniform ids over the 154 MB table miss the cache, as in
    # the served benchmark (one request repeated would find its rows in cache).
    requests = [_request(T, dtype, s) for s in range(_DISTINCT)]
    raw = [r.SerializeToString() for r in requests]
    out: dict[str, float] = {}
    out["decode"] = _median_us(lambda i: pb.EmbedRequest.FromString(raw[i % _DISTINCT]), n)

    def inputs(r: pb.EmbedRequest) -> list[Input]:
        return [Input("input", ids=r.token_ids.ids)]

    out["admission"] = await _amedian_us(
        lambda i: engine.admit(_options(requests[0]), inputs(requests[i % _DISTINCT])), n)
    admission = await engine.admit(_options(requests[0]), inputs(requests[0]))
    shape = (admission.tokens, admission.dim)
    fields = pb.EmbedResponse(token_ids=requests[0].token_ids.ids, model=MODEL_NAME,
                              version=1, checkpoint_id="x" * 64)
    out["plan"] = _median_us(lambda i: codec.Reply(fields, shape, DTYPE_ENUM[dtype]), n)
    reply = codec.Reply(fields, shape, DTYPE_ENUM[dtype])
    timing = Timing(1, 2, 3, 4)
    out["allocate + finish"] = _median_us(lambda i: reply.allocate().finish(timing), n)
    writer = reply.allocate()
    all_ids = [torch.tensor(r.token_ids.ids) for r in requests]
    spans = [(0, T)]
    out["lookup"] = _median_us(
        lambda i: tables.embed_into([(all_ids[i % _DISTINCT], spans, writer.rows)], 0), n)
    # The lookup's primitive passes, each alone over the same shapes (a full-size fp32
    # intermediate, as a path that materialises one pays).
    full = torch.empty(T, DIM)
    wire = torch.empty(T, DIM, dtype=writer.rows.dtype)
    out["op: gather fp32 (T, C)"] = _median_us(
        lambda i: torch.index_select(tables.token_table, 0, all_ids[i % _DISTINCT], out=full),
        n)
    position = tables.position_table
    assert position is not None
    out["op: add positions fp32"] = _median_us(lambda i: full.add_(position[:T]), n)
    other = torch.empty_like(wire)
    out["op: one pass (copy the answer)"] = _median_us(lambda i: other.copy_(wire), n)
    if writer.rows.dtype != torch.float32:
        out["op: cast fp32 -> wire dtype"] = _median_us(lambda i: wire.copy_(full), n)
    with SharedMemoryRegion("profile", T * DIM * 4) as region:
        call = _Call()
        engine.shm.register(call, region.name, region.key, 0, region.byte_size)

        def plan() -> Any:
            return engine.plan_shm(call, region.name, 0, shape, DTYPE_ENUM[dtype], "output")

        def direct(i: int) -> None:  # the guarded one-pass store into the mapping
            p = plan()
            assert p.lookup(tables, all_ids[i % _DISTINCT], spans, 0)
            p.write()

        def private(i: int) -> None:  # rows into a private buffer, then pwrite
            p = plan()
            tables.embed_into([(all_ids[i % _DISTINCT], spans, p.rows.view(T, -1))], 0)
            p.write()

        if tables.writes_guarded:
            out["shm: lookup into the mapping"] = _median_us(direct, n)
        out["shm: lookup into private + pwrite"] = _median_us(private, n)
        shm_requests = []
        for r in requests:
            shm_requests.append(pb.EmbedRequest())
            shm_requests[-1].CopyFrom(r)
            shm_requests[-1].output.region = region.name
        out["handler: shm"] = await _amedian_us(
            lambda i: front._embed_one(shm_requests[i % _DISTINCT], call),  # type: ignore[arg-type]
            n)
        engine.shm.unregister(call, "")
    out["handler: unary"] = await _amedian_us(
        lambda i: front._embed_one(requests[i % _DISTINCT], _Call()),  # type: ignore[arg-type]
        n)
    await server.batcher.close()
    return out


def stages(repo: Path, n: int) -> dict[str, dict[str, float]]:
    """Per (T, dtype): the median thread CPU µs of each stage."""
    torch.set_num_threads(1)  # as the server runs (--torch-threads 1)
    out = {}
    for T in (16, 1024):
        for dtype in ("float32", "bfloat16"):
            out[f"T={T} {dtype}"] = asyncio.run(_stages(repo, T, dtype, n))
    return out


def _cpu_s(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def server_cpu(repo: Path, seconds: float, rounds: int) -> list[dict[str, Any]]:
    """Per path and cell: the server process's CPU µs per answer and its answers/s."""
    port, http_port = free_port(), free_port()
    server = launch("service", service_argv(repo, port, http_port=http_port), port,
                    Path(tempfile.gettempdir()) / "cpu_profile_logs")
    rows = []
    try:
        wait_serving(server, 120)
        pid = server.proc.pid
        cells = [(T, dtype, c, mode) for T, c in ((16, 1), (1024, 16))
                 for dtype in ("float32", "bfloat16")
                 for mode in ("unary", "stream", "oip", "shm", "rest")]
        results: dict[tuple[Any, ...], list[tuple[float, float]]] = {k: [] for k in cells}
        for _ in range(rounds):
            for cell in cells:
                results[cell].append(_one(cell, server.target, http_port, pid, seconds))
        for (T, dtype, c, mode), rs in results.items():
            rows.append({"T": T, "dtype": dtype, "c": c, "mode": mode,
                         "cpu_us": statistics.median(r[0] for r in rs),
                         "req_s": statistics.median(r[1] for r in rs),
                         "rounds_cpu_us": [round(r[0], 1) for r in rs]})
    finally:
        stop_servers({"service": server})
    return rows


def _one(cell: tuple[int, str, int, str], target: str, http_port: int, pid: int,
         seconds: float) -> tuple[float, float]:
    T, dtype, c, mode = cell
    if mode == "rest":
        from bench.http import Cell as HttpCell
        from bench.http import request_body

        body = request_body(HttpCell(T, "FP32" if dtype == "float32" else "BF16", c,
                                     "binary"))
        url = f"http://127.0.0.1:{http_port}/v2/models/{MODEL_NAME}/infer"
        rps, _, cpu_ms = asyncio.run(run_load(url, body, c, seconds, pid))
        return cpu_ms * 1e3, rps
    # Distinct requests, rotated: uniform ids over the 154 MB table miss the cache, as in
    # the served benchmark (one request repeated would find its rows in cache).
    requests = [_request(T, dtype, s) for s in range(_DISTINCT)]
    shape = (T, DIM)
    asyncio.run(measure(target, "service", mode, requests, c, shape, 0.0, 0.4))  # warm-up
    cpu0 = _cpu_s(pid)
    m = asyncio.run(measure(target, "service", mode, requests, c, shape, 0.0, seconds))
    cpu = _cpu_s(pid) - cpu0
    return cpu / max(1, m.requests) * 1e6, m.requests / m.seconds


def main(argv: list[str] | None = None) -> None:
    """Run both parts; print them and write the JSON."""
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--seconds", type=float, default=2.0, help="per cell and round")
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--calls", type=int, default=300, help="per in-process stage")
    p.add_argument("--model-cache", type=Path, default=ROOT / "bench" / "results" / ".model")
    p.add_argument("--out", type=Path, default=ROOT / "bench" / "results" / "cpu_profile.json")
    p.add_argument("--skip-server", action="store_true", help="in-process stages only")
    args = p.parse_args(argv)
    repo = ensure_model(args.model_cache, DIM, MAX_SEQ_LEN)
    load = os.getloadavg()[0]
    result: dict[str, Any] = {"stages_us": stages(repo, args.calls)}
    for key, st in result["stages_us"].items():
        print(key)
        for name, us in st.items():
            print(f"  {name:34s} {us:9.1f} us")
    if not args.skip_server:
        result["server_cpu"] = server_cpu(repo, args.seconds, args.rounds)
        for r in result["server_cpu"]:
            mb = r["T"] * DIM * DTYPE_BYTES[r["dtype"]] / 2**20
            print(f"  T={r['T']:<5} {r['dtype']:8s} c={r['c']:<3} {r['mode']:6s} "
                  f"{r['cpu_us']:8.0f} us CPU/answer ({mb:.2f} MiB)  {r['req_s']:7.0f} req/s  "
                  f"rounds {r['rounds_cpu_us']}")
    result["loadavg"] = [load, os.getloadavg()[0]]
    print(f"load average before/after: {load:.2f} / {os.getloadavg()[0]:.2f}")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=1))
    print(f"wrote {args.out}", file=sys.stderr)


if __name__ == "__main__":
    main()

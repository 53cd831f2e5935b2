"""How low can the lookup floor of ``bench.http`` go? Variants of a server that does only the
lookup, against the same HTTP ceiling, interleaved in one run.

    .venv/bin/python -m bench.http_floors [--T 1024] [--c 16] [--rounds 11] [--seconds 2]

``bench.http`` reports the service beside a floor that allocates and writes its body as the
service does. This asks whether any other way of doing the same lookup would lift that
floor, i.e. whether a service built differently could reach a higher share of the ceiling.
Every variant answers the same request (T ids, FP32, binary output: C = 768) with the same
lookup: ``bench.http``'s model, loaded by the service's ``load_model``, and its
``embed_into``. They differ in one choice at a time:

- ``fresh``: a new response body per request (``codec.ResponseWriter``, the service's
  allocation), lookup on the event loop, ``web.Response``: ``bench.http``'s floor;
- ``fresh-thread``: the same, lookup on a compute thread (the service's batcher runs jobs
  over ``INLINE_TOKENS`` rows there);
- ``pool``: bodies reused most-recent-first (cache-warm), written by ``StreamResponse``;
- ``pool-thread``: ``pool`` with the lookup on a compute thread;
- ``fresh-huge``: ``fresh`` with the token table in transparent huge pages (fewer TLB
  misses for the scattered row reads).

The ceiling is ``bench.http``'s: pre-built bytes through ``web.Response``. Per round every
server runs ``--seconds`` of load from ``c`` keep-alive clients, in turn; the table gives
medians over rounds and the median of each variant's paired ratio to the ceiling. Writes
``<out>/http_floors.json``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import mmap
import os
import statistics
import sys
import tempfile
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from aiohttp import web

from bench.http import (
    MODEL,
    C,
    Cell,
    cell_ids,
    free_port,
    request_body,
    run_load,
    spawn,
    write_model,
)
from bench.http_servers import serve_forever

__all__ = ["VARIANTS", "main", "serve"]

VARIANTS = ("ceiling", "fresh", "fresh-thread", "pool", "pool-thread", "fresh-huge")
_HEAD = b'{"model_name":"bench","outputs":[]}'  # stands in for the JSON header


def serve(port: int, variant: str, T: int, repo: Path) -> None:
    """Serve one variant on ``port`` until killed."""
    import torch
    from service.rpc.codec import ResponseWriter

    from service.engine.batcher import Timing
    from service.engine.loading import load_model
    from service.engine.tables import EmbeddingTables

    torch.set_num_threads(1)  # the service's default
    tables = load_model(MODEL, repo / MODEL / "1", torch.device("cpu"), torch.float32).tables
    if variant.endswith("-huge"):
        rows, dim = tables.token_table.shape
        area = mmap.mmap(-1, rows * dim * 4, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
        area.madvise(mmap.MADV_HUGEPAGE)
        huge = torch.frombuffer(area, dtype=torch.float32).view(rows, dim)  # (V, C)
        tables = EmbeddingTables(huge.copy_(tables.token_table), tables.position_table,
                                 torch.device("cpu"))
    ids = torch.tensor(cell_ids(T))  # (T,)
    n = len(_HEAD) + T * C * 4
    prebuilt = _HEAD + bytes(T * C * 4)
    pool: list[bytearray] = []
    compute = ThreadPoolExecutor(1)

    def lookup(rows: torch.Tensor) -> None:
        tables.embed_into([(ids, [(0, T)], rows)], 0)  # token + position rows, (T, C)

    async def run(rows: torch.Tensor) -> None:
        if variant.endswith("-thread"):
            await asyncio.get_running_loop().run_in_executor(compute, lookup, rows)
        else:
            lookup(rows)

    async def handle(request: web.BaseRequest) -> web.StreamResponse:
        await request.read()
        if variant == "ceiling":
            return web.Response(body=prebuilt)
        if not variant.startswith("pool"):
            writer = ResponseWriter(_HEAD, (T, C), torch.float32, b"", None)
            await run(writer.rows)
            return web.Response(body=writer.finish(Timing(0, 0, 0, 0)))
        body = pool.pop() if pool else bytearray(n)
        view = memoryview(body)
        view[: len(_HEAD)] = _HEAD
        rows = torch.frombuffer(view[len(_HEAD):], dtype=torch.float32).view(T, C)
        await run(rows)
        del rows
        response = web.StreamResponse()
        response.content_length = n
        await response.prepare(request)
        await response.write(view)
        await response.write_eof()
        view.release()
        pool.append(body)  # Python 3.11's transport copied what it did not send
        return response

    serve_forever(port, handle, f"{variant} ready")


def main(argv: list[str] | None = None) -> None:
    """Run every variant against the ceiling, print the table, write the JSON."""
    p = argparse.ArgumentParser(prog="python -m bench.http_floors",
                                description=__doc__.split("\n")[0])
    p.add_argument("--T", type=int, default=1024)
    p.add_argument("--c", type=int, default=16, help="requests in flight")
    p.add_argument("--rounds", type=int, default=11)
    p.add_argument("--seconds", type=float, default=2.0)
    p.add_argument("--out", type=Path, default=Path("bench/results"))
    p.add_argument("--serve", nargs=3, metavar=("PORT", "VARIANT", "REPO"),
                   help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.serve:
        serve(int(args.serve[0]), args.serve[1], args.T, Path(args.serve[2]))
        return
    body = request_body(Cell(args.T, "FP32", args.c, "binary"))
    servers: dict[str, tuple[int, Any]] = {}
    tmp = tempfile.TemporaryDirectory(prefix="bench-http-floors-")
    repo = Path(tmp.name)
    write_model(repo)
    try:
        for variant in VARIANTS:
            port = free_port()
            servers[variant] = (port, spawn(["-m", "bench.http_floors", "--T", str(args.T),
                                              "--serve", str(port), variant, str(repo)],
                                             f"{variant} ready"))
        runs: dict[str, list[tuple[float, float, float]]] = {v: [] for v in VARIANTS}
        for r in range(args.rounds):
            for variant, (port, proc) in servers.items():
                runs[variant].append(asyncio.run(run_load(f"http://127.0.0.1:{port}/", body,
                                                       args.c, args.seconds, proc.pid)))
            print(f"  round {r + 1}/{args.rounds}", flush=True)
    finally:
        for _, proc in servers.values():
            proc.terminate()
            proc.wait(30)
        tmp.cleanup()
    _report(runs, args)


def _report(runs: dict[str, list[tuple[float, float, float]]], args: argparse.Namespace) -> None:
    top = runs["ceiling"]
    med: Callable[[list[float]], float] = statistics.median
    rows = [{"variant": v, "rps": med([r[0] for r in rs]), "cpu_ms": med([r[2] for r in rs]),
             "ratio": med([a[0] / b[0] for a, b in zip(rs, top)]),
             "rounds_rps": [r[0] for r in rs]} for v, rs in runs.items()]
    print(f"\nLookup floors at T={args.T} FP32 c={args.c} (C={C}), median of {args.rounds} "
          f"rounds of {args.seconds:g} s; load average {os.getloadavg()[0]:.1f} on "
          f"{os.cpu_count()} cores")
    print(f"{'variant':13} {'req/s':>7} {'cpu ms':>7} {'/ceiling':>8}")
    for row in rows:
        print(f"{row['variant']:13} {row['rps']:>7.0f} {row['cpu_ms']:>7.2f} "
              f"{row['ratio']:>8.2f}")
    args.out.mkdir(parents=True, exist_ok=True)
    out = args.out / "http_floors.json"
    out.write_text(json.dumps({"T": args.T, "c": args.c, "C": C, "rounds": args.rounds,
                               "seconds": args.seconds, "loadavg": os.getloadavg(),
                               "rows": rows}, indent=1))
    print(f"wrote {out}", file=sys.stderr)


if __name__ == "__main__":
    main()

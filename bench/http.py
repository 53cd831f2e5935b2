"""The HTTP front against an HTTP ceiling and a lookup floor on the same library, in one run.

    .venv/bin/python -m bench.http [--seconds 2] [--rounds 3] [--out bench/results]

Rows: POST /v2/models/<m>/infer with binary output, T ∈ {16, 1024}, FP32/BF16, c ∈ {1,
16} concurrent requests (C = 768, GPT-2's width), each beside two servers on aiohttp (the
library the front uses), each in its own process:

- the ceiling: a low-level server that reads the request body and answers with the
  service's own response bytes for that cell, captured once before the run (same size,
  same headers), so service ÷ ceiling is what the service adds over HTTP itself;
- the floor: the ceiling's server plus the one piece of work no embedding service can
  skip, the lookup: the service's tables and ``embed_into`` writing the cell's rows into
  a response body allocated as the service allocates it, on the loop; no parsing,
  admission, batching or frame. Floor ÷ ceiling is what the lookup alone costs, on this
  machine, at that load: the service ÷ ceiling ratio cannot pass it by doing less HTTP.

The JSON-output path (FP32; FP16/BF16 do not travel as JSON) runs beside it so the cost of
JSON numbers is visible. Client: aiohttp with keep-alive connections, in this process;
every server runs with the entrypoint's ``GLIBC_TUNABLES``. Per cell: rounds of
``--seconds`` each, the sides in turn (service, floor, ceiling), after a warm-up; the table
gives the median over rounds of each round's throughput and median latency, and the
medians of the rounds' service ÷ ceiling and floor ÷ ceiling throughput (paired per round).
Writes ``<out>/http.json`` and ``<out>/http.png``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import aiohttp

from bench.plot import plot_http
from bench.servers import child_env, free_port
from training.plot import PlotsUnavailable

__all__ = ["Cell", "cell_ids", "cells", "free_port", "main", "request_body", "run_load", "spawn",
           "write_model"]

C, MAX_SEQ_LEN, MODEL = 768, 1024, "bench"
_ROOT = Path(__file__).resolve().parent.parent


@dataclass(frozen=True)
class Cell:
    """One measured configuration."""

    T: int
    datatype: str  # FP32 | BF16
    c: int  # requests in flight
    output: str  # binary | json

    @property
    def name(self) -> str:
        """A file-safe key."""
        return f"T{self.T}-{self.datatype}-c{self.c}-{self.output}"


def cells() -> list[Cell]:
    """Binary rows for every T, dtype and concurrency; JSON rows for FP32."""
    out = [Cell(T, dt, c, "binary") for T in (16, 1024) for dt in ("FP32", "BF16")
           for c in (1, 16)]
    return out + [Cell(T, "FP32", c, "json") for T in (16, 1024) for c in (1, 16)]


def cell_ids(T: int) -> list[int]:
    """A cell's token ids: spread over the whole table, as real text's are."""
    return [(i * 7919) % 50257 for i in range(T)]


def request_body(cell: Cell) -> bytes:
    """The infer request of a cell: T ids as JSON, the output binary or JSON."""
    ids = cell_ids(cell.T)
    return json.dumps({
        "inputs": [{"name": "input_ids", "datatype": "INT64", "shape": [1, cell.T],
                    "data": ids}],
        "parameters": {"datatype": cell.datatype},
        "outputs": [{"name": "embeddings",
                     "parameters": {"binary_data": cell.output == "binary"}}]}).encode()


# -- load ---------------------------------------------------------------------------------

def _cpu_seconds(pid: int) -> float:
    """A process's user + system CPU time so far (all its threads)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


async def run_load(url: str, body: bytes, c: int, seconds: float,
                   pid: int) -> tuple[float, float, float]:
    """Requests per second, median latency (ms) and the server's CPU ms per request of
    ``c`` clients for ``seconds``."""
    latencies: list[float] = []
    connector = aiohttp.TCPConnector(limit=c)
    async with aiohttp.ClientSession(connector=connector) as session:
        async def one() -> float:
            t0 = time.perf_counter()
            async with session.post(url, data=body) as response:
                await response.read()
                if response.status != 200:
                    raise RuntimeError(f"{url}: HTTP {response.status}")
            return time.perf_counter() - t0

        async def worker(end: float) -> None:
            while time.perf_counter() < end:
                latencies.append(await one())

        warm = time.perf_counter() + min(0.5, seconds / 3)
        await asyncio.gather(*(worker(warm) for _ in range(c)))
        latencies.clear()
        cpu0, t0 = _cpu_seconds(pid), time.perf_counter()
        await asyncio.gather(*(worker(t0 + seconds) for _ in range(c)))
        elapsed, cpu = time.perf_counter() - t0, _cpu_seconds(pid) - cpu0
    n = len(latencies)
    return n / elapsed, statistics.median(latencies) * 1e3, cpu / n * 1e3


# -- processes ----------------------------------------------------------------------------

def spawn(args: list[str], ready: str) -> subprocess.Popen[str]:
    """``python ARGS`` with the entrypoint's malloc tunables, once it prints ``ready``."""
    env = child_env()
    proc = subprocess.Popen([sys.executable, *args], cwd=_ROOT, env=env, text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    assert proc.stdout is not None
    for line in proc.stdout:
        if ready in line:
            return proc
    raise RuntimeError(f"{args[:3]} exited before '{ready}' (status {proc.wait()})")


def write_model(repo: Path) -> None:
    """The bench model: GPT-2's shapes, random tables, written by the real checkpoint code."""
    import torch

    from service.format.writer import write_checkpoint
    from service.format.tokenizer import default_ranks_path, gpt2_spec

    g = torch.Generator().manual_seed(0)
    write_checkpoint(repo / MODEL / "1", token_table=torch.randn(50257, C, generator=g),
                     position_table=torch.randn(MAX_SEQ_LEN, C, generator=g),
                     position="learned", max_seq_len=MAX_SEQ_LEN, vocab_size=50257,
                     tokenizer_spec=gpt2_spec(), tokenizer_ranks=default_ranks_path(),
                     provenance={"source": "bench.http"})


def _capture(port: int, todo: list[Cell], into: Path) -> None:
    """One real response per cell, saved for the ceiling to answer with."""
    import http.client

    for cell in todo:
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
        conn.request("POST", f"/v2/models/{MODEL}/infer", body=request_body(cell))
        response = conn.getresponse()
        data = response.read()
        assert response.status == 200, data[:200]
        keep = ("Content-Type", "Inference-Header-Content-Length")
        headers = {k: v for k, v in response.getheaders() if k in keep}
        (into / f"{cell.name}.bin").write_bytes(data)
        (into / f"{cell.name}.json").write_text(json.dumps(headers))
        conn.close()


def main(argv: list[str] | None = None) -> None:
    """Run every cell, print the table, write the JSON."""
    p = argparse.ArgumentParser(prog="python -m bench.http", description=__doc__.split("\n")[0])
    p.add_argument("--seconds", type=float, default=2.0, help="per round and side")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--out", type=Path, default=Path("bench/results"))
    p.add_argument("--only", default="", help="cells whose name contains this")
    p.add_argument("--server-args", default="", help="more flags for the service, e.g. "
                   "'--max-batch-tokens 4096'")
    args = p.parse_args(argv)
    todo = [cell for cell in cells() if args.only in cell.name]
    with tempfile.TemporaryDirectory(prefix="bench-http-") as tmp:
        root = Path(tmp)
        write_model(root / "models")
        responses = root / "responses"
        responses.mkdir()
        ports = {side: free_port() for side in SIDES}
        procs: dict[str, subprocess.Popen[str]] = {}
        try:
            procs["service"] = spawn(
                ["-m", "service", "--model-repository", str(root / "models"), "--host",
                 "127.0.0.1", "--grpc-port", str(free_port()), "--http-port",
                 str(ports["service"]), "--metrics-port", "-1", "--device", "cpu",
                 "--poll-seconds", "0", "--no-ui", *args.server_args.split()], " serving ")
            _capture(ports["service"], todo, responses)
            for side in ("ceiling", "floor"):
                procs[side] = spawn(["-m", "bench.http_servers", side, str(ports[side]),
                                      str(responses), str(root / "models")], f"{side} ready")
            servers = {side: (ports[side], procs[side].pid) for side in SIDES}
            rows = asyncio.run(_measure(todo, servers, args.seconds, args.rounds))
        finally:
            for proc in procs.values():
                proc.terminate()
                proc.wait(30)
    _report(rows, args)


SIDES = ("service", "floor", "ceiling")  # measured in this order, every round


def _url(side: str, port: int, cell: Cell) -> str:
    path = f"v2/models/{MODEL}/infer" if side == "service" else cell.name
    return f"http://127.0.0.1:{port}/{path}"


async def _measure(todo: list[Cell], servers: dict[str, tuple[int, int]], seconds: float,
                   rounds: int) -> list[dict[str, Any]]:
    rows = []
    for cell in todo:
        body = request_body(cell)
        sides = [s for s in SIDES if s != "floor" or cell.output == "binary"]
        runs: dict[str, list[tuple[float, float, float]]] = {s: [] for s in sides}
        for _ in range(rounds):  # interleaved: drift on a shared machine hits every side
            for side in sides:
                port, pid = servers[side]
                runs[side].append(await run_load(_url(side, port, cell), body, cell.c, seconds,
                                              pid))
        row: dict[str, Any] = asdict(cell)
        for side, rs in runs.items():
            key = "" if side == "service" else side + "_"
            row[key + "rps"] = statistics.median(r[0] for r in rs)
            row[key + "p50_ms"] = statistics.median(r[1] for r in rs)
            row[key + "cpu_ms"] = statistics.median(r[2] for r in rs)
            row["rounds_" + key + "rps"] = [r[0] for r in rs]
        # Paired per round, then the median: a round's load hits all of its sides.
        top = runs["ceiling"]
        row["ratio"] = statistics.median(s[0] / t[0] for s, t in zip(runs["service"], top))
        row["floor_ratio"] = (statistics.median(f[0] / t[0] for f, t in zip(runs["floor"], top))
                              if "floor" in runs else None)
        rows.append(row)
        floor = f", floor {row['floor_ratio']:.2f}" if row["floor_ratio"] is not None else ""
        print(f"  {cell.name}: {row['rps']:.0f} req/s vs ceiling {row['ceiling_rps']:.0f} "
              f"({row['ratio']:.2f}{floor})", flush=True)
    return rows


def _report(rows: list[dict[str, Any]], args: argparse.Namespace) -> None:
    print(f"\nHTTP front vs HTTP ceiling and lookup floor (aiohttp), C={C}, median of "
          f"{args.rounds} rounds of {args.seconds:g} s; load average "
          f"{os.getloadavg()[0]:.1f} on {os.cpu_count()} cores")
    print("(cpu ms: the server process's CPU per request, every thread; ratio: service / "
          "ceiling; floor: floor / ceiling, the most any service doing the lookup can reach)")
    print(f"{'output':7} {'T':>5} {'dtype':5} {'c':>3} | {'req/s':>7} {'p50 ms':>7} "
          f"{'cpu ms':>6} | {'floor':>7} {'cpu ms':>6} | {'ceiling':>7} {'p50 ms':>7} "
          f"{'cpu ms':>6} | {'ratio':>5} {'floor':>5}")
    for r in rows:
        floor = (f"{r['floor_rps']:>7.0f} {r['floor_cpu_ms']:>6.2f}" if r["floor_ratio"]
                 is not None else f"{'-':>7} {'-':>6}")
        floor_ratio = f"{r['floor_ratio']:>5.2f}" if r["floor_ratio"] is not None else "    -"
        print(f"{r['output']:7} {r['T']:>5} {r['datatype']:5} {r['c']:>3} | {r['rps']:>7.0f} "
              f"{r['p50_ms']:>7.2f} {r['cpu_ms']:>6.2f} | {floor} | {r['ceiling_rps']:>7.0f} "
              f"{r['ceiling_p50_ms']:>7.2f} {r['ceiling_cpu_ms']:>6.2f} | {r['ratio']:>5.2f} "
              f"{floor_ratio}")
    args.out.mkdir(parents=True, exist_ok=True)
    out = args.out / "http.json"
    out.write_text(json.dumps({"C": C, "seconds": args.seconds, "rounds": args.rounds,
                               "loadavg": os.getloadavg(), "cpus": os.cpu_count(),
                               "rows": rows}, indent=1))
    print(f"wrote {out}")
    try:
        print(f"wrote {plot_http(rows, args.out / 'http.png')}")
    except PlotsUnavailable as e:  # the JSON and the printed table are the result
        print(f"bench.http: no http.png: {e}", file=sys.stderr)


if __name__ == "__main__":
    main()

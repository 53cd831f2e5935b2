"""A Llama-3-size token table (128,256 x 4,096, bf16: 1 GB) beside a GPT-2-size one.

    python -m bench.big_table [--requests 100] [--keep]

Both tables are random, written by the real writer (``write_checkpoint``) as a model
repository; each is served by a real server process (``python -m service``) and measured:

  * start-up: ``EmbeddingServer.start()`` (verify every sha256, map the tables, SERVING),
    imports excluded, best of 3, in a fresh process each time (cold process, warm page
    cache), against the 2 s target;
  * resident memory of the serving process after traffic: RSS against table + 300 MB
    (a bf16 table stays a memory map: only gathered rows are resident);
  * T=1024 tokens/s and latency of one client sending Embed requests back to back (the
    server with scripts/serve.sh's GLIBC_TUNABLES): the
    Llama table in bf16 (gathered straight into the bf16 response, never widened), the
    GPT-2 table in fp32 (gather + position add) and bf16.
Prints a table and writes bench/results/big_table.json.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import grpc
import numpy as np
import torch

from bench.servers import child_env, free_port
from genproto.embedding.v1 import embedding_pb2 as pb
from genproto.embedding.v1 import embedding_pb2_grpc as pb_grpc
from service.format.writer import write_checkpoint
from service.format.rules import Rules
from service.format.tokenizer import default_ranks_path, gpt2_spec

__all__ = ["TABLES", "main"]

ROOT = Path(__file__).resolve().parent.parent
T = 1024
# name -> (rows, C, storage dtype, learned positions, family)
TABLES: dict[str, tuple[int, int, torch.dtype, bool, str]] = {
    "gpt2": (50257, 768, torch.float32, True, "gpt2"),
    "llama3": (128256, 4096, torch.bfloat16, False, "llama"),
}
_STARTUP = """
import json, sys, time
from pathlib import Path
from service.config import ServerConfig
from service.local import start_in_thread
config = ServerConfig(model_repository=Path(sys.argv[1]), grpc_port=0, http_port=-1,
                      metrics_port=-1,
                      poll_seconds=0)
t0 = time.perf_counter()
handle = start_in_thread(config)  # returns after load + verify; health is SERVING by then
seconds = time.perf_counter() - t0
handle.stop()
print(json.dumps({"startup_s": seconds}))
"""


def _write(repo: Path, name: str) -> int:
    """The model's version 1 (skipped when present); returns the table bytes."""
    rows, C, dtype, learned, family = TABLES[name]
    out = repo / name / "1"
    nbytes = (rows + (1024 if learned else 0)) * C * dtype.itemsize
    if out.is_dir():
        return nbytes
    g = torch.Generator().manual_seed(0)
    token_table = torch.randn(rows, C, generator=g).to(dtype)  # (rows, C)
    position_table = torch.randn(1024, C, generator=g).to(dtype) if learned else None
    tokenizer = (gpt2_spec(), default_ranks_path()) if name == "gpt2" else (None, None)
    write_checkpoint(out, token_table=token_table, position_table=position_table,
                     position="learned" if learned else "none",
                     max_seq_len=1024 if learned else 131072, vocab_size=rows,
                     tokenizer_spec=tokenizer[0], tokenizer_ranks=tokenizer[1],
                     provenance={"source": "bench.big_table"}, family=family, rules=Rules())
    return nbytes


def _startup(repo: Path) -> float:
    """Best of 3 fresh processes: load + verify + SERVING, imports excluded."""
    times = []
    for _ in range(3):
        proc = subprocess.run([sys.executable, "-c", _STARTUP, str(repo)], cwd=ROOT,
                              env=child_env(), capture_output=True, text=True, timeout=300,
                              check=True)
        times.append(json.loads(proc.stdout.strip().splitlines()[-1])["startup_s"])
    return min(times)


def _rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return 0.0


def _serve(repo: Path) -> tuple[subprocess.Popen[bytes], str]:
    port = free_port()
    proc = subprocess.Popen(
        [sys.executable, "-m", "service", "--model-repository", str(repo), "--http-port", "-1",
        "--grpc-port",
         str(port), "--metrics-port", "-1", "--poll-seconds", "0", "--log-format", "text"],
        cwd=ROOT, env=child_env(), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    target = f"127.0.0.1:{port}"
    deadline = time.monotonic() + 120
    with grpc.insecure_channel(target) as channel:
        stub = pb_grpc.EmbeddingServiceStub(channel)
        while True:
            try:
                if stub.ListModels(pb.ListModelsRequest(), timeout=2).models:
                    break
            except grpc.RpcError:
                pass  # not listening yet
            if time.monotonic() > deadline or proc.poll() is not None:
                proc.kill()
                raise RuntimeError("server did not load its model")
            time.sleep(0.2)
    return proc, target


def _throughput(target: str, model: str, rows: int, dtype: pb.DType,
                n: int) -> dict[str, float]:
    """One client, Embed T=1024 back to back: median latency and tokens/s."""
    rng = np.random.default_rng(1)
    requests = [pb.EmbedRequest(model=model, dtype=dtype, token_ids=pb.TokenIds(
        ids=rng.integers(0, rows, T).tolist())) for _ in range(8)]
    options = [("grpc.max_receive_message_length", 64 << 20)]
    with grpc.insecure_channel(target, options=options) as channel:
        embed = pb_grpc.EmbeddingServiceStub(channel).Embed
        for r in requests:  # warm-up
            embed(r)
        times = []
        for i in range(n):
            t0 = time.perf_counter()
            embed(requests[i % len(requests)])
            times.append(time.perf_counter() - t0)
    median = float(np.median(times))
    return {"median_ms": median * 1e3, "p90_ms": float(np.percentile(times, 90)) * 1e3,
            "tokens_per_s": T / median}


def main(argv: list[str] | None = None) -> None:
    """Write both tables, measure start-up, RSS and T=1024 throughput, print a table."""
    p = argparse.ArgumentParser(prog="python -m bench.big_table", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--requests", type=int, default=100)
    p.add_argument("--dir", type=Path, default=Path(tempfile.gettempdir()) / "embed-big-table")
    p.add_argument("--out", type=Path, default=ROOT / "bench" / "results")
    args = p.parse_args(argv)
    results: dict[str, Any] = {}
    for name, (rows, C, dtype, _, _) in TABLES.items():
        repo = args.dir / name
        table_mb = _write(repo, name) / 2**20
        startup = _startup(repo)
        proc, target = _serve(repo)
        try:
            dtypes = [pb.DTYPE_BFLOAT16] if dtype == torch.bfloat16 else [
                pb.DTYPE_FLOAT32, pb.DTYPE_BFLOAT16]
            runs = {pb.DType.Name(d): _throughput(target, name, rows, d, args.requests)
                    for d in dtypes}
            rss = _rss_mb(proc.pid)
        finally:
            proc.terminate()
            proc.wait(timeout=30)
        results[name] = {"rows": rows, "C": C, "storage": str(dtype).removeprefix("torch."),
                         "table_mb": table_mb, "startup_s": startup, "rss_mb": rss,
                         "rss_limit_mb": table_mb + 300, "throughput": runs}
    print(f"{'table':<8} {'rows x C':>14} {'storage':>9} {'MB':>6} {'start-up s':>10} "
          f"{'RSS MB':>7} {'out':>9} {'median ms':>9} {'tokens/s':>10}")
    for name, r in results.items():
        for out, t in r["throughput"].items():
            print(f"{name:<8} {r['rows']:>7} x {r['C']:<5} {r['storage']:>9} "
                  f"{r['table_mb']:>6.0f} {r['startup_s']:>10.2f} {r['rss_mb']:>7.0f} "
                  f"{out.removeprefix('DTYPE_').lower():>9} {t['median_ms']:>9.2f} "
                  f"{t['tokens_per_s']:>10.0f}")
    for name, r in results.items():
        ok = r["startup_s"] <= 2 and r["rss_mb"] <= r["rss_limit_mb"]
        print(f"{name}: start-up {r['startup_s']:.2f} s (<= 2 s), RSS {r['rss_mb']:.0f} MB "
              f"(<= {r['rss_limit_mb']:.0f} MB): {'MET' if ok else 'NOT MET'}")
    args.out.mkdir(parents=True, exist_ok=True)
    results["load_avg"] = os.getloadavg()
    (args.out / "big_table.json").write_text(json.dumps(results, indent=2))
    print(f"wrote {args.out / 'big_table.json'}")


if __name__ == "__main__":
    main()

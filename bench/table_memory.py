"""Start-up time and memory of the served tables: a GPT-2-size checkpoint (50257 x 768
fp32 token table + 1024 x 768 position table, 158 MB) served by ``python -m service
--workers N``.

    .venv/bin/python -m bench.table_memory [--workers 1 2] [--rows 50257 --dim 768]

For each N: seconds from spawning the server to health SERVING, then each worker's RSS,
anonymous RSS, file-backed RSS and PSS (from /proc/<pid>/smaps_rollup) at SERVING and
after every table row has been served by it (8 connections, each sweeping every row, so
the kernel's SO_REUSEPORT spread reaches every worker). The page cache is warm (the
checkpoint was just written), as on a restart.
"""

from __future__ import annotations

import argparse
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import grpc
import torch
from grpc_health.v1 import health_pb2, health_pb2_grpc

from bench.servers import child_env
from genproto.embedding.v1 import embedding_pb2 as pb
from genproto.embedding.v1 import embedding_pb2_grpc as pb_grpc
from service.format.writer import write_checkpoint
from service.format.tokenizer import default_ranks_path, gpt2_spec

VOCAB = 50257
SEQ = 1024


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def _rollup(pid: int) -> dict[str, int]:
    """smaps_rollup fields in MB."""
    out: dict[str, int] = {}
    for line in Path(f"/proc/{pid}/smaps_rollup").read_text().splitlines()[1:]:
        key, _, rest = line.partition(":")
        out[key] = int(rest.split()[0]) // 1024
    return out


def _workers(parent: int, n: int) -> list[int]:
    if n == 1:
        return [parent]
    children = Path(f"/proc/{parent}/task/{parent}/children").read_text().split()
    return [int(c) for c in children  # the workers, not multiprocessing's resource tracker
            if b"resource_tracker" not in Path(f"/proc/{c}/cmdline").read_bytes()]


def _serving(target: str, deadline: float) -> None:
    with grpc.insecure_channel(target) as ch:
        stub = health_pb2_grpc.HealthStub(ch)
        while time.monotonic() < deadline:
            try:
                if stub.Check(health_pb2.HealthCheckRequest(), timeout=1).status == \
                        health_pb2.HealthCheckResponse.SERVING:
                    return
            except grpc.RpcError:
                pass
            time.sleep(0.02)
    raise TimeoutError("server did not become SERVING")


def _sweep(target: str, rows: int) -> None:
    """Every row of the token table, through one new connection."""
    options = [("grpc.use_local_subchannel_pool", 1), ("grpc.max_receive_message_length", 64 << 20)]
    with grpc.insecure_channel(target, options=options) as ch:
        stub = pb_grpc.EmbeddingServiceStub(ch)
        for start in range(0, rows, 8 * SEQ):
            inputs = [pb.EmbedInput(token_ids=pb.TokenIds(ids=list(range(s, min(s + SEQ, rows)))))
                      for s in range(start, min(start + 8 * SEQ, rows), SEQ)]
            stub.EmbedBatch(pb.EmbedBatchRequest(inputs=inputs), timeout=60)


def _line(label: str, pid: int) -> str:
    r = _rollup(pid)
    return (f"  {label:28s} RSS {r['Rss']:5d} MB  anon {r['Anonymous']:5d} MB  "
            f"file {r['Rss'] - r['Anonymous']:5d} MB  "
            f"PSS {r['Pss']:5d} MB")


def main() -> None:
    """Measure each worker count and print the table."""
    p = argparse.ArgumentParser()
    p.add_argument("--workers", type=int, nargs="+", default=[1, 2])
    p.add_argument("--rows", type=int, default=VOCAB)
    p.add_argument("--dim", type=int, default=768)
    args = p.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        repo = Path(tmp)
        g = torch.Generator().manual_seed(0)
        write_checkpoint(repo / "gpt2" / "1",
                         token_table=torch.randn(args.rows, args.dim, generator=g),
                         position_table=torch.randn(SEQ, args.dim, generator=g),
                         position="learned", max_seq_len=SEQ, vocab_size=VOCAB,
                         tokenizer_spec=gpt2_spec(), tokenizer_ranks=default_ranks_path())
        size = sum(f.stat().st_size for f in (repo / "gpt2" / "1").iterdir()) >> 20
        print(f"checkpoint {args.rows} x {args.dim} fp32: {size} MB on disk")
        for n in args.workers:
            port = _free_port()
            target = f"127.0.0.1:{port}"
            env = {**child_env(), "EMBED_LOG_FORMAT": "text"}
            t0 = time.monotonic()
            proc = subprocess.Popen(
                [sys.executable, "-m", "service", "--model-repository", str(repo),
                 "--grpc-port", str(port), "--http-port", "-1", "--metrics-port", "-1",
                 "--poll-seconds", "0",
                 "--device", "cpu", "--workers", str(n)], env=env,
                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            try:
                _serving(target, t0 + 120)
                if n > 1:  # every worker up: each one answers a new connection
                    time.sleep(1.0)
                print(f"--workers {n}: SERVING after {time.monotonic() - t0:.2f} s "
                      f"(process start, imports and table load)")
                pids = _workers(proc.pid, n)
                for i, pid in enumerate(pids):
                    print(_line(f"worker {i} at SERVING", pid))
                for _ in range(8 if n > 1 else 1):
                    _sweep(target, VOCAB)
                for i, pid in enumerate(pids):
                    print(_line(f"worker {i} after every row", pid))
            finally:
                proc.terminate()
                proc.wait(30)


if __name__ == "__main__":
    main()

"""The memory suite: start-up and resident memory of the real server for a GPT-2-size and a
Llama-3-size table: start-up from the port accepting connections to SERVING (best of
three; the interpreter's imports excluded), RSS and PSS after T=1024 requests, then each
worker's PSS with ``--workers 2`` (the parent shares one copy of the table with them).
"""

from __future__ import annotations

import time
from dataclasses import replace
from pathlib import Path
from typing import Any

import grpc
import numpy as np

from bench.harness.checkpoint import GPT2, LLAMA3, MODEL_NAME, Shape, ensure_model
from bench.harness.config import BenchConfig
from bench.harness.launch import (
    MAX_MESSAGE_BYTES,
    launch_service,
    memory_mb,
    stop,
    wait_listening,
    wait_serving,
    worker_pids,
)
from bench.harness.report import SuiteResult, Target
from genproto.embedding.v1 import embedding_pb2 as pb
from genproto.embedding.v1 import embedding_pb2_grpc as pb_grpc

__all__ = ["run"]

STARTUP_S, RSS_SLACK_MB = 2.0, 300.0


def _traffic(target: str, shape: Shape, n: int) -> None:
    """``n`` sequential Embed requests of T=min(1024, max_seq_len) ids in the table's dtype."""
    T = min(1024, shape.max_seq_len)
    dtype = pb.DTYPE_BFLOAT16 if shape.dtype == "bfloat16" else pb.DTYPE_FLOAT32
    ids = np.random.default_rng(0).integers(0, shape.rows, (8, T)).tolist()
    options = [("grpc.max_receive_message_length", MAX_MESSAGE_BYTES)]
    with grpc.insecure_channel(target, options=options) as channel:
        embed = pb_grpc.EmbeddingServiceStub(channel).Embed
        for i in range(n):
            embed(pb.EmbedRequest(model=MODEL_NAME, dtype=dtype,
                                  token_ids=pb.TokenIds(ids=ids[i % 8])), timeout=120)


def _one_worker(repo: Path, shape: Shape, log_dir: Path, n: int) -> dict[str, float]:
    """Start-up seconds, then RSS and PSS (MiB) after ``n`` requests, of one server."""
    server = launch_service("memory-w1", repo, log_dir)
    try:
        listening = wait_listening(server)
        startup = wait_serving(server) - listening
        _traffic(server.target, shape, n)
        return {"startup_s": startup, "rss_mb": memory_mb(server.proc.pid),
                "pss_mb": memory_mb(server.proc.pid, "Pss")}
    finally:
        stop([server])


def _two_workers(repo: Path, shape: Shape, log_dir: Path, n: int) -> dict[str, Any]:
    server = launch_service("memory-w2", repo, log_dir, "--workers", "2")
    try:
        wait_serving(server)
        deadline = time.monotonic() + 120  # SERVING is one worker: wait for the other too
        while server.log.read_text().count(" serving ") < 2 and time.monotonic() < deadline:
            time.sleep(0.1)
        for _ in range(4):  # fresh connections: SO_REUSEPORT spreads them over the workers
            _traffic(server.target, shape, max(1, n // 4))
        pss = [memory_mb(pid, "Pss") for pid in worker_pids(server.proc.pid)]
        return {"worker_pss_mb": pss, "parent_pss_mb": memory_mb(server.proc.pid, "Pss"),
                "total_pss_mb": sum(pss) + memory_mb(server.proc.pid, "Pss")}
    finally:
        stop([server])


def run(cfg: BenchConfig, log: Any = print) -> SuiteResult:
    tables = {"gpt2": GPT2, "llama3": LLAMA3}
    tries, n = 3, 100
    if cfg.quick:
        tables = {"gpt2": replace(GPT2, dim=8, max_seq_len=64),
                  "llama3": replace(LLAMA3, rows=4096, dim=64, max_seq_len=1024)}
        tries, n = 1, 4
    log_dir = cfg.out / "logs"
    report: dict[str, Any] = {}
    targets, lines = [], []
    for name, shape in tables.items():
        repo = ensure_model(cfg.out / ".tables" / name, shape)
        runs = [_one_worker(repo, shape, log_dir, n) for _ in range(tries)]
        best = min(runs, key=lambda r: r["startup_s"])
        table_mb = round(shape.table_bytes / 2**20)
        two = _two_workers(repo, shape, log_dir, n)
        report[name] = {"shape": shape.__dict__, "table_mb": table_mb, "one_worker": runs,
                        "two_workers": two}
        lines.append(f"{name} ({shape.rows} x {shape.dim} {shape.dtype}, {table_mb:.0f} MiB): "
                     f"start-up {best['startup_s']:.2f} s, RSS {runs[-1]['rss_mb']:.0f} MiB, "
                     f"PSS {runs[-1]['pss_mb']:.0f} MiB; --workers 2: PSS per worker "
                     f"{[round(x) for x in two['worker_pss_mb']]} MiB, with the parent "
                     f"{two['total_pss_mb']:.0f} MiB")
        targets += [Target(f"{name}: start-up s (load, verify, SERVING)", best["startup_s"],
                           "<=", STARTUP_S),
                    Target(f"{name}: RSS MiB after traffic", runs[-1]["rss_mb"], "<=",
                           table_mb + RSS_SLACK_MB)]
        log(f"memory: {name} done")
    return SuiteResult("memory", report, "\n".join(lines), targets)

"""One benchmark run: model, three servers, interleaved repetitions, table, JSON and PNG.

Repetitions are interleaved (all cells of repetition 1, then all of repetition 2, ...),
and within a repetition the ceiling, naive and service measurements of a point run back
to back, so slow drift on the machine lands on all three alike.
"""

from __future__ import annotations

import asyncio
import json
import os
import platform
import random
import subprocess
import sys
import time
from collections.abc import Sequence
from datetime import UTC, datetime
from typing import Any

from bench.config import BenchConfig, Cell, parse_args
from bench.loadgen import DTYPE_ENUM, measure
from bench.model import MODEL_NAME, VOCAB_SIZE, ensure_model
from bench.plot import plot_report
from bench.report import build_report, format_report
from bench.servers import start_servers, stop_servers
from bench.window import Measurement
from genproto.embedding.v1 import embedding_pb2 as pb
from training.plot import PlotsUnavailable

__all__ = ["main", "run_bench"]

# Distinct requests cycled per cell: enough that no layer can serve a cached reply.
_REQUESTS_PER_CELL = 8


def _requests(cell: Cell, rng: random.Random, corpus: Sequence[int] | None
              ) -> list[pb.EmbedRequest]:
    def ids() -> list[int]:
        if corpus is None:
            return [rng.randrange(VOCAB_SIZE) for _ in range(cell.T)]
        start = rng.randrange(len(corpus) - cell.T)
        return list(corpus[start: start + cell.T])

    return [pb.EmbedRequest(model=MODEL_NAME, dtype=DTYPE_ENUM[cell.dtype],
                            token_ids=pb.TokenIds(ids=ids()))
            for _ in range(_REQUESTS_PER_CELL)]


def _commit() -> str:
    """The measured code: HEAD, with '+dirty' when the working tree differs from it."""
    try:
        head = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True,
                              text=True, check=True).stdout.strip()
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"],
                               capture_output=True, text=True, check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown"
    return head + ("+dirty" if dirty else "")


def _meta(cfg: BenchConfig, started: float, load_before: float) -> dict[str, Any]:
    return {"commit": _commit(),"started": datetime.fromtimestamp(started, UTC).isoformat(),
            "seconds": round(time.time() - started, 1), "host": platform.node(),
            "cpus": os.cpu_count(), "python": sys.version.split()[0],
            "device": cfg.device, "C": cfg.dim, "reps": cfg.reps, "ids": cfg.ids,
            "duration_s": cfg.duration_s, "warmup_s": cfg.warmup_s, "quick": cfg.quick,
            "glibc_tunables": os.environ.get("GLIBC_TUNABLES", ""),
            # Other work on the machine skews every figure; the 1-minute load says how much.
            "loadavg_before": round(load_before, 2), "loadavg_after": round(os.getloadavg()[0], 2)}


def run_bench(cfg: BenchConfig, log: Any = print) -> dict[str, Any]:
    """Run every cell ``cfg.reps`` times, interleaved; write bench.json and bench.png."""
    started, load_before = time.time(), os.getloadavg()[0]
    cfg.out.mkdir(parents=True, exist_ok=True)
    repo = ensure_model(cfg.model_cache, cfg.dim, cfg.max_seq_len)
    cells = cfg.cells()
    rng = random.Random(0)
    corpus = None
    if cfg.ids == "text":
        from training.data import default_corpus_ids  # tokenizer: only when asked for

        corpus = default_corpus_ids()
    requests = {cell: _requests(cell, rng, corpus) for cell in cells}
    results: dict[Cell, list[Measurement]] = {cell: [] for cell in cells}
    servers = start_servers(cfg, repo, cfg.out / "logs")
    log(f"bench: {len(cells)} cells x {cfg.reps} reps, ~{cfg.duration_s + cfg.warmup_s:.1f}s "
        f"each; servers up in {time.time() - started:.1f}s")
    try:
        for rep in range(cfg.reps):
            t0 = time.time()
            for cell in cells:
                m = asyncio.run(measure(servers[cell.backend].target, cell.backend, cell.mode,
                                        requests[cell], cell.concurrency, (cell.T, cfg.dim),
                                        cfg.warmup_s, cfg.duration_s))
                if m.requests == 0:
                    raise RuntimeError(f"{cell.key}: no reply completed in {cfg.duration_s}s")
                results[cell].append(m)
            log(f"bench: repetition {rep + 1}/{cfg.reps} done in {time.time() - t0:.0f}s")
    finally:
        stop_servers(servers)
    report = build_report(cfg, results, _meta(cfg, started, load_before))
    (cfg.out / "bench.json").write_text(json.dumps(report, indent=1))
    try:
        plot_report(report, cfg.out / "bench.png")
    except PlotsUnavailable as e:  # the JSON and the printed table are the result
        print(f"bench: no bench.png: {e}", file=sys.stderr)
    return report


def main(argv: Sequence[str] | None = None) -> None:
    """``python -m bench [--quick] ...``: run, print the table and the target verdicts."""
    cfg = parse_args(argv)
    report = run_bench(cfg)
    print(format_report(report))
    print(f"\nwrote {cfg.out / 'bench.json'} and {cfg.out / 'bench.png'}")

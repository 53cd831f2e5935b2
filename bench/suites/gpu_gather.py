"""The lookup's bandwidth on the tables' device against that device's own copy ceiling.

    python -m bench.suites.gpu_gather [--device cuda] [--reps 20] [--out gather.json]

Issue 28's GPU item: how close the service's device half (``EmbeddingTables.device_rows``:
gather, add, cast) and the whole ``embed_into`` (that, one D2H copy into pinned memory,
one copy into the response) come to the memory they run on. Per table (GPT-2: 50257 x 768
fp32; Llama-3: 128256 x 4096 bf16) and batch (1 x 16, 1 x 1024 and 16 x 1024 tokens,
random ids; the 16-token answer shows the fixed cost per batch):

- ``copy``: a device-to-device copy of the answer's bytes: the HBM ceiling, in this run;
- ``gather``: ``token_table[ids]`` alone;
- ``device``: ``EmbeddingTables.device_rows``, gather + position add in the answer's (the
  table's) dtype;
- ``d2h``: the answer's bytes into pinned host memory: the link's ceiling;
- ``embed_into``: the engine's whole call, answers written into host tensors.

Each figure is a median over ``--reps`` timed runs (CUDA events on CUDA), as GB/s of bytes
moved (read + written) and as a ratio to ``copy``. On CPU it runs too (the tests' smoke run);
its figures are then DRAM's and mean little beside bench.cpu_profile.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from collections.abc import Callable
from pathlib import Path

import torch

from service.engine.tables import COMPOSE_TOKEN_PLUS_POSITION, EmbeddingTables

__all__ = ["TABLES", "main", "measure", "median_seconds"]

# name -> (rows, C, table dtype, position rows)
TABLES: dict[str, tuple[int, int, torch.dtype, int]] = {
    "gpt2": (50257, 768, torch.float32, 1024),
    "llama3": (128256, 4096, torch.bfloat16, 1024),
}


def median_seconds(fn: Callable[[], object], device: torch.device, reps: int) -> float:
    """Median seconds of one ``fn()`` over ``reps`` runs, after two warm-ups; on a CUDA
    ``device`` by CUDA events on the current stream (what the device spent, not what the
    host waited)."""
    for _ in range(2):
        fn()
    times = []
    for _ in range(reps):
        if device.type == "cuda":
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            fn()
            end.record()
            end.synchronize()
            times.append(start.elapsed_time(end) / 1e3)
        else:
            t0 = time.perf_counter()
            fn()
            times.append(time.perf_counter() - t0)
    return statistics.median(times)


def measure(name: str, device: torch.device, batch: int, T: int, reps: int,
            scale: int = 1) -> dict[str, object]:
    """One table and batch: each stage's median seconds, GB/s and ratio to ``copy``.

    ``scale`` divides the table's rows (tests use a small table; figures are per byte).
    """
    rows, C, dtype, P = TABLES[name]
    rows //= scale
    gen = torch.Generator().manual_seed(0)
    token_table = torch.randn(rows, C, generator=gen).to(dtype)  # (rows, C)
    position_table = torch.randn(P, C, generator=gen).to(dtype)  # (P, C)
    tables = EmbeddingTables(token_table, position_table, device, table_dtype=None)
    N = batch * T
    ids = torch.randint(0, rows, (N,), generator=gen)  # (N,) host ids, as a request's
    positions = torch.arange(T).repeat(batch)  # (N,)
    idx_dev = torch.stack((ids, positions)).to(device)  # (2, N), as _embed_device sends it
    answer = N * C * dtype.itemsize  # bytes of the answer, in the table dtype
    src = torch.empty(N, C, dtype=dtype, device=device)
    dst = torch.empty_like(src)
    pinned = torch.empty(N, C, dtype=dtype, pin_memory=device.type == "cuda")
    outs = [torch.empty(T, C, dtype=dtype) for _ in range(batch)]
    host_ids = ids.numpy()  # (N,): the engine hands the tables numpy ids
    parts = [(host_ids[i * T:(i + 1) * T], [(0, T)], outs[i]) for i in range(batch)]
    tt = tables.token_table

    stages: dict[str, tuple[Callable[[], object], int]] = {
        "copy": (lambda: dst.copy_(src), 2 * answer),
        "gather": (lambda: torch.index_select(tt, 0, idx_dev[0]), 2 * answer),
        "device": (lambda: tables.device_rows(idx_dev, COMPOSE_TOKEN_PLUS_POSITION, dtype),
                   3 * answer),  # two row reads, one write
        "d2h": (lambda: pinned.copy_(src), 2 * answer),
        "embed_into": (lambda: tables.embed_into(parts, COMPOSE_TOKEN_PLUS_POSITION),
                       3 * answer),
    }
    result: dict[str, object] = {"table": name, "rows": rows, "C": C, "dtype": str(dtype),
                                 "batch": batch, "T": T, "answer_bytes": answer}
    ceiling = 0.0
    for stage, (fn, moved) in stages.items():
        s = median_seconds(fn, device, reps)
        gbs = moved / s / 1e9
        ceiling = ceiling or gbs
        result[stage] = {"median_us": round(s * 1e6, 1), "GB_per_s": round(gbs, 1),
                         "vs_copy": round(gbs / ceiling, 3)}
    expected = torch.stack([token_table[ids[i * T:(i + 1) * T]].float() + position_table[:T].float()
                            for i in range(batch)]).to(dtype)  # (batch, T, C), the reference
    result["exact"] = all(torch.equal(outs[i], expected[i]) for i in range(batch))
    return result


def main(argv: list[str] | None = None) -> int:
    """Run every table and batch; print a table, write JSON; exit 1 if an answer is off."""
    p = argparse.ArgumentParser(prog="python -m bench.suites.gpu_gather", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--reps", type=int, default=20, help="timed runs per stage (median)")
    p.add_argument("--cases", nargs="+", default=["1x16", "1x1024", "16x1024"],
                   help="BATCHxT: sequences per call and tokens per sequence")
    p.add_argument("--scale", type=int, default=1, help="divide the tables' rows (smoke runs)")
    p.add_argument("--out", type=Path, help="write the results as JSON here")
    args = p.parse_args(argv)
    device = torch.device(args.device)
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu"
    print(f"gather bandwidth on {name}, medians of {args.reps}; GB/s (ratio to copy)")
    print(f"{'table':7} {'case':>7} {'MiB':>6} " + " ".join(
        f"{s:>17}" for s in ("copy", "gather", "device", "d2h", "embed_into")) + "  exact")
    results = []
    for table in TABLES:
        for case in args.cases:
            batch, T = (int(v) for v in case.split("x"))
            r = measure(table, device, batch, T, args.reps, args.scale)
            results.append(r)
            cells = " ".join(f"{r[s]['GB_per_s']:>9.1f} ({r[s]['vs_copy']:.2f})"  # type: ignore[index]
                             for s in ("copy", "gather", "device", "d2h", "embed_into"))
            print(f"{table:7} {case:>7} {int(r['answer_bytes']) / 2**20:>6.2f} {cells}"  # type: ignore[call-overload]
                  f"  {r['exact']}", flush=True)
    if args.out:
        args.out.write_text(json.dumps({"device": name, "results": results}, indent=1))
    return 0 if all(r["exact"] for r in results) else 1


if __name__ == "__main__":
    raise SystemExit(main())

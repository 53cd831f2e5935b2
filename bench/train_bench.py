"""Training throughput: tokens/s and model FLOPs utilisation (MFU) of one small GPT, and the
step time of a 50257-row token table trained with dense vs sparse gradients.

    .venv/bin/python -m bench.train_bench [--steps 6] [--out bench/results/train_bench.json]

MFU = achieved model FLOP/s / peak FLOP/s. Model FLOPs per token follow PaLM (appendix B):
6 * N (N = parameters used in matmuls: the blocks and the untied LM head; the token and
position tables are gathers, not matmuls) + 12 * n_layer * n_embd * T for attention. The
peak is measured in the same run: the best of a few large fp32 matmuls on the same threads,
so MFU is relative to what this machine really reaches, not to a datasheet.

Batches are windows of the default corpus (``pydoc_data.topics``) tokenised with GPT-2, so
the number of distinct rows per step (what a sparse update touches) is realistic.
Re-executes once with the server's malloc tunables (see ARCHITECTURE.md: a training step's
multi-MB logits are otherwise page-faulted in again every step); ``--malloc default`` skips.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import torch
from torch import nn

from bench.servers import GLIBC_TUNABLES
from service.tokenizer import default_ranks_path, gpt2_spec, load_tokenizer
from training.model import GPT, ModelConfig

__all__ = ["Batch", "batches", "corpus_ids", "flops_per_token", "main", "matmul_params",
           "peak_matmul_flops",
           "table_step_seconds", "train_step_seconds"]

MODEL = ModelConfig()  # the stated config: 2 layers, 4 heads, C=128, T=128, 50304 rows
BATCH_SIZE = 8
TABLE_ROWS = 50257  # the sparse/dense comparison uses GPT-2's unpadded vocabulary
TABLE_DIMS = (128, 768)  # our small C, and GPT-2 small's


def corpus_ids() -> torch.Tensor:
    """The default corpus as GPT-2 token ids, (N,) int64 (local ranks file, no network)."""
    from pydoc_data.topics import topics

    tokenizer = load_tokenizer(gpt2_spec(), default_ranks_path())
    text = "\n\n".join(topics[k] for k in sorted(topics))
    return torch.tensor(tokenizer.encode(text), dtype=torch.int64)


Batch = tuple[torch.Tensor, torch.Tensor]  # inputs (B, T), targets (B, T)


def batches(ids: torch.Tensor, n: int, B: int, T: int, seed: int = 0) -> list[Batch]:
    """n random windows of the corpus as (inputs, targets), targets shifted by one."""
    gen = torch.Generator().manual_seed(seed)
    starts = torch.randint(0, len(ids) - T - 1, (n, B), generator=gen)
    windows = [torch.stack([ids[s:s + T + 1] for s in row.tolist()]) for row in starts]
    return [(w[:, :-1].contiguous(), w[:, 1:].contiguous()) for w in windows]  # (B, T) each


def _sync(device: torch.device) -> None:
    if device.type == "cuda":  # kernels are asynchronous: time them, not their launch
        torch.cuda.synchronize(device)


def peak_matmul_flops(device: torch.device, n: int = 2048, reps: int = 5) -> float:
    """The best fp32 FLOP/s of an (n x n) @ (n x n) matmul: the ceiling for MFU."""
    if device.type == "cuda":
        n = 8192  # a 2048 matmul is too short to fill a datacentre GPU
    a, b = torch.randn(n, n, device=device), torch.randn(n, n, device=device)
    out = torch.empty(n, n, device=device)
    torch.mm(a, b, out=out)  # warm the kernels and the output pages
    best = float("inf")
    for _ in range(reps):
        _sync(device)
        t0 = time.perf_counter()
        torch.mm(a, b, out=out)
        _sync(device)
        best = min(best, time.perf_counter() - t0)
    return 2 * n**3 / best


def matmul_params(model: GPT) -> int:
    """Parameters that take part in matmuls: all but the token and position tables."""
    tables = {id(p) for p in model.embedding_parameters()}
    return sum(p.numel() for p in model.parameters() if id(p) not in tables)


def flops_per_token(cfg: ModelConfig, n_matmul: int) -> float:
    """Training FLOPs per token, forward + backward (PaLM's 6N + 12 L C T)."""
    return 6 * n_matmul + 12 * cfg.n_layer * cfg.n_embd * cfg.block_size


def _timed(step: Callable[[int], None], steps: int, warmup: int,
           device: torch.device) -> list[float]:
    times = []
    for i in range(warmup + steps):
        _sync(device)
        t0 = time.perf_counter()
        step(i)
        _sync(device)
        if i >= warmup:
            times.append(time.perf_counter() - t0)
    return times


def train_step_seconds(cfg: ModelConfig, data: Sequence[Batch], steps: int, warmup: int,
                       device: torch.device) -> list[float]:
    """Seconds per full training step (forward, backward, optimizer) after warmup."""
    torch.manual_seed(0)
    model = GPT(cfg).to(device).train()
    tables = model.embedding_parameters()
    table_ids = {id(p) for p in tables}
    rest = [p for p in model.parameters() if id(p) not in table_ids]
    optimizers: list[torch.optim.Optimizer]
    if cfg.sparse_embeddings:  # AdamW rejects sparse gradients; SparseAdam is lazy Adam
        optimizers = [torch.optim.SparseAdam(tables, lr=3e-4),
                      torch.optim.AdamW(rest, lr=3e-4, weight_decay=0.1)]
    else:
        optimizers = [torch.optim.AdamW([{"params": tables, "weight_decay": 0.0},
                                         {"params": rest, "weight_decay": 0.1}], lr=3e-4)]

    def step(i: int) -> None:
        inputs, targets = data[i % len(data)]  # (B, T) each
        _, loss = model(inputs, targets)
        assert loss is not None
        loss.backward()
        for opt in optimizers:
            opt.step()
            opt.zero_grad(set_to_none=True)

    return _timed(step, steps, warmup, device)


def table_step_seconds(rows: int, dim: int, data: Sequence[Batch], sparse: bool,
                       steps: int, warmup: int, device: torch.device) -> list[float]:
    """Seconds per step of the token table alone: lookup, backward, optimizer step."""
    torch.manual_seed(0)
    table = nn.Embedding(rows, dim, sparse=sparse, device=device)
    opt: torch.optim.Optimizer = (torch.optim.SparseAdam(table.parameters(), lr=3e-4) if sparse
                                  else torch.optim.AdamW(table.parameters(), lr=3e-4,
                                                         weight_decay=0.0))
    upstream = torch.randn(*data[0][0].shape, dim, device=device)  # (B, T, C): stand-in grad

    def step(i: int) -> None:
        x = table(data[i % len(data)][0])  # (B, T, C)
        (x * upstream).sum().backward()
        opt.step()
        opt.zero_grad(set_to_none=True)

    return _timed(step, steps, warmup, device)


def _median_ms(times: list[float]) -> float:
    return 1e3 * statistics.median(times)


def main(argv: Sequence[str] | None = None) -> int:
    """Run both measurements, print a table, write the JSON report."""
    p = argparse.ArgumentParser(prog="python -m bench.train_bench", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--device", default="cpu", help="cpu | cuda[:N]")
    p.add_argument("--threads", type=int, help="torch CPU threads (default: torch's choice)")
    p.add_argument("--steps", type=int, default=5, help="timed model steps per variant")
    p.add_argument("--table-steps", type=int, default=10, help="timed table steps per variant")
    p.add_argument("--warmup", type=int, default=2)
    p.add_argument("--malloc", choices=["tunables", "default"], default="tunables")
    p.add_argument("--out", type=Path, default=Path("bench/results/train_bench.json"))
    args = p.parse_args(argv)
    if args.malloc == "tunables" and "GLIBC_TUNABLES" not in os.environ:
        os.environ["GLIBC_TUNABLES"] = GLIBC_TUNABLES  # read by glibc only at process start
        os.execv(sys.executable, [sys.executable, "-m", "bench.train_bench",
                                  *(sys.argv[1:] if argv is None else argv)])

    if args.threads:  # 1 thread is robust to other load: no parallel region waits on a straggler
        torch.set_num_threads(args.threads)
    started = time.perf_counter()
    ids = corpus_ids()
    T = MODEL.block_size
    device = torch.device(args.device)
    data = [(x.to(device), y.to(device)) for x, y in batches(ids, 4, BATCH_SIZE, T)]
    peak = peak_matmul_flops(device)
    report: dict[str, Any] = {
        "machine": {"device": str(device), "cpu": platform.processor() or platform.machine(),
                    "cpu_count": os.cpu_count(),
                    "gpu": torch.cuda.get_device_name(device) if device.type == "cuda" else "",
                    "torch_threads": torch.get_num_threads(), "torch": torch.__version__,
                    "glibc_tunables": os.environ.get("GLIBC_TUNABLES", ""),
                    "tf32": torch.backends.cuda.matmul.allow_tf32,
                    "load_average_at_start": os.getloadavg()},  # other work skews CPU figures
        "peak_fp32_matmul_flops": peak, "corpus_tokens": len(ids),
        "batch": {"B": BATCH_SIZE, "T": T, "tokens_per_step": BATCH_SIZE * T,
                  "distinct_ids_per_step": statistics.median(
                      len(torch.unique(inputs)) for inputs, _ in data)},
        "model": [], "table": []}
    where = (torch.cuda.get_device_name(device) if device.type == "cuda"
             else f"{torch.get_num_threads()} CPU threads")
    print(f"peak fp32 matmul: {peak / 1e9:.1f} GFLOP/s on {where}")
    title = f"model (C={MODEL.n_embd}, L={MODEL.n_layer}, T={T}, B={BATCH_SIZE})"
    print(f"\n{title:<34}"
          f"{'step ms':>9}{'tokens/s':>10}{'GFLOP/s':>9}{'MFU':>7}")
    for sparse in (False, True):
        cfg = ModelConfig(**{**MODEL.__dict__, "sparse_embeddings": sparse})
        times = train_step_seconds(cfg, data, args.steps, args.warmup, device)
        n_matmul = matmul_params(GPT(cfg))
        tokens_per_s = BATCH_SIZE * T / statistics.median(times)
        achieved = flops_per_token(cfg, n_matmul) * tokens_per_s
        name = "sparse tables + SparseAdam" if sparse else "dense tables + AdamW"
        report["model"].append({
            "name": name, "config": dict(cfg.__dict__), "matmul_params": n_matmul,
            "flops_per_token": flops_per_token(cfg, n_matmul),
            "step_ms_median": _median_ms(times), "step_ms": [1e3 * t for t in times],
            "tokens_per_s": tokens_per_s, "achieved_flops": achieved, "mfu": achieved / peak})
        print(f"{name:<34}{_median_ms(times):>9.1f}{tokens_per_s:>10.0f}"
              f"{achieved / 1e9:>9.1f}{achieved / peak:>7.1%}")
    title = f"token table {TABLE_ROWS} rows, B*T={BATCH_SIZE * T}"
    print(f"\n{title:<34}"
          f"{'dense ms':>9}{'sparse ms':>10}{'speedup':>9}")
    for dim in TABLE_DIMS:
        dense, sparse_t = (table_step_seconds(TABLE_ROWS, dim, data, sparse, args.table_steps,
                                              args.warmup, device) for sparse in (False, True))
        speedup = statistics.median(dense) / statistics.median(sparse_t)
        report["table"].append({
            "rows": TABLE_ROWS, "dim": dim, "dense_adamw_ms_median": _median_ms(dense),
            "sparse_sparseadam_ms_median": _median_ms(sparse_t), "speedup": speedup})
        print(f"{f'C={dim}':<34}{_median_ms(dense):>9.2f}{_median_ms(sparse_t):>10.2f}"
              f"{speedup:>8.1f}x")
    report["wall_s"] = time.perf_counter() - started
    report["machine"]["load_average_at_end"] = os.getloadavg()
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(report, indent=2) + "\n")
    print(f"\nwrote {args.out} ({report['wall_s']:.0f} s; load average "
          f"{report['machine']['load_average_at_start'][0]:.1f} -> {os.getloadavg()[0]:.1f})")
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Training throughput: tokens/s and model FLOPs utilisation (MFU) of the training job's
default run, and the step time of a 50257-row token table with dense vs sparse gradients.

    .venv/bin/python -m training.bench [--threads 1] [--device cpu|cuda]     (make bench-train)
                                       [--out bench/results/train_bench.json]
    .venv/bin/python -m training.bench --preset anchor   # nanoGPT's small config, 600 steps
    .venv/bin/python -m training.bench --preset levers   # each speed lever on its own

The anchor and levers presets are training/bench/anchor.py's (read its docstring); the
nanogpt preset (per-step time beside nanoGPT's own train.py) is training/bench/nanogpt.py's.

The model step is training/train.py's: ``TrainConfig()`` defaults (shape and batch printed
in the table header), its ``build_optimizers`` and ``clip_grad_norm``; once with dense
tables + AdamW, once with ``sparse_embeddings`` (SparseAdam for the tables).

MFU = achieved model FLOP/s / peak FLOP/s. Model FLOPs per token are
``training.model.flops_per_token`` (PaLM, appendix B: 6 N + 12 L C T, N = parameters used
in matmuls; the input tables are gathers), the same definition the anchor preset uses. The
peak is measured in the same run: the best of a few large fp32 matmuls on the same threads,
so MFU is relative to what this machine really reaches, not to a datasheet.

Every figure is given per wall second and per process-CPU second. On a shared machine the
wall figures swell with other load; at ``--threads 1`` the CPU-time figures do not.

Batches are windows of the default corpus (``pydoc_data.topics``) tokenised with GPT-2, so
the number of distinct rows per step (what a sparse update touches) is realistic.
Re-executes once with the server's malloc tunables (see ARCHITECTURE.md: a training step's
multi-MB logits are otherwise page-faulted in again every step); ``--malloc default`` skips.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import platform
import statistics
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch
from torch import nn

from training.bench.anchor import run_anchor, run_levers
from training.bench.timing import Timing, peak_matmul_flops, timed
from training.config import TrainConfig
from training.data import default_corpus_ids
from training.malloc import TUNABLES as GLIBC_TUNABLES
from training.model import GPT, flops_per_token, matmul_params
from training.optim import build_optimizers, clip_grad_norm

__all__ = ["Batch", "batches", "main", "table_step_seconds", "train_step_seconds"]

VOCAB_SIZE = 50257  # GPT-2's n_vocab
TRAIN = TrainConfig()  # the training job's default run (the `make model` model)
MODEL = TRAIN.model_config(VOCAB_SIZE)  # 50304 table rows, untied head
BATCH_SIZE = TRAIN.batch_size
TABLE_ROWS = VOCAB_SIZE  # the sparse/dense comparison uses GPT-2's unpadded vocabulary
TABLE_DIMS = (128, 768)  # our small C, and GPT-2 small's


Batch = tuple[torch.Tensor, torch.Tensor]  # inputs (B, T), targets (B, T)


def batches(ids: torch.Tensor, n: int, B: int, T: int, seed: int = 0) -> list[Batch]:
    """n random windows of the corpus as (inputs, targets), targets shifted by one."""
    gen = torch.Generator().manual_seed(seed)
    starts = torch.randint(0, len(ids) - T - 1, (n, B), generator=gen)
    windows = [torch.stack([ids[s:s + T + 1] for s in row.tolist()]) for row in starts]
    return [(w[:, :-1].contiguous(), w[:, 1:].contiguous()) for w in windows]  # (B, T) each


def train_step_seconds(cfg: TrainConfig, data: Sequence[Batch], steps: int, warmup: int,
                       device: torch.device) -> Timing:
    """Seconds per training step as training/train.py takes it: forward, backward, gradient
    clipping, its optimizers (AdamW, plus SparseAdam for sparse tables)."""
    torch.manual_seed(0)
    model = GPT(cfg.model_config(VOCAB_SIZE)).to(device).train()
    optimizers = build_optimizers(model, cfg)
    params: list[torch.Tensor] = list(model.parameters())

    def step(i: int) -> None:
        inputs, targets = data[i % len(data)]  # (B, T) each
        _, loss = model(inputs, targets)
        assert loss is not None
        loss.backward()
        clip_grad_norm(params, cfg.grad_clip)
        for opt in optimizers:
            opt.step()
            opt.zero_grad(set_to_none=True)

    return timed(step, steps, warmup, device)


def table_step_seconds(rows: int, dim: int, data: Sequence[Batch], sparse: bool,
                       steps: int, warmup: int, device: torch.device) -> Timing:
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

    return timed(step, steps, warmup, device)


def _bench_model(data: Sequence[Batch], peak: tuple[float, float], args: argparse.Namespace,
                 device: torch.device) -> list[dict[str, Any]]:
    T = MODEL.block_size
    title = f"model (C={MODEL.n_embd}, L={MODEL.n_layer}, T={T}, B={BATCH_SIZE})"
    print(f"\n{title:<30}{'wall ms':>9}{'cpu ms':>9}{'tokens/s':>10}{'MFU':>7}{'MFU cpu':>9}")
    rows = []
    for sparse in (False, True):
        train_cfg = dataclasses.replace(TRAIN, sparse_embeddings=sparse)
        cfg = train_cfg.model_config(VOCAB_SIZE)
        t = train_step_seconds(train_cfg, data, args.steps, args.warmup, device)
        model = GPT(cfg)
        n_matmul, per_token = matmul_params(model), flops_per_token(model)
        tokens_per_s = BATCH_SIZE * T / t.wall_median
        model_flops = per_token * BATCH_SIZE * T  # per step
        mfu, mfu_cpu = model_flops / t.wall_median / peak[0], model_flops / t.cpu_median / peak[1]
        name = "sparse tables + SparseAdam" if sparse else "dense tables + AdamW"
        rows.append({"name": name, "config": dict(cfg.__dict__), "matmul_params": n_matmul,
                     "flops_per_token": per_token, **t.to_json(),
                     "tokens_per_s": tokens_per_s,
                     "tokens_per_cpu_s": BATCH_SIZE * T / t.cpu_median,
                     "mfu": mfu, "mfu_cpu_time": mfu_cpu})
        print(f"{name:<30}{1e3 * t.wall_median:>9.1f}{1e3 * t.cpu_median:>9.1f}"
              f"{tokens_per_s:>10.0f}{mfu:>7.1%}{mfu_cpu:>9.1%}")
    return rows


def _bench_table(data: Sequence[Batch], args: argparse.Namespace,
                 device: torch.device) -> list[dict[str, Any]]:
    title = f"token table {TABLE_ROWS} rows, B*T={BATCH_SIZE * MODEL.block_size}"
    print(f"\n{title:<30}{'dense ms':>9}{'sparse ms':>10}{'speedup':>9}{'cpu-time':>10}")
    rows = []
    for dim in TABLE_DIMS:
        dense, sparse = (table_step_seconds(TABLE_ROWS, dim, data, s, args.table_steps,
                                            args.warmup, device) for s in (False, True))
        speedup = dense.wall_median / sparse.wall_median
        speedup_cpu = dense.cpu_median / sparse.cpu_median
        rows.append({"rows": TABLE_ROWS, "dim": dim, "dense_adamw": dense.to_json(),
                     "sparse_sparseadam": sparse.to_json(), "speedup": speedup,
                     "speedup_cpu_time": speedup_cpu})
        print(f"{f'C={dim}':<30}{1e3 * dense.wall_median:>9.2f}{1e3 * sparse.wall_median:>10.2f}"
              f"{speedup:>8.1f}x{speedup_cpu:>9.1f}x")
    return rows


def main(argv: Sequence[str] | None = None) -> int:
    """Run both measurements, print tables, write the JSON report."""
    p = argparse.ArgumentParser(prog="python -m training.bench", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--device", default="cpu", help="cpu | cuda[:N]")
    p.add_argument("--threads", type=int, help="torch CPU threads (default: torch's choice)")
    p.add_argument("--steps", type=int, default=5, help="timed model steps per variant")
    p.add_argument("--table-steps", type=int, default=10, help="timed table steps per variant")
    p.add_argument("--warmup", type=int, default=2)
    p.add_argument("--malloc", choices=["tunables", "default"], default="tunables")
    p.add_argument("--out", type=Path, help="JSON report (default bench/results/<preset>.json)")
    p.add_argument("--preset", choices=["default", "anchor", "levers", "nanogpt"],
                   default="default",
                   help="default: the make-run model; anchor/levers: nanoGPT's small config")
    p.add_argument("--anchor-steps", type=int, default=600, help="anchor: whole-run steps")
    p.add_argument("--breakdown-steps", type=int, default=5, help="anchor: timed phase steps")
    p.add_argument("--rounds", type=int, default=3, help="levers: interleaved rounds")
    p.add_argument("--lever-steps", type=int, default=2, help="levers: steps per round")
    p.add_argument("--compile", action="store_true", help="levers: add torch.compile")
    p.add_argument("--nano-steps", type=int, default=30,
                   help="nanogpt: timed steps per process (after --warmup)")
    args = p.parse_args(argv)
    name = {"default": "train_bench", "anchor": "train_anchor", "levers": "train_levers",
            "nanogpt": "train_nanogpt"}
    args.out = args.out or Path(f"bench/results/{name[args.preset]}.json")
    if args.malloc == "tunables" and "GLIBC_TUNABLES" not in os.environ:
        os.environ["GLIBC_TUNABLES"] = GLIBC_TUNABLES  # read by glibc only at process start
        os.execv(sys.executable, [sys.executable, "-m", "training.bench",
                                  *(sys.argv[1:] if argv is None else argv)])
    if args.preset == "nanogpt":  # every side runs in its own process, malloc set per side
        from training.bench.nanogpt import run_side_by_side

        run_side_by_side(args.rounds, args.nano_steps, args.warmup, args.out)
        return 0
    if args.threads:  # at 1 thread no parallel region waits on a preempted straggler
        torch.set_num_threads(args.threads)
    if args.preset == "levers":
        run_levers(args.rounds, args.lever_steps, args.out, args.compile)
        return 0
    if args.preset == "anchor":  # whole run first: nothing before it may raise peak RSS
        run_anchor(args.anchor_steps, args.breakdown_steps, args.out, args.threads or 0)
        return 0
    started = time.perf_counter()
    load_start = os.getloadavg()
    device = torch.device(args.device)
    ids = torch.tensor(default_corpus_ids(), dtype=torch.int64)  # (N,)
    data = [(x.to(device), y.to(device)) for x, y in batches(ids, 4, BATCH_SIZE, MODEL.block_size)]
    peak = peak_matmul_flops(device)
    where = (torch.cuda.get_device_name(device) if device.type == "cuda"
             else f"{torch.get_num_threads()} CPU threads")
    print(f"peak fp32 matmul on {where}: {peak[0] / 1e9:.1f} GFLOP/s "
          f"({peak[1] / 1e9:.1f} per CPU second)")
    report: dict[str, Any] = {
        "machine": {"device": str(device), "cpu": platform.processor() or platform.machine(),
                    "cpu_count": os.cpu_count(), "gpu": where if device.type == "cuda" else "",
                    "torch_threads": torch.get_num_threads(), "torch": torch.__version__,
                    "glibc_tunables": os.environ.get("GLIBC_TUNABLES", ""),
                    "tf32": torch.backends.cuda.matmul.allow_tf32,
                    "load_average_at_start": load_start},  # other work skews wall figures
        "peak_fp32_matmul_flops": peak[0], "peak_fp32_matmul_flops_per_cpu_s": peak[1],
        "corpus_tokens": len(ids),
        "batch": {"B": BATCH_SIZE, "T": MODEL.block_size,
                  "tokens_per_step": BATCH_SIZE * MODEL.block_size,
                  "distinct_ids_per_step": statistics.median(
                      len(torch.unique(inputs)) for inputs, _ in data)},
        "model": _bench_model(data, peak, args, device),
        "table": _bench_table(data, args, device)}
    report["wall_s"] = time.perf_counter() - started
    report["machine"]["load_average_at_end"] = os.getloadavg()
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(report, indent=2) + "\n")
    print(f"\nwrote {args.out} ({report['wall_s']:.0f} s; 1-min load average "
          f"{load_start[0]:.1f} -> {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores)")
    return 0


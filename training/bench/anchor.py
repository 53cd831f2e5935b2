"""The "anchor" preset of training.bench: nanoGPT's small config, side by side.

    .venv/bin/python -m training.bench --preset anchor   # whole run + breakdown + plot
    .venv/bin/python -m training.bench --preset levers   # each speed lever on its own

The config is nanoGPT's small run on the default corpus: 4 layers, 4 heads, C=128,
block 128, batch 16, no gradient accumulation, 600 steps, lr 1e-3 cosine to 1e-4 after
50 warmup steps, beta2 0.99, weight decay 0.1, tied head; val loss every 100 steps on the
whole val split. ``anchor`` first trains it exactly as ``python -m training`` does
(training.train.train, with its progress) and reports whole-run tokens/s (wall time from model
build to the last evaluation, evaluations included), peak RSS (VmHWM), MFU and the val
loss at the last step beside nanoGPT's figures measured on the same machine kind; then it
times one step in four phases (forward, head+loss, backward, optimizer) for the
reference path (full logits, F.cross_entropy, single-tensor AdamW) and the tuned one, and
plots them. ``levers`` alternates short runs of each variant (baseline + one change)
round by round, so both sides of every comparison see the same background load.
"""

from __future__ import annotations

import dataclasses
import json
import os
import resource
import statistics
import time
from pathlib import Path
from typing import Any

import torch

from training.bench.timing import peak_matmul_flops
from training.config import TrainConfig
from training.model import GPT, flops_per_token
from training.optim import build_optimizers, clip_grad_norm, lr_at
from training.plot import PlotsUnavailable, pyplot
from training.train import block_autocast

__all__ = ["ANCHOR", "NANOGPT", "PHASES", "REFERENCE", "lever_variants", "peak_rss_bytes",
           "plot_breakdown", "run_anchor", "run_levers", "step_breakdown"]

ANCHOR = TrainConfig(n_layer=4, n_head=4, n_embd=128, block_size=128, batch_size=16,
                     grad_accum=1, max_steps=600, lr=1e-3, min_lr_ratio=0.1, warmup_steps=50,
                     beta2=0.99, weight_decay=0.1, tie_weights=True, eval_every=100,
                     eval_tokens=1 << 20, export=False, name="anchor",
                     runs_dir="bench/results/runs")  # loss_chunk: DEFAULT_CHUNK = 512
# What this project did before issue 13: full logits + F.cross_entropy, single-tensor AdamW.
REFERENCE = dataclasses.replace(ANCHOR, loss_chunk=0, adamw_impl="single", head_precision="fp32")
TUNED = dataclasses.replace(ANCHOR, head_precision="fp32")  # chunk 512 + fused AdamW, fp32
BF16_HEAD = dataclasses.replace(ANCHOR, head_precision="bf16")
# nanoGPT at ANCHOR, measured on this machine kind (2 cores); the target is 2x untuned.
NANOGPT = {"tokens_per_s": 1070.0, "tokens_per_s_tuned_malloc": 1600.0,
           "peak_rss_bytes": 2.2 * 2**30, "target_tokens_per_s": 2140.0,
           "target_peak_rss_bytes": 2.0 * 2**30}
PHASES = ("forward", "head+loss", "backward", "optimizer")
VOCAB_SIZE = 50257


def peak_rss_bytes() -> int:
    """This process's peak resident set size (Linux ru_maxrss is in KiB)."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def whole_run(cfg: TrainConfig, steps: int) -> dict[str, Any]:
    """Train ``cfg`` for ``steps`` steps like ``python -m training`` (no export)."""
    from service.format.tokenizer import default_ranks_path, gpt2_spec, load_tokenizer
    from training.data import load_tokens
    from training.train import train

    cfg = dataclasses.replace(cfg, max_steps=steps)
    tokenizer = load_tokenizer(gpt2_spec(), default_ranks_path())
    data = load_tokens(cfg.data, tokenizer, Path(cfg.cache_dir), cfg.val_fraction,
                       progress=False)
    load, cpu0 = os.getloadavg(), time.process_time()
    result = train(cfg, tokenizer, data)  # result.seconds: model build to last eval
    evals = {int(h["step"]): h["val_loss"] for h in result.history if "val_loss" in h}
    return {"steps": result.step, "tokens": result.tokens, "seconds": result.seconds,
            "cpu_seconds": time.process_time() - cpu0,
            "tokens_per_s": result.tokens / result.seconds,
            "val_loss": result.val_loss, "val_loss_by_step": evals,
            "train_loss": result.train_loss, "unigram_val_loss": result.unigram_val_loss,
            "peak_rss_bytes": peak_rss_bytes(), "load_average_start": load,
            "load_average_end": os.getloadavg()}


def _batches(cfg: TrainConfig, n: int) -> list[torch.Tensor]:
    from training.data import default_corpus_ids

    ids = torch.tensor(default_corpus_ids(), dtype=torch.int64)  # (N,)
    gen = torch.Generator().manual_seed(0)
    starts = torch.randint(0, len(ids) - cfg.block_size - 1, (n, cfg.batch_size), generator=gen)
    return [torch.stack([ids[s:s + cfg.block_size + 1] for s in row.tolist()])
            for row in starts]  # (B, T+1) each


class _Stepper:
    """One model + optimizers at ``cfg``; ``step()`` returns seconds per phase."""

    def __init__(self, cfg: TrainConfig, threads: int = 0) -> None:
        torch.manual_seed(cfg.seed)
        # --head-precision auto as a run on this CPU takes it; compile only where a variant
        # asks (run_levers compiles its blocks), never by the run-length rule
        cfg = dataclasses.replace(cfg, head_precision=cfg.head_for("cpu"))
        self.cfg, self.threads = cfg, threads
        self.model = GPT(cfg.model_config(VOCAB_SIZE)).train()
        self.optimizers = build_optimizers(self.model, cfg)
        self.params: list[torch.Tensor] = list(self.model.parameters())
        self.n = 0

    def step(self, xy: torch.Tensor) -> dict[str, float]:
        """Forward, head+loss, backward, optimizer (clip + step + zero_grad), timed apart."""
        saved = torch.get_num_threads()
        if self.threads:
            torch.set_num_threads(self.threads)
        self.n += 1
        for opt in self.optimizers:
            for group in opt.param_groups:
                group["lr"] = lr_at(self.n, self.cfg)
        t0 = time.perf_counter()
        with block_autocast("cpu", self.cfg.block_precision):
            hidden = self.model.hidden_states(xy[:, :-1])  # (B, T, C)
        t1 = time.perf_counter()
        loss = self.model.head_loss(hidden, xy[:, 1:])  # fused: includes the head's gradient
        t2 = time.perf_counter()
        loss.backward()
        t3 = time.perf_counter()
        clip_grad_norm(self.params, self.cfg.grad_clip)
        for opt in self.optimizers:
            opt.step()
            opt.zero_grad(set_to_none=True)
        t4 = time.perf_counter()
        torch.set_num_threads(saved)
        return dict(zip(PHASES, (t1 - t0, t2 - t1, t3 - t2, t4 - t3), strict=True))


def step_breakdown(configs: dict[str, TrainConfig], steps: int, warmup: int = 2
                   ) -> dict[str, dict[str, float]]:
    """Median seconds per phase for each config, steps interleaved config by config."""
    steppers = {name: _Stepper(cfg) for name, cfg in configs.items()}
    data = _batches(ANCHOR, 8)
    times: dict[str, list[dict[str, float]]] = {name: [] for name in configs}
    for i in range(warmup + steps):
        for name, st in steppers.items():
            phases = st.step(data[i % len(data)])
            if i >= warmup:
                times[name].append(phases)
    return {name: {ph: statistics.median(t[ph] for t in ts) for ph in PHASES}
            for name, ts in times.items()}


def lever_variants(compile_: bool = False) -> dict[str, tuple[TrainConfig, int]]:
    """Baseline (REFERENCE) and baseline + one lever each; (config, threads; 0 = default)."""
    out = {"reference (full logits, single AdamW)": (REFERENCE, 0),
           "chunked CE, 256 rows": (dataclasses.replace(REFERENCE, loss_chunk=256), 0),
           "chunked CE, 512 rows": (dataclasses.replace(REFERENCE, loss_chunk=512), 0),
           "chunked CE, 1024 rows": (dataclasses.replace(REFERENCE, loss_chunk=1024), 0),
           "foreach AdamW": (dataclasses.replace(REFERENCE, adamw_impl="foreach"), 0),
           "fused AdamW": (dataclasses.replace(REFERENCE, adamw_impl="fused"), 0),
           "1 thread": (REFERENCE, 1),
           "tuned (chunk 512 + fused, fp32 head)": (TUNED, 0),
           "tuned + bf16 head": (BF16_HEAD, 0),
           "tuned + bf16 head, 1 thread": (BF16_HEAD, 1),
           "tuned + bf16 head + bf16 blocks": (
               dataclasses.replace(BF16_HEAD, block_precision="bf16"), 0)}
    if compile_:
        out["tuned + bf16 head + torch.compile"] = (
            dataclasses.replace(BF16_HEAD, compile=True), 0)
    return out


def run_levers(rounds: int, steps: int, out: Path, compile_: bool = False) -> dict[str, Any]:
    """Each lever on its own: ``rounds`` rounds, each running ``steps`` steps of every
    variant in turn; medians of per-step wall and CPU time, load average per round."""
    variants = lever_variants(compile_)
    steppers = {name: _Stepper(cfg, threads) for name, (cfg, threads) in variants.items()}
    compiled: dict[str, float] = {}
    for name, st in steppers.items():
        if st.cfg.compile:  # compile time is part of a whole run: measured, reported
            t0 = time.perf_counter()
            st.model.hidden_states = torch.compile(st.model.hidden_states)  # type: ignore[method-assign]
            st.step(_batches(ANCHOR, 1)[0])
            compiled[name] = time.perf_counter() - t0
    data = _batches(ANCHOR, 8)
    wall: dict[str, list[float]] = {n: [] for n in variants}
    cpu: dict[str, list[float]] = {n: [] for n in variants}
    loads = []
    for r in range(rounds):
        loads.append(os.getloadavg()[0])
        for name, st in steppers.items():
            st.step(data[0])  # one untimed step: caches and allocator warm for this variant
            for i in range(steps):
                w0, c0 = time.perf_counter(), time.process_time()
                st.step(data[(r * steps + i) % len(data)])
                wall[name].append(time.perf_counter() - w0)
                cpu[name].append(time.process_time() - c0)
        print(f"round {r + 1}/{rounds} done (1-min load {os.getloadavg()[0]:.1f})", flush=True)
    base = statistics.median(wall[next(iter(variants))])
    rows = []
    print(f"\n{'lever (on its own)':<38}{'wall ms':>9}{'cpu ms':>9}{'tokens/s':>10}{'speedup':>9}")
    tokens = ANCHOR.batch_size * ANCHOR.block_size
    for name in variants:
        w, c = statistics.median(wall[name]), statistics.median(cpu[name])
        rows.append({"name": name, "wall_ms_median": 1e3 * w, "cpu_ms_median": 1e3 * c,
                     "tokens_per_s": tokens / w, "speedup": base / w,
                     "compile_s": compiled.get(name), "wall_ms": [1e3 * x for x in wall[name]]})
        print(f"{name:<38}{1e3 * w:>9.0f}{1e3 * c:>9.0f}{tokens / w:>10.0f}{base / w:>8.2f}x")
    report = {"rounds": rounds, "steps_per_round": steps, "load_average_per_round": loads,
              "levers": rows}
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(report, indent=2) + "\n")
    print(f"wrote {out}; 1-min load per round: {', '.join(f'{x:.1f}' for x in loads)}")
    return report


def plot_breakdown(breakdown: dict[str, dict[str, float]], path: Path) -> Path:
    """Stacked horizontal bars: ms per phase of one step, one bar per config (PlotsUnavailable
    without matplotlib)."""
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(8, 2.8))
    names = list(breakdown)
    left = [0.0] * len(names)
    for phase in PHASES:
        ms = [1e3 * breakdown[n][phase] for n in names]
        ax.barh(names, ms, left=left, label=phase)
        left = [a + b for a, b in zip(left, ms, strict=True)]
    ax.set_xlabel("ms per step (median)")
    ax.set_title("anchor step: 4 layers, C=128, B=16, T=128, tied head, V=50304")
    ax.legend(ncol=4, fontsize=8, loc="lower right")
    ax.grid(axis="x", alpha=0.3)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path


def run_anchor(steps: int, breakdown_steps: int, out: Path, threads: int = 0
               ) -> dict[str, Any]:
    """Whole run first (so peak RSS is the run's), then the breakdown and its plot.

    ``threads``: torch threads for the whole run (0 = all cores, the training default).
    """
    run = whole_run(dataclasses.replace(ANCHOR, threads=threads), steps)
    peak_flops = peak_matmul_flops(torch.device("cpu"))[0]  # after: its buffers add RSS
    per_token = flops_per_token(GPT(ANCHOR.model_config(VOCAB_SIZE)))
    mfu = per_token * run["tokens_per_s"] / peak_flops
    ref = NANOGPT
    print(f"\n{'anchor whole run':<24}{'this project':>14}{'nanoGPT':>10}{'target':>10}")
    print(f"{'tokens/s':<24}{run['tokens_per_s']:>14.0f}{ref['tokens_per_s']:>10.0f}"
          f"{ref['target_tokens_per_s']:>10.0f}   (nanoGPT with tuned malloc "
          f"{ref['tokens_per_s_tuned_malloc']:.0f})")
    tokens = ANCHOR.batch_size * ANCHOR.block_size  # per step
    print(f"{'step time (ms, mean)':<24}{1e3 * run['seconds'] / run['steps']:>14.0f}"
          f"{1e3 * tokens / ref['tokens_per_s']:>10.0f}"
          f"{1e3 * tokens / ref['target_tokens_per_s']:>10.0f}")
    print(f"{'peak RSS (GiB)':<24}{run['peak_rss_bytes'] / 2**30:>14.2f}"
          f"{ref['peak_rss_bytes'] / 2**30:>10.1f}{ref['target_peak_rss_bytes'] / 2**30:>10.1f}")
    print(f"{'MFU (measured peak)':<24}{mfu:>14.1%}")
    print(f"{'tokens per CPU second':<24}{run['tokens'] / run['cpu_seconds']:>14.0f}"
          "   (this process's CPU time: what a loaded machine does not inflate)")
    print(f"val loss at step {run['steps']}: {run['val_loss']:.4f} "
          f"(unigram {run['unigram_val_loss']:.4f}); {run['seconds']:.0f} s wall, "
          f"load {run['load_average_start'][0]:.1f} -> {run['load_average_end'][0]:.1f}")
    breakdown = step_breakdown({"reference": REFERENCE, "default": ANCHOR}, breakdown_steps)
    for name, phases in breakdown.items():
        print(f"{name:<10}" + "".join(f"{ph} {1e3 * s:.0f} ms  " for ph, s in phases.items()))
    try:
        png: Path | str = plot_breakdown(breakdown, out.with_suffix(".png"))
    except PlotsUnavailable as e:  # the figures above and the JSON are the result
        png = f"no plot: {e}"
    report = {"config": dataclasses.replace(ANCHOR, threads=threads).resolved("cpu").to_dict(),
              "nanogpt": ref, "whole_run": run, "mfu": mfu,
              "peak_fp32_matmul_flops": peak_flops, "flops_per_token": per_token,
              "breakdown_s": breakdown, "plot": str(png)}
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(report, indent=2) + "\n")
    print(f"wrote {out} and {png}")
    return report

"""The "nanogpt" preset of training.bench: per-step time beside nanoGPT's own train.py.

    .venv/bin/python -m training.bench --preset nanogpt [--rounds 3 --nano-steps 30]
    NANOGPT_DIR=/path/to/nanoGPT .venv/bin/python -m training.bench --preset nanogpt

nanoGPT is never vendored: place a checkout of commit 3adf61e outside the project
(``git clone https://github.com/karpathy/nanoGPT /work/nanogpt && git -C /work/nanogpt
checkout 3adf61e``) and point ``NANOGPT_DIR`` at it (default ``/work/nanogpt``). Its data
is the project's own tokenized default corpus (the same 90/10 split), written as
``<NANOGPT_DIR>/data/embed_pydoc/{train,val}.bin`` (uint16, nanoGPT's format), so no
tiktoken download is needed.

Each round runs, one after the other in fresh processes (glibc reads GLIBC_TUNABLES at
start): nanoGPT with the project's malloc tunables, the project at each head precision
with the same tunables, then nanoGPT as people run it (no tunables). Per-step time
excludes evaluation on both sides: nanoGPT's ``iter k: ... time X ms`` lines after
``warmup`` iterations (its one evaluation is at iter 0, dropped); the project's steps are
timed by ``training.bench.anchor._Stepper`` (forward, fused head + loss, backward, clip,
AdamW: the step of ``python -m training`` without its batch draw and row counting).
Config on both: 4 layers, 4 heads, C=128, block 128, batch 16, tied head, AdamW fp32,
lr 1e-3, warmup 50, beta2 0.99, weight decay 0.1, clip 1.0, dropout 0 (nanoGPT keeps its
default ``bias=False``; the project's blocks have biases).
"""

from __future__ import annotations

import dataclasses
import json
import os
import re
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

from training.malloc import TUNABLES

__all__ = ["NANOGPT_COMMIT", "nanogpt_dir", "run_side_by_side"]

NANOGPT_COMMIT = "3adf61e"
_ITER = re.compile(r"^iter (\d+): loss [\d.]+, time ([\d.]+)ms", re.M)


def nanogpt_dir() -> Path:
    """The nanoGPT checkout (NANOGPT_DIR, default /work/nanogpt); SystemExit saying how to
    place it when absent."""
    where = Path(os.environ.get("NANOGPT_DIR", "/work/nanogpt"))
    if not (where / "train.py").is_file():
        raise SystemExit(
            f"nanoGPT not found at {where} (no train.py). Place it outside this project:\n"
            f"  git clone https://github.com/karpathy/nanoGPT {where}\n"
            f"  git -C {where} checkout {NANOGPT_COMMIT}\n"
            "or set NANOGPT_DIR to an existing checkout of that commit.")
    return where


def _write_corpus(root: Path) -> str:
    """The project's default corpus as nanoGPT's data/<name>/{train,val}.bin (uint16)."""
    from training.data import default_corpus_ids

    ids = np.asarray(default_corpus_ids(), dtype=np.uint16)  # (N,)
    n_train = int(len(ids) * 0.9)
    out = root / "data" / "embed_pydoc"
    out.mkdir(parents=True, exist_ok=True)
    ids[:n_train].tofile(out / "train.bin")
    ids[n_train:].tofile(out / "val.bin")
    return "embed_pydoc"


def _nanogpt_steps(root: Path, dataset: str, steps: int, warmup: int, tunables: bool
                   ) -> list[float]:
    """Seconds per training iteration of nanoGPT's train.py, iterations > warmup."""
    env = {k: v for k, v in os.environ.items() if k != "GLIBC_TUNABLES"}
    if tunables:
        env["GLIBC_TUNABLES"] = TUNABLES
    flags = {"dataset": dataset, "device": "cpu", "compile": "False", "dtype": "float32",
             "n_layer": 4, "n_head": 4, "n_embd": 128, "block_size": 128, "batch_size": 16,
             "gradient_accumulation_steps": 1, "max_iters": steps + warmup,
             "lr_decay_iters": 600, "learning_rate": 1e-3, "min_lr": 1e-4,
             "warmup_iters": 50, "beta2": 0.99, "weight_decay": 0.1, "dropout": 0.0,
             "eval_interval": 100000, "eval_iters": 1, "log_interval": 1,
             "always_save_checkpoint": "False", "wandb_log": "False",
             "out_dir": "/tmp/nanogpt_bench_out"}
    cmd = [sys.executable, "train.py", *(f"--{k}={v}" for k, v in flags.items())]
    done = subprocess.run(cmd, cwd=root, env=env, capture_output=True, text=True, check=False)
    if done.returncode:
        raise RuntimeError(f"nanoGPT train.py failed ({done.returncode}): {done.stderr[-2000:]}")
    return [float(ms) / 1e3 for it, ms in _ITER.findall(done.stdout) if int(it) > warmup]


def _project_steps(precision: str, steps: int, warmup: int) -> list[float]:
    """Seconds per step of the project at ANCHOR, in a fresh process with the tunables."""
    env = dict(os.environ, GLIBC_TUNABLES=TUNABLES)
    cmd = [sys.executable, "-m", "training.bench.nanogpt", precision, str(steps), str(warmup)]
    done = subprocess.run(cmd, env=env, capture_output=True, text=True, check=False)
    if done.returncode:
        raise RuntimeError(f"project child failed ({done.returncode}): {done.stderr[-2000:]}")
    return [float(x) for x in json.loads(done.stdout.strip().splitlines()[-1])]


def _child(precision: str, steps: int, warmup: int) -> None:
    """Time ``steps`` steps after ``warmup`` of ANCHOR at ``precision``; print JSON seconds."""
    import torch

    from training.bench.anchor import ANCHOR, _Stepper
    from training.data import default_corpus_ids
    from training.train import Batches

    ids = np.asarray(default_corpus_ids(), dtype=np.uint16)  # (N,)
    cfg = dataclasses.replace(ANCHOR, head_precision=precision)
    torch.set_num_threads(len(os.sched_getaffinity(0)))  # as python -m training does
    stepper = _Stepper(cfg)
    batches = Batches(ids[:int(len(ids) * 0.9)], cfg.block_size, cfg.seed)
    times = []
    for i in range(warmup + steps):
        xy = batches.draw(cfg.batch_size)  # (B, T+1), outside the clock as nanoGPT's fetch
        t0 = time.perf_counter()
        stepper.step(xy)
        if i >= warmup:
            times.append(time.perf_counter() - t0)
    print(json.dumps(times))


def run_side_by_side(rounds: int, steps: int, warmup: int, out: Path,
                     precisions: tuple[str, ...] = ("fp32", "bf16")) -> dict[str, Any]:
    """``rounds`` rounds of nanoGPT (tunables), the project per precision, nanoGPT (none);
    per round the median step of each; ratios = nanoGPT's median / the project's."""
    root = nanogpt_dir()
    dataset = _write_corpus(root)
    per_round: list[dict[str, Any]] = []
    for r in range(rounds):
        load = os.getloadavg()[0]
        row: dict[str, Any] = {"load_1min": load}
        row["nanogpt_tunables_s"] = statistics.median(
            _nanogpt_steps(root, dataset, steps, warmup, tunables=True))
        for prec in precisions:
            row[f"project_{prec}_s"] = statistics.median(_project_steps(prec, steps, warmup))
        row["nanogpt_plain_s"] = statistics.median(
            _nanogpt_steps(root, dataset, steps, warmup, tunables=False))
        per_round.append(row)
        print(f"round {r + 1}/{rounds} (load {load:.1f}): "
              + ", ".join(f"{k} {1e3 * v:.0f} ms" for k, v in row.items() if k.endswith("_s")),
              flush=True)
    summary: dict[str, Any] = {}
    print(f"\n{'project head':<14}{'vs nanoGPT same tunables':>28}{'vs nanoGPT as run':>22}")
    for prec in precisions:
        same = [r["nanogpt_tunables_s"] / r[f"project_{prec}_s"] for r in per_round]
        plain = [r["nanogpt_plain_s"] / r[f"project_{prec}_s"] for r in per_round]
        summary[prec] = {"vs_tuned": same, "vs_plain": plain}
        print(f"{prec:<14}{statistics.median(same):>10.2f}x ({min(same):.2f}-{max(same):.2f})"
              f"{'':>6}{statistics.median(plain):>10.2f}x ({min(plain):.2f}-{max(plain):.2f})")
    report = {"nanogpt_commit": NANOGPT_COMMIT, "steps": steps, "warmup": warmup,
              "rounds": per_round, "speedup": summary}
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(report, indent=2) + "\n")
    print(f"wrote {out}")
    return report


if __name__ == "__main__":  # the project's side, in its own process (see _project_steps)
    _child(sys.argv[1], int(sys.argv[2]), int(sys.argv[3]))

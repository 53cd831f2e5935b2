"""DDP: 2 CPU ranks (gloo, torchrun) train the same model as 1 process.

What DDP must guarantee, and how each is checked:

- the same global batches: step, lr, token and per-row update counts equal exactly;
- the same training: every train and val loss, every weight with a real gradient, and the
  logits on a fixed batch equal within a bound derived from float32 rounding (below), plus,
  with the bf16 head (the default where the CPU has native bf16), its roundings;
- rows that never had a gradient (unused token rows) equal bit for bit.

Two ranks sum each gradient in another grouping than one process (two half-batch sums,
then the all-reduce), so results differ in the last bits and the test must not depend on
those bits. ``EMBED_TEST_DDP_SEED`` (default 7) and ``EMBED_TEST_DDP_THREADS`` (torch
intra-op threads in both runs, default 1) vary the run; OMP_NUM_THREADS passes through.
"""

from __future__ import annotations

import copy
import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest
import torch

from service.format.tokenizer import Tokenizer
from tests.training.conftest import MakeConfig
from training.config import TrainConfig
from training.data import load_tokens
from training.model import GPT
from training.optim import lr_at
from training.state import load_state, state_path
from training.train import train

REPO_ROOT = Path(__file__).resolve().parents[2]
SEED = int(os.environ.get("EMBED_TEST_DDP_SEED", "7"))
THREADS = int(os.environ.get("EMBED_TEST_DDP_THREADS", "1"))
EPS = torch.finfo(torch.float32).eps  # 2**-23: one rounding of a float32 value is <= EPS/2
BF16_EPS = torch.finfo(torch.bfloat16).eps  # 2**-7: one rounding of a bf16 value is <= that/2

STEPS, B, T, C, N_HEAD = 6, 4, 16, 16, 2
QUERY, KEY = slice(0, C), slice(C, 2 * C)  # c_attn's output is split into q, k, v

# The float32 bound used throughout: two groupings of an n-term sum differ by at most about
# n * EPS * sum|terms| (each grouping is within (n - 1) * EPS/2 of the exact sum; Higham's
# gamma_n). Real rounding errors grow like sqrt(n), so n * EPS leaves room for the moderate
# cancellation of a real gradient; it cannot cover a gradient that is zero (see the key bias).
STEP_TERMS = B * T  # per-token terms in one step's gradient (and in one train-loss mean)
TRAIN_TERMS = STEPS * STEP_TERMS  # all gradient terms that shaped the final weights
# The bf16 head (training/loss.py) computes each row's logits, softmax and grad_h from that
# row alone: the same bits in both runs. What the ranks regroup is grad_W = p^T h, a bf16
# product rounded once over all of a step's rows in one process and once per rank's half
# with two ranks: per step the head's gradient may differ by 3 bf16 roundings (<= 3 *
# BF16_EPS/2 of sum|terms|), and that relative error shapes every later step as a float32
# term's does.
HEAD_ROUNDINGS = 3 * BF16_EPS / 2


def drift(steps: int, precision: str) -> float:
    """Relative rounding carried by the weights after ``steps`` steps, as the float32
    bound counts it, plus the bf16 head's regrouped roundings where it ran."""
    head = steps * HEAD_ROUNDINGS if precision == "bf16" else 0.0
    return steps * STEP_TERMS * EPS + head


def forward_terms() -> int:
    """Terms summed along one logit's path through the forward pass (one block): the chain
    of reductions whose roundings add up in a logit."""
    layer_norm = 2 * C  # mean, then variance
    block = (layer_norm + C  # ln_1; q, k, v projections
             + C // N_HEAD + 2 * T  # q . k per head; softmax normaliser; weighted sum of v
             + C  # c_proj
             + layer_norm + C + 4 * C)  # ln_2; mlp up; mlp down
    return block + layer_norm + C  # ln_f; lm_head


def lr_travel(cfg: TrainConfig) -> float:
    """sum_t lr_t: how far Adam can move one weight in STEPS steps.

    Adam's step is lr_t * m_hat / sqrt(v_hat), and by Cauchy-Schwarz |m_hat| <= 1.0042 *
    sqrt(v_hat) for betas (0.9, 0.95) over 6 steps: each step moves a weight by <= ~lr_t.
    """
    return sum(lr_at(step, cfg) for step in range(1, STEPS + 1))


def with_attn_bias_moved(model: GPT, part: slice, delta: torch.Tensor) -> GPT:
    """A copy of ``model`` whose c_attn.bias[part] is moved by ``delta``."""
    probe = copy.deepcopy(model)
    with torch.no_grad():
        probe.get_parameter("blocks.0.attn.c_attn.bias")[part] += delta
    return probe


@torch.no_grad()
def logits_of(model: GPT, batch: torch.Tensor) -> torch.Tensor:
    """(B, T, table_rows) logits of ``batch`` (B, T), in eval mode."""
    model.eval()
    logits, _ = model(batch)
    return logits


def rms(x: torch.Tensor) -> float:
    """Root mean square of a tensor's elements."""
    return float(x.double().pow(2).mean().sqrt())


@pytest.mark.slow
@pytest.mark.parametrize("head", ["fp32", "auto"])
def test_two_ranks_match_one_process(make_config: MakeConfig, tokenizer: Tokenizer,
                                     record_property: Callable[[str, object], None],
                                     head: str) -> None:
    """Also records, per bound, the largest measured/bound ratio (in --junitxml): how
    close this CPU comes to each bound. ``auto`` is the default head precision, given to
    both runs unresolved (bf16 on a CPU with native bf16, fp32 elsewhere)."""
    cfg = make_config(max_steps=STEPS, eval_every=3, lr=3e-2, name="one", export=False,
                      n_layer=1, n_head=N_HEAD, n_embd=C, block_size=T, batch_size=B,
                      seed=SEED, threads=THREADS, head_precision=head)
    precision = cfg.resolved("cpu").head_precision
    record_property("head_precision", precision)
    data = load_tokens(cfg.data, tokenizer, Path(cfg.cache_dir), cfg.val_fraction,
                       progress=False)
    one = train(cfg, tokenizer, data)
    flags = ["--data", *cfg.data, "--n-layer", "1", "--n-head", str(N_HEAD),
             "--n-embd", str(C), "--block-size", str(T), "--batch-size", str(B),
             "--max-steps", str(STEPS), "--warmup-steps", str(cfg.warmup_steps),
             "--lr", str(cfg.lr), "--eval-every", str(cfg.eval_every),
             "--eval-tokens", str(cfg.eval_tokens), "--seed", str(SEED),
             "--threads", str(THREADS), "--device", "cpu", "--name", "two", "--no-export",
             "--no-progress", "--cache-dir", cfg.cache_dir, "--runs-dir", cfg.runs_dir,
             *(["--head-precision", head] if head != "auto" else [])]
    env = dict(os.environ, GLIBC_TUNABLES="")
    proc = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone",
                           "--nproc_per_node", "2", "-m", "training", *flags],
                          cwd=REPO_ROOT, env=env, capture_output=True, text=True, timeout=240)
    assert proc.returncode == 0, proc.stderr[-4000:]
    two = load_state(state_path(Path(cfg.runs_dir), "two"))
    weights_one, weights_two = one.model.state_dict(), two.model

    # The same global batches, exactly.
    assert two.step == STEPS
    assert two.config["head_precision"] == precision  # what ran, never "auto"
    assert two.tokens == one.tokens == STEPS * B * T
    assert torch.equal(two.row_updates, one.row_updates)
    assert [h["step"] for h in two.history] == list(range(1, STEPS + 1))
    assert [h["lr"] for h in two.history] == [h["lr"] for h in one.history]
    assert [("val_loss" in h) for h in two.history] == [("val_loss" in h) for h in one.history]

    # The loss at step t comes from weights shaped by (t - 1) steps of gradients plus one
    # mean over STEP_TERMS tokens (regrouped by the ranks): t * STEP_TERMS terms in all.
    # Val losses are computed the same way in both runs, so t * STEP_TERMS bounds them too.
    ratios: dict[str, float] = {"loss": 0.0, "weight": 0.0}
    for t, (a, b) in enumerate(zip(one.history, two.history, strict=True), start=1):
        rel = drift(t, precision)
        for key in ("train_loss", "val_loss"):
            if key in a:
                ratios["loss"] = max(ratios["loss"], abs(b[key] / a[key] - 1) / rel)
        assert b["train_loss"] == pytest.approx(a["train_loss"], rel=rel, abs=0), t
        if "val_loss" in a:
            assert b["val_loss"] == pytest.approx(a["val_loss"], rel=rel, abs=0), t
    assert one.history[-1]["train_loss"] < one.history[0]["train_loss"] - 0.5  # it learned

    # A token row that never was an input has an exactly zero gradient on every rank: Adam
    # leaves it at its initial value, bit for bit, in both runs.
    unused = one.row_updates == 0
    assert int(unused.sum()) > 0
    assert torch.equal(weights_two["wte.weight"][unused], weights_one["wte.weight"][unused])

    # Weights with a real gradient: a rounding error of relative size <= TRAIN_TERMS * EPS
    # in the gradients moves each Adam step (<= lr_t) by as much again, so a weight differs
    # by at most TRAIN_TERMS * EPS * sum_t lr_t. That holds per element while the gradient
    # is large against its rounding; an element whose gradient happens to pass near zero at
    # one step can exceed it, so each tensor is held to it in RMS, where one such element
    # cannot decide the outcome. (A DDP fault, e.g. an unsynchronised tensor, moves every
    # element by ~lr: thousands of times this bound.)
    weight_tol = drift(STEPS, precision) * lr_travel(cfg)
    key_name = "blocks.0.attn.c_attn.bias"
    for name, w in weights_one.items():
        w2 = weights_two[name]
        if name == "wte.weight":
            w, w2 = w[~unused], w2[~unused]
        elif name == key_name:
            # The key bias is left out: each query's scores all get the same q . b_k, and
            # softmax is invariant to adding a constant per query row, so b_k's true
            # gradient is exactly 0. What it gets is rounding noise, which Adam normalises
            # into full steps of ~lr_t in a direction that differs between the runs. It is
            # checked below to have no effect on the output instead.
            real = torch.ones(3 * C, dtype=torch.bool)
            real[KEY] = False
            w, w2 = w[real], w2[real]
        ratios["weight"] = max(ratios["weight"], rms(w2 - w) / weight_tol)
        assert rms(w2 - w) <= weight_tol, (name, rms(w2 - w), weight_tol)

    # The outputs on a fixed batch (the first B windows of the val split). Each logit carries
    # the training's rounding (TRAIN_TERMS) plus its own forward pass's (forward_terms()),
    # each term at most EPS relative to the logits' scale.
    windows = np.stack([data.val[i * T:(i + 1) * T] for i in range(B)]).astype(np.int64)
    batch = torch.from_numpy(windows)  # (B, T)
    model_two = GPT(one.model.cfg)
    model_two.load_state_dict(weights_two)
    logits_one, logits_two = logits_of(one.model, batch), logits_of(model_two, batch)
    scale = float(logits_one.abs().max())
    logits_tol = (drift(STEPS, precision) + forward_terms() * EPS) * scale
    ratios["logits"] = float((logits_two - logits_one).abs().max()) / logits_tol
    assert ratios["logits"] <= 1.0, ratios

    # The key bias cannot change the output: moved by 2 * sum_t lr_t (the widest gap two
    # runs can open on a parameter whose every Adam step is noise), the logits stay within
    # the forward pass's own rounding. The same move of the query bias, whose gradient is
    # real, changes them by far more: this check can tell the two apart.
    forward_tol = forward_terms() * EPS * scale
    delta = 2 * lr_travel(cfg) * torch.where(
        torch.randn(C, generator=torch.Generator().manual_seed(0)) > 0, 1.0, -1.0)
    moved_key = logits_of(with_attn_bias_moved(one.model, KEY, delta), batch) - logits_one
    moved_query = logits_of(with_attn_bias_moved(one.model, QUERY, delta), batch) - logits_one
    ratios["key_bias_moved"] = float(moved_key.abs().max()) / forward_tol
    ratios["query_bias_moved"] = float(moved_query.abs().max()) / forward_tol
    for key, ratio in ratios.items():
        record_property(f"{key}_over_bound", f"{ratio:.3g}")
    assert ratios["key_bias_moved"] <= 1.0, ratios
    assert ratios["query_bias_moved"] > 1.0, ratios

"""Cross-entropy of a linear LM head, computed in row chunks: the full logits never exist.

At B*T = 2048 rows and 50,304 table rows the logits are 412 MB of float32, and
``F.cross_entropy(lm_head(h))`` holds them, their log-softmax and their gradient at once
(the step's peak RSS and much of its time: every pass over them misses the caches).
:func:`linear_cross_entropy` takes the hidden states and the head's weight instead and
walks ``chunk`` rows at a time through two reused ``(chunk, V)`` buffers:

    logits = h_k @ W.T                      (chunk, V)
    logp   = log_softmax(logits)            the loss of row i is -logp[i, t_i]
    p      = exp(logp) - onehot(t)          d(loss_i)/d(logits_i)
    grad_h[k]  = p @ W                      (chunk, C)
    grad_W    += p.T @ h_k                  (V, C), no transpose copy: BLAS reads W.T / p.T

When a gradient is needed the forward pass does all of it (three matmuls per chunk, as
autograd's own head does; recomputing the logits in backward would be a fourth), keeps
``grad_h`` (N, C) and ``grad_W`` (V, C), and backward only scales them by the incoming
gradient. Without a gradient (evaluation) it is the forward half only. The per-row loss is
F.cross_entropy's own (log_softmax, then the target's entry); only the order of the sum
differs, so the result agrees with ``F.cross_entropy`` to float32 rounding
(tests/training/test_loss.py).
"""

from __future__ import annotations

import functools
from typing import Any

import torch

__all__ = ["DEFAULT_CHUNK", "HEAD_PRECISIONS", "auto_head_precision", "cpu_has_native_bf16",
           "linear_cross_entropy"]

DEFAULT_CHUNK = 512  # rows per chunk: 2 x 103 MB buffers at V=50304 (levers: docs/training.md)
# fp32: every (n, V) pass in float32. bf16: the head's three matmuls and the softmax in
# bfloat16 (AVX-512 BF16 / AMX: ~2x the fp32 matmul rate), the loss summed in float32,
# the gradients returned in float32 (the master weights never leave float32).
HEAD_PRECISIONS = ("fp32", "bf16")
_NATIVE_BF16_FLAGS = ("avx512_bf16", "amx_bf16")  # /proc/cpuinfo: bf16 dot products in silicon


@functools.lru_cache(maxsize=1)
def _cpuinfo() -> str:
    try:
        with open("/proc/cpuinfo", encoding="ascii", errors="replace") as fh:
            return fh.read()
    except OSError:
        return ""


def cpu_has_native_bf16(cpuinfo: str | None = None) -> bool:
    """Whether this CPU multiplies bfloat16 natively (``avx512_bf16`` or ``amx_bf16`` in
    /proc/cpuinfo's flags); elsewhere oneDNN emulates bf16 and the head gets slower."""
    if cpuinfo is None:
        cpuinfo = _cpuinfo()
    for line in cpuinfo.splitlines():
        if line.startswith("flags"):
            flags = set(line.partition(":")[2].split())
            return any(f in flags for f in _NATIVE_BF16_FLAGS)
    return False


def auto_head_precision(device_type: str, loss_chunk: int, cpuinfo: str | None = None) -> str:
    """``--head-precision auto``: bf16 on a CPU with native bf16 and the chunked loss (1.9x
    the step at the anchor config, val 3.161 vs 3.154 after 600 steps: docs/training.md),
    fp32 elsewhere (CUDA runs autocast the whole model to bf16 already; full logits have no
    bf16 path)."""
    if device_type == "cpu" and loss_chunk > 0 and cpu_has_native_bf16(cpuinfo):
        return "bf16"
    return "fp32"


def _chunks(n: int, chunk: int) -> list[tuple[int, int]]:
    return [(s, min(n, s + chunk)) for s in range(0, n, chunk)]


def _finish(ctx: Any, total: torch.Tensor, grad_h: torch.Tensor | None,
            grad_w: torch.Tensor | None, N: int) -> torch.Tensor:
    """Scale the summed gradients to the mean, keep them for backward; the mean loss."""
    # 1/N applied to the small (N, C) and (V, C) results, not to every (n, V) entry.
    scale = 1.0 / N
    if grad_h is not None:
        grad_h.mul_(scale)
    if grad_w is not None:
        grad_w.mul_(scale)
    ctx.save_for_backward(*(g for g in (grad_h, grad_w) if g is not None))
    ctx.has = (grad_h is not None, grad_w is not None)
    return total / N


class _LinearCrossEntropy(torch.autograd.Function):
    """Mean cross-entropy of ``hidden @ weight.T`` against ``targets``; gradients fused in."""

    @staticmethod
    def forward(ctx: Any, hidden: torch.Tensor, weight: torch.Tensor,
                targets: torch.Tensor, chunk: int, bf16: bool) -> torch.Tensor:
        """hidden (N, C), weight (V, C), targets (N,) int64 -> scalar mean loss."""
        N, V = hidden.shape[0], weight.shape[0]
        want_h, want_w = ctx.needs_input_grad[0], ctx.needs_input_grad[1]
        if bf16 and (want_h or want_w):
            return _bf16_forward(ctx, hidden, weight, targets, chunk, want_h, want_w)
        width = min(chunk, N)
        logits = hidden.new_empty(width, V)  # (chunk, V), reused by every chunk
        logp = hidden.new_empty(width, V)  # (chunk, V)
        grad_h = torch.empty_like(hidden) if want_h else None  # (N, C)
        grad_w = torch.zeros_like(weight) if want_w else None  # (V, C)
        total = hidden.new_zeros(())
        for s, e in _chunks(N, chunk):
            h, t = hidden[s:e], targets[s:e, None]  # (n, C), (n, 1)
            n = e - s
            lg, lp = logits[:n], logp[:n]  # (n, V) each
            torch.mm(h, weight.t(), out=lg)  # (n, V): W.T is a strided view, not a copy
            torch._log_softmax(lg, 1, False, out=lp)  # (n, V): F.cross_entropy's kernel
            total -= lp.gather(1, t).sum()
            if grad_h is None and grad_w is None:
                continue
            p = lp.exp_()  # (n, V): softmax, in place over the log-probabilities
            p.scatter_add_(1, t, p.new_full((n, 1), -1.0))  # (n, V): softmax - onehot
            if grad_h is not None:
                torch.mm(p, weight, out=grad_h[s:e])  # (n, C)
            if grad_w is not None:
                grad_w.addmm_(p.t(), h)  # (V, C) += (V, n) @ (n, C)
        return _finish(ctx, total, grad_h, grad_w, N)

    @staticmethod
    def backward(ctx: Any, grad_out: torch.Tensor
                 ) -> tuple[torch.Tensor | None, torch.Tensor | None, None, None, None]:
        """The loss is a scalar: its gradients are the stored ones times ``grad_out``."""
        saved = list(ctx.saved_tensors)
        grad_h = saved.pop(0) * grad_out if ctx.has[0] else None  # (N, C)
        grad_w = saved.pop(0) * grad_out if ctx.has[1] else None  # (V, C)
        return grad_h, grad_w, None, None, None


def _bf16_forward(ctx: Any, hidden: torch.Tensor, weight: torch.Tensor, targets: torch.Tensor,
                  chunk: int, want_h: bool, want_w: bool) -> torch.Tensor:
    """The training half in bfloat16: per chunk one bf16 matmul for the logits, one bf16
    softmax (fp32 max and sum inside the kernel), two bf16 matmuls for the gradients.

    What stays float32: the loss (-log p of the target, summed in fp32), the target
    entry of the logits' gradient (p_t - 1, formed in fp32 before rounding), ``grad_h``
    and ``grad_w`` (each chunk's bf16 product is added into fp32 sums), and the weights
    themselves (``weight`` is cast to a bf16 copy per call, never replaced).
    """
    N, V = hidden.shape[0], weight.shape[0]
    width = min(chunk, N)
    w16 = weight.to(torch.bfloat16)  # (V, C) copy: 12.9 MB at V=50304, C=128
    h16 = hidden.to(torch.bfloat16)  # (N, C)
    logits = h16.new_empty(width, V)  # (chunk, V) bf16, reused
    probs = h16.new_empty(width, V)  # (chunk, V) bf16, reused
    grad_h = torch.empty_like(hidden) if want_h else None  # (N, C) fp32
    grad_w = torch.zeros_like(weight) if want_w else None  # (V, C) fp32
    total = torch.zeros((), dtype=torch.float32, device=hidden.device)
    for s, e in _chunks(N, chunk):
        h, t = h16[s:e], targets[s:e, None]  # (n, C) bf16, (n, 1)
        n = e - s
        lg, p = logits[:n], probs[:n]  # (n, V) bf16 each
        torch.mm(h, w16.t(), out=lg)  # (n, V)
        torch._softmax(lg, 1, False, out=p)  # (n, V): bf16 in and out, fp32 inside
        p_t = p.gather(1, t).float().clamp_min_(torch.finfo(torch.float32).tiny)  # (n, 1)
        total -= p_t.log().sum()
        p.scatter_(1, t, (p_t - 1.0).to(torch.bfloat16))  # (n, V): softmax - onehot
        if grad_h is not None:
            grad_h[s:e] = torch.mm(p, w16)  # (n, C) bf16 -> fp32
        if grad_w is not None:
            grad_w.add_(torch.mm(p.t(), h))  # (V, C) fp32 += bf16 (V, n) @ (n, C)
    return _finish(ctx, total, grad_h, grad_w, N)


def linear_cross_entropy(hidden: torch.Tensor, weight: torch.Tensor, targets: torch.Tensor,
                         chunk: int = DEFAULT_CHUNK, precision: str = "fp32") -> torch.Tensor:
    """``F.cross_entropy(hidden @ weight.T, targets)`` without materialising the logits.

    hidden (N, C) float32, weight (V, C) (an LM head or a tied token table), targets (N,)
    int64 in [0, V). Returns the mean loss (scalar); differentiable in hidden and weight.
    ``precision`` "bf16" runs the training half (when a gradient is wanted) in bfloat16
    with fp32 loss and gradient sums; without a gradient (evaluation) it is always fp32,
    so val losses compare across precisions.
    """
    if precision not in HEAD_PRECISIONS:
        raise ValueError(f"precision {precision!r} not in {HEAD_PRECISIONS}")
    if chunk <= 0:
        raise ValueError(f"chunk must be > 0, got {chunk}")
    if hidden.dim() != 2 or targets.shape != hidden.shape[:1]:
        raise ValueError(f"hidden {tuple(hidden.shape)} / targets {tuple(targets.shape)}: "
                         "want (N, C) and (N,)")
    # The loss is float32 whatever autocast would pick (bf16 logits lose the softmax tail).
    with torch.autocast(device_type=hidden.device.type, enabled=False):
        loss = _LinearCrossEntropy.apply(hidden.to(weight.dtype), weight, targets, chunk,
                                         precision == "bf16")
    assert isinstance(loss, torch.Tensor)
    return loss

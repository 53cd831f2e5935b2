"""Optimisers, the learning-rate schedule and gradient clipping.

Weight decay pulls every row toward zero on every step, touched or not, so it never
applies to the input tables (nor biases or LayerNorm). With ``sparse_embeddings`` the
tables get SparseAdam, which updates only the rows present in the step's gradient;
dense AdamW would keep moving a row after its last use through its momentum.
"""

from __future__ import annotations

import math

import torch

from training.config import TrainConfig
from training.model import GPT

__all__ = ["build_optimizers", "clip_grad_norm", "lr_at"]


def lr_at(step: int, cfg: TrainConfig) -> float:
    """Learning rate for optimizer step ``step`` (1-based): linear warmup, then cosine."""
    if step <= cfg.warmup_steps:
        return cfg.lr * step / max(1, cfg.warmup_steps)
    span = max(1, cfg.max_steps - cfg.warmup_steps)
    progress = min(1.0, (step - cfg.warmup_steps) / span)
    floor = cfg.lr * cfg.min_lr_ratio
    return floor + 0.5 * (cfg.lr - floor) * (1.0 + math.cos(math.pi * progress))


def build_optimizers(model: GPT, cfg: TrainConfig) -> list[torch.optim.Optimizer]:
    """AdamW for the network (+ the tables when dense); SparseAdam for sparse tables."""
    tables = {id(p) for p in model.embedding_parameters()}
    decay: list[torch.Tensor] = []
    no_decay: list[torch.Tensor] = []
    for p in model.parameters():  # parameters() de-duplicates a tied head
        if id(p) in tables:
            continue
        (decay if p.dim() >= 2 else no_decay).append(p)
    betas = (cfg.beta1, cfg.beta2)
    groups = [{"params": decay, "weight_decay": cfg.weight_decay},
              {"params": no_decay, "weight_decay": 0.0}]
    if not cfg.sparse_embeddings:
        groups.append({"params": model.embedding_parameters(), "weight_decay": 0.0})
    # Each choice runs the same kernels whatever the device count or resume point, so
    # resume stays bit-exact and DDP matches one process; "fused" is fastest (docs/training.md).
    impl = cfg.adamw_impl
    opts: list[torch.optim.Optimizer] = [
        torch.optim.AdamW(groups, lr=cfg.lr, betas=betas, foreach=impl == "foreach",
                          fused=True if impl == "fused" else None)]
    if cfg.sparse_embeddings:
        opts.append(torch.optim.SparseAdam(model.embedding_parameters(), lr=cfg.lr,
                                           betas=betas))
    return opts


def clip_grad_norm(params: list[torch.Tensor], max_norm: float) -> float:
    """Scale all gradients so their global L2 norm is <= max_norm; sparse grads included.

    Returns the norm before clipping. Same rule as torch's: scale = max_norm / (norm + 1e-6).
    """
    norms = []
    for p in params:
        if p.grad is None:
            continue
        g = p.grad.coalesce() if p.grad.is_sparse else p.grad
        if g.is_sparse:
            p.grad = g  # coalesced once, reused by the optimiser
            g = g.values()
        norms.append(torch.linalg.vector_norm(g.float()))
    if not norms:
        return 0.0
    total = torch.linalg.vector_norm(torch.stack(norms))
    if max_norm > 0:
        scale = torch.clamp(max_norm / (total + 1e-6), max=1.0)
        for p in params:
            if p.grad is not None:
                p.grad.mul_(scale.to(p.grad.device))
    return float(total)

"""The training loop: next-token prediction on the token shard, counting row updates.

Each optimizer step draws ``batch_size`` random windows of ``block_size + 1`` tokens from
the train split (one generator, same draw on every rank; each rank keeps its slice). The
token ids among the step's inputs are the table rows that receive gradient from the
lookup; each gets +1 in ``row_updates``. Rows that never appear keep their initial values
bit for bit (no weight decay on the tables; Adam's update of a zero gradient is zero).
"""

from __future__ import annotations

import contextlib
import os
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch
from torch.nn.parallel import DistributedDataParallel as DDP

from service.format.tokenizer import Tokenizer
from training import distributed
from training.baseline import unigram_cross_entropy
from training.config import TrainConfig, compilers_for
from training.data import TokenData
from training.errors import UsageError
from training.model import GPT
from training.optim import build_optimizers, clip_grad_norm, lr_at
from training.progress import progress_bar
from training.state import (
    TrainerState,
    check_same_model,
    load_resumable,
    save_state,
    state_path,
)

__all__ = ["Batches", "TrainResult", "block_autocast", "evaluate", "train"]


class Batches:
    """Random training windows from a token array, reproducible from one generator."""

    def __init__(self, tokens: np.ndarray, block_size: int, seed: int) -> None:
        if len(tokens) <= block_size + 1:
            raise ValueError(f"train split has {len(tokens)} tokens, need > {block_size + 1}")
        self.tokens = tokens
        self.block_size = block_size
        self.generator = torch.Generator().manual_seed(seed)

    def draw(self, batch_size: int) -> torch.Tensor:
        """(batch_size, block_size + 1) int64 windows: inputs [:, :-1], targets [:, 1:]."""
        starts = torch.randint(len(self.tokens) - self.block_size - 1, (batch_size,),
                               generator=self.generator).tolist()
        rows = [self.tokens[s:s + self.block_size + 1] for s in starts]
        return torch.from_numpy(np.stack(rows).astype(np.int64))  # (B, T+1)


@torch.no_grad()
def evaluate(model: GPT, val: np.ndarray, block_size: int, batch_size: int, max_tokens: int,
             device: torch.device) -> float:
    """Mean cross-entropy (nats) over consecutive non-overlapping val windows."""
    was_training = model.training
    model.eval()
    n_windows = max(1, min(len(val) - 1, max_tokens) // block_size)
    T = min(block_size, len(val) - 1)
    total, count = 0.0, 0
    for first in range(0, n_windows, batch_size):
        idx = range(first, min(n_windows, first + batch_size))
        rows = np.stack([val[i * T:i * T + T + 1] for i in idx]).astype(np.int64)
        xy = torch.from_numpy(rows).to(device)  # (b, T+1)
        _, loss = model(xy[:, :-1], xy[:, 1:])
        assert loss is not None
        total += float(loss) * xy[:, 1:].numel()
        count += xy[:, 1:].numel()
    model.train(was_training)
    return total / count


@dataclass
class TrainResult:
    """A finished (or stopped) run: the model and what export records about it."""

    model: GPT
    step: int
    tokens: int
    train_loss: float
    val_loss: float
    unigram_val_loss: float
    row_updates: torch.Tensor  # (table_rows,) int64
    corpus_sha256: str
    history: list[dict[str, float]] = field(default_factory=list)
    state_file: Path | None = None
    seconds: float = 0.0
    config: TrainConfig = field(default_factory=TrainConfig)  # as it ran (resolved)


def block_autocast(device_type: str, block_precision: str
                   ) -> contextlib.AbstractContextManager[object]:
    """The forward's autocast: bf16 on CUDA always, on CPU with ``--block-precision bf16``
    (the head's loss opts out of it: training/loss.py)."""
    if device_type == "cuda" or block_precision == "bf16":
        return torch.autocast(device_type, dtype=torch.bfloat16)
    return contextlib.nullcontext()


def _rng_state(device: torch.device) -> torch.Tensor | None:
    return torch.cuda.get_rng_state(device) if device.type == "cuda" else None


def _shown(val_loss: float) -> str:
    """The bar's val= value: "-" until the first evaluation (not nan)."""
    return "-" if np.isnan(val_loss) else f"{val_loss:.3f}"


def train(cfg: TrainConfig, tokenizer: Tokenizer, data: TokenData,
          topo: distributed.Topology | None = None) -> TrainResult:
    """Run steps ``resume_step + 1 .. stop`` and return the model plus its statistics."""
    started = time.perf_counter()
    topo = topo or distributed.setup(cfg.device)
    device = topo.device
    asked = cfg.compile
    cfg = cfg.resolved(device.type)  # head precision and compile as they run and are recorded
    if asked and not cfg.compile:
        print("python -m training: warning: --compile: no compiler for torch.compile's code "
              f"({' or '.join(compilers_for(device.type))} not found); training eagerly",
              file=sys.stderr, flush=True)
    cores = len(os.sched_getaffinity(0))
    torch.set_num_threads(cfg.threads or max(1, cores // topo.local_world_size))
    if cfg.sparse_embeddings and topo.world_size > 1:
        raise UsageError("--sparse-embeddings is single-process only (DDP needs dense "
                         "grads): drop it, or run one process")
    torch.manual_seed(cfg.seed)
    model = GPT(cfg.model_config(tokenizer.n_vocab, device.type)).to(device)
    optimizers = build_optimizers(model, cfg)
    batches = Batches(data.train, cfg.block_size, cfg.seed)
    row_updates = torch.zeros(cfg.table_rows, dtype=torch.int64)
    step, tokens, history = 0, 0, []
    path = state_path(Path(cfg.runs_dir), cfg.name)
    if cfg.resume or (cfg.resume_if_present and path.is_file()):
        st = load_resumable(path)
        if st.corpus_sha256 != data.corpus_sha256:
            raise UsageError(f"--resume: {path} was trained on another corpus (sha256 "
                             f"{st.corpus_sha256[:12]}, this --data is "
                             f"{data.corpus_sha256[:12]}); resume with the run's own --data, "
                             f"or start fresh without --resume")
        check_same_model(path, st.config, cfg.to_dict())
        model.load_state_dict(st.model)
        for opt, sd in zip(optimizers, st.optimizers, strict=True):
            opt.load_state_dict(sd)
        step, tokens, history = st.step, st.tokens, list(st.history)
        row_updates = st.row_updates.clone()
        batches.generator.set_state(st.batch_rng)
        torch.set_rng_state(st.torch_rng)
        if st.cuda_rng is not None and device.type == "cuda":
            torch.cuda.set_rng_state(st.cuda_rng, device)
    net: torch.nn.Module = model
    if topo.world_size > 1:
        net = DDP(model, device_ids=[device.index] if device.type == "cuda" else None)
    if cfg.compile:
        net = torch.compile(net)  # type: ignore[assignment]
    autocast = block_autocast(device.type, cfg.block_precision)
    per_rank = cfg.batch_size // topo.world_size
    if per_rank * topo.world_size != cfg.batch_size or per_rank % cfg.grad_accum:
        raise UsageError(f"--batch-size {cfg.batch_size} must split into {topo.world_size} "
                         f"ranks x --grad-accum {cfg.grad_accum} micro-batches")
    micro = per_rank // cfg.grad_accum
    unigram = unigram_cross_entropy(data.train, data.val, tokenizer.n_vocab)
    stop = min(cfg.max_steps, cfg.stop_at or cfg.max_steps)
    params: list[torch.Tensor] = list(model.parameters())
    train_loss = val_loss = float("nan")
    tick, tick_tokens = time.perf_counter(), tokens

    def save() -> None:
        if topo.is_main:
            save_state(path, TrainerState(
                step=step, tokens=tokens, model=model.state_dict(),
                optimizers=[o.state_dict() for o in optimizers], row_updates=row_updates,
                batch_rng=batches.generator.get_state(), torch_rng=torch.get_rng_state(),
                cuda_rng=_rng_state(device), corpus_sha256=data.corpus_sha256,
                history=history, config=cfg.to_dict()))

    model.train()
    with progress_bar("train", total=stop, initial=step, unit="step",
                      disable=not (cfg.progress and topo.is_main)) as bar:
        while step < stop:
            step += 1
            lr = lr_at(step, cfg)
            for opt in optimizers:
                for group in opt.param_groups:
                    group["lr"] = lr
            xy = batches.draw(cfg.batch_size)  # (B, T+1), the global batch on every rank
            row_updates[torch.unique(xy[:, :-1])] += 1
            mine = xy[topo.rank * per_rank:(topo.rank + 1) * per_rank].to(device)  # (B/W, T+1)
            loss_sum = torch.zeros((), device=device)
            for k in range(cfg.grad_accum):
                part = mine[k * micro:(k + 1) * micro]  # (b, T+1)
                sync = k == cfg.grad_accum - 1 or not isinstance(net, DDP)
                with (contextlib.nullcontext() if sync else net.no_sync()), autocast:  # type: ignore[operator]
                    _, loss = net(part[:, :-1], part[:, 1:])
                (loss / cfg.grad_accum).backward()
                loss_sum += loss.detach().float()
            clip_grad_norm(params, cfg.grad_clip)
            for opt in optimizers:
                opt.step()
                opt.zero_grad(set_to_none=True)
            tokens += cfg.batch_size * cfg.block_size
            train_loss = float(distributed.all_reduce_mean(loss_sum / cfg.grad_accum, topo))
            record: dict[str, float] = {"step": step, "train_loss": train_loss, "lr": lr,
                                        "tokens": tokens}
            if step % cfg.eval_every == 0 or step == cfg.max_steps:
                val_loss = evaluate(model, data.val, cfg.block_size, cfg.batch_size,
                                    cfg.eval_tokens, device)
                record["val_loss"] = val_loss
            history.append(record)
            now = time.perf_counter()
            bar.set_postfix(loss=f"{train_loss:.3f}", val=_shown(val_loss),
                            tok_s=f"{(tokens - tick_tokens) / max(now - tick, 1e-9):.0f}")
            tick, tick_tokens = now, tokens
            bar.update(1)
            if cfg.checkpoint_every and step % cfg.checkpoint_every == 0 and step != stop:
                save()
    if np.isnan(val_loss):  # resumed at (or past) the end: evaluate what we have
        val_loss = evaluate(model, data.val, cfg.block_size, cfg.batch_size,
                            cfg.eval_tokens, device)
    save()
    return TrainResult(model=model, step=step, tokens=tokens, train_loss=train_loss,
                       val_loss=val_loss, unigram_val_loss=unigram, row_updates=row_updates,
                       corpus_sha256=data.corpus_sha256, history=history,
                       state_file=path if topo.is_main else None, config=cfg,
                       seconds=time.perf_counter() - started)

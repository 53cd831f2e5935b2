"""The GPT trained by the offline job: token table + position encoding + transformer blocks.

The two input tables are the product: ``wte`` (token table, ``[table_rows, C]``) and
``wpe`` (position table, ``[block_size, C]``, only for ``position == "learned"``). The
LM head is untied by default so that a token row only moves when that token is an input;
tied, every row gets a gradient through the softmax on every step.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from service.format.positions import sinusoidal_table  # the server recomputes it: same bits
from training.loss import DEFAULT_CHUNK, HEAD_PRECISIONS, linear_cross_entropy

__all__ = ["GPT", "POSITIONS", "ModelConfig", "flops_per_token", "matmul_params", "rope_tables"]

POSITIONS = ("learned", "sinusoidal", "none")  # "none" = RoPE inside attention


@dataclass(frozen=True)
class ModelConfig:
    """Shape of the network."""

    vocab_size: int = 50257  # tokenizer n_vocab: targets are always < vocab_size
    table_rows: int = 50304  # rows of wte/lm_head, padded to a multiple of 64 for matmul speed
    block_size: int = 128  # context window = rows of the position table
    n_layer: int = 2
    n_head: int = 4
    n_embd: int = 128  # C
    dropout: float = 0.0
    position: str = "learned"
    tie_weights: bool = False
    sparse_embeddings: bool = False  # nn.Embedding(sparse=True): row-sparse table gradients
    loss_chunk: int = DEFAULT_CHUNK  # rows per chunk of the fused head + loss; 0 = full logits
    head_precision: str = "fp32"  # fp32 | bf16: the chunked head's matmuls in training

    def __post_init__(self) -> None:
        if self.position not in POSITIONS:
            raise ValueError(f"position {self.position!r} not in {POSITIONS}")
        if self.table_rows < self.vocab_size:
            raise ValueError(f"table_rows {self.table_rows} < vocab_size {self.vocab_size}")
        if self.n_embd % self.n_head:
            raise ValueError(f"n_embd {self.n_embd} not divisible by n_head {self.n_head}")
        if self.position == "none" and (self.n_embd // self.n_head) % 2:
            raise ValueError("RoPE needs an even head dimension")
        if self.head_precision not in HEAD_PRECISIONS:
            raise ValueError(f"head_precision {self.head_precision!r} not in {HEAD_PRECISIONS}")
        if self.head_precision != "fp32" and not self.loss_chunk:
            raise ValueError("head_precision bf16 needs the chunked loss (loss_chunk > 0)")
        if self.loss_chunk < 0:
            raise ValueError(f"loss_chunk must be >= 0, got {self.loss_chunk}")
        if self.tie_weights and self.sparse_embeddings:
            raise ValueError("sparse_embeddings needs an untied head (tied rows are all dense)")


def rope_tables(max_seq_len: int, head_dim: int) -> tuple[torch.Tensor, torch.Tensor]:
    """cos and sin for rotary embeddings (Su et al.), each (T, head_dim / 2)."""
    inv = 1.0 / (10000.0 ** (torch.arange(0, head_dim, 2, dtype=torch.float32) / head_dim))
    angles = torch.outer(torch.arange(max_seq_len, dtype=torch.float32), inv)  # (T, hd/2)
    return angles.cos(), angles.sin()


def _rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    x1, x2 = x[..., 0::2], x[..., 1::2]  # (B, H, T, hd/2) each
    out = torch.stack((x1 * cos - x2 * sin, x1 * sin + x2 * cos), dim=-1)  # (B, H, T, hd/2, 2)
    return out.flatten(-2)  # (B, H, T, hd)


class CausalSelfAttention(nn.Module):
    """Multi-head causal self-attention through F.scaled_dot_product_attention."""

    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.n_head = cfg.n_head
        self.dropout = cfg.dropout
        self.c_attn = nn.Linear(cfg.n_embd, 3 * cfg.n_embd)
        self.c_proj = nn.Linear(cfg.n_embd, cfg.n_embd)
        self.resid_drop = nn.Dropout(cfg.dropout)

    def forward(self, x: torch.Tensor, rope: tuple[torch.Tensor, torch.Tensor] | None
                ) -> torch.Tensor:
        """x: (B, T, C) -> (B, T, C)."""
        B, T, C = x.shape
        q, k, v = self.c_attn(x).split(C, dim=2)  # (B, T, C) each
        q, k, v = (t.view(B, T, self.n_head, C // self.n_head).transpose(1, 2)
                   for t in (q, k, v))  # (B, H, T, hd)
        if rope is not None:
            cos, sin = rope[0][:T], rope[1][:T]  # (T, hd/2)
            q, k = _rotate(q, cos, sin), _rotate(k, cos, sin)
        y = F.scaled_dot_product_attention(
            q, k, v, is_causal=True, dropout_p=self.dropout if self.training else 0.0)
        y = y.transpose(1, 2).contiguous().view(B, T, C)  # (B, T, C)
        return self.resid_drop(self.c_proj(y))


class Block(nn.Module):
    """Pre-LN transformer block: x + attn(ln(x)), then x + mlp(ln(x))."""

    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.ln_1 = nn.LayerNorm(cfg.n_embd)
        self.attn = CausalSelfAttention(cfg)
        self.ln_2 = nn.LayerNorm(cfg.n_embd)
        self.mlp = nn.Sequential(nn.Linear(cfg.n_embd, 4 * cfg.n_embd), nn.GELU(),
                                 nn.Linear(4 * cfg.n_embd, cfg.n_embd), nn.Dropout(cfg.dropout))

    def forward(self, x: torch.Tensor, rope: tuple[torch.Tensor, torch.Tensor] | None
                ) -> torch.Tensor:
        """x: (B, T, C) -> (B, T, C)."""
        x = x + self.attn(self.ln_1(x), rope)
        return x + self.mlp(self.ln_2(x))


class GPT(nn.Module):
    """A small GPT language model whose input tables are exported for serving."""

    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.cfg = cfg
        C = cfg.n_embd
        self.wte = nn.Embedding(cfg.table_rows, C, sparse=cfg.sparse_embeddings)
        self.wpe = (nn.Embedding(cfg.block_size, C, sparse=cfg.sparse_embeddings)
                    if cfg.position == "learned" else None)
        # Computed encodings are buffers, not parameters: nothing to learn or export.
        self.register_buffer("sinusoid", sinusoidal_table(cfg.block_size, C)
                             if cfg.position == "sinusoidal" else None, persistent=False)
        cos_sin = rope_tables(cfg.block_size, C // cfg.n_head) if cfg.position == "none" else None
        self.register_buffer("rope_cos", None if cos_sin is None else cos_sin[0],
                             persistent=False)
        self.register_buffer("rope_sin", None if cos_sin is None else cos_sin[1],
                             persistent=False)
        self.drop = nn.Dropout(cfg.dropout)
        self.blocks = nn.ModuleList(Block(cfg) for _ in range(cfg.n_layer))
        self.ln_f = nn.LayerNorm(C)
        self.lm_head = nn.Linear(C, cfg.table_rows, bias=False)
        self.apply(self._init_weights)
        for name, p in self.named_parameters():
            if name.endswith(("c_proj.weight", "mlp.2.weight")):
                # GPT-2: residual projections scaled by 1/sqrt(2 * n_layer).
                nn.init.normal_(p, mean=0.0, std=0.02 / math.sqrt(2 * cfg.n_layer))
        if cfg.tie_weights:
            self.lm_head.weight = self.wte.weight

    @staticmethod
    def _init_weights(module: nn.Module) -> None:
        if isinstance(module, nn.Linear):
            nn.init.normal_(module.weight, mean=0.0, std=0.02)
            if module.bias is not None:
                nn.init.zeros_(module.bias)
        elif isinstance(module, nn.Embedding):
            nn.init.normal_(module.weight, mean=0.0, std=0.02)

    def embedding_parameters(self) -> list[torch.Tensor]:
        """The input tables (token, and position when learned): no weight decay, maybe sparse."""
        return [self.wte.weight] + ([self.wpe.weight] if self.wpe is not None else [])

    def input_embeddings(self, idx: torch.Tensor) -> torch.Tensor:
        """What the server computes: token_table[ids] + position_table[0..T-1]; (B, T, C)."""
        T = idx.shape[1]
        if self.cfg.block_size < T:
            raise ValueError(f"T={T} > block_size {self.cfg.block_size}")
        x = self.wte(idx)  # (B, T, C)
        if self.wpe is not None:
            x = x + self.wpe(torch.arange(T, device=idx.device))  # (B, T, C)
        elif isinstance(self.sinusoid, torch.Tensor):
            x = x + self.sinusoid[:T]  # (B, T, C)
        return x

    def hidden_states(self, idx: torch.Tensor) -> torch.Tensor:
        """idx (B, T) int64 -> the final LayerNorm's output (B, T, C), the head's input."""
        x = self.drop(self.input_embeddings(idx))  # (B, T, C)
        rope = None
        if isinstance(self.rope_cos, torch.Tensor) and isinstance(self.rope_sin, torch.Tensor):
            rope = (self.rope_cos, self.rope_sin)
        for block in self.blocks:
            x = block(x, rope)  # (B, T, C)
        return self.ln_f(x)  # (B, T, C)

    def head_loss(self, hidden: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        """Mean cross-entropy of the LM head on hidden (B, T, C) against targets (B, T).

        With ``loss_chunk`` > 0 the logits are never materialised (training/loss.py);
        with 0 they are, and F.cross_entropy takes them (the reference path).
        """
        C = hidden.shape[-1]
        flat, goal = hidden.reshape(-1, C), targets.reshape(-1)  # (B*T, C), (B*T,)
        if self.cfg.loss_chunk:
            return linear_cross_entropy(flat, self.lm_head.weight, goal, self.cfg.loss_chunk,
                                        self.cfg.head_precision)
        logits = self.lm_head(flat)  # (B*T, table_rows)
        return F.cross_entropy(logits.float(), goal)

    def forward(self, idx: torch.Tensor, targets: torch.Tensor | None = None
                ) -> tuple[torch.Tensor | None, torch.Tensor | None]:
        """idx, targets: (B, T) int64 -> (logits (B, T, table_rows), None) without targets,
        (None, mean cross-entropy) with them: the training path never builds the logits."""
        hidden = self.hidden_states(idx)  # (B, T, C)
        if targets is None:
            return self.lm_head(hidden), None  # (B, T, table_rows)
        return None, self.head_loss(hidden, targets)


def matmul_params(model: GPT) -> int:
    """Parameters that take part in matmuls: the blocks, the final LayerNorm and the LM head,
    whose weight counts once, tied or not. The input tables are gathers, not matmuls: an
    untied token table is left out, a tied one is the head's matmul and counts."""
    gathers = {id(p) for p in model.embedding_parameters()} - {id(model.lm_head.weight)}
    return sum(p.numel() for p in model.parameters() if id(p) not in gathers)


def flops_per_token(model: GPT) -> float:
    """Training FLOPs per token, forward + backward: 6 N + 12 L C T (PaLM, appendix B, as
    nanoGPT's MFU estimate), N = ``matmul_params`` (biases and LayerNorms included, as both
    count them), the second term attention's scores and weighted sum at full context T.

    The one definition behind every MFU figure (training/bench: throughput and anchor).
    """
    cfg = model.cfg
    return 6 * matmul_params(model) + 12 * cfg.n_layer * cfg.n_embd * cfg.block_size

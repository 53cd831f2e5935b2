"""Position tables computed, not learned: the same bits in training and serving."""

from __future__ import annotations

import math

import torch

__all__ = ["sinusoidal_table"]


def sinusoidal_table(max_seq_len: int, dim: int) -> torch.Tensor:
    """Vaswani et al. (2017): PE[p, 2i] = sin(p / 10000^(2i/C)), PE[p, 2i+1] = cos(...)."""
    position = torch.arange(max_seq_len, dtype=torch.float64).unsqueeze(1)  # (T, 1)
    freq = torch.exp(torch.arange(0, dim, 2, dtype=torch.float64) * (-math.log(10000.0) / dim))
    table = torch.zeros(max_seq_len, dim, dtype=torch.float64)
    table[:, 0::2] = torch.sin(position * freq)  # (T, ceil(C/2))
    table[:, 1::2] = torch.cos(position * freq[: dim // 2])  # (T, floor(C/2))
    return table.to(torch.float32)

"""Client fixtures on top of tests/conftest.py's real server: the tables, read back."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path

import numpy as np
import pytest
import torch

from service.format.checkpoint import Checkpoint, read_checkpoint

Reference = Callable[..., np.ndarray]


@pytest.fixture(scope="session")
def tiny_checkpoint(tiny_repo: Path) -> Checkpoint:
    """The checkpoint `server` serves as "tiny", read by the real reader: the oracle."""
    return read_checkpoint(tiny_repo / "tiny" / "1")


@pytest.fixture(scope="session")
def reference(tiny_checkpoint: Checkpoint) -> Reference:
    """reference(ids, start=0, compose="token+position") -> the exact float32 rows (T, C)."""
    token_table = tiny_checkpoint.token_table.float()
    assert tiny_checkpoint.position_table is not None
    position_table = tiny_checkpoint.position_table.float()

    def rows(ids: Sequence[int], start: int = 0, compose: str = "token+position") -> np.ndarray:
        tok = token_table[torch.tensor(list(ids), dtype=torch.long)]  # (T, C)
        pos = position_table[start:start + len(ids)]  # (T, C)
        out = {"token+position": tok + pos, "token": tok, "position": pos}[compose]
        return out.numpy()

    return rows

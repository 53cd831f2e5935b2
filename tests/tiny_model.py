"""The tiny test model: sizes, deterministic tables, and a server over a repository."""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path

import torch

from service.config import ServerConfig
from service.local import ServerHandle, start_in_thread

VOCAB_SIZE = 50257  # GPT-2 / r50k_base n_vocab
TABLE_ROWS = 50304  # nanoGPT's padded row count
DIM = 16
MAX_SEQ_LEN = 64
TRAINED_ROWS = 1000  # tiny model: rows 0..999 "trained", the rest never updated

MakeCheckpoint = Callable[..., Path]


def tiny_tables(seed: int = 0, dim: int = DIM, max_seq_len: int = MAX_SEQ_LEN,
                table_rows: int = TABLE_ROWS) -> tuple[torch.Tensor, torch.Tensor]:
    """Deterministic random (token_table, position_table)."""
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(table_rows, dim, generator=g),
            torch.randn(max_seq_len, dim, generator=g))


def start(repo: Path, **overrides: object) -> ServerHandle:
    """A real server on free ports over ``repo``."""
    # EMBED_TEST_DEVICE=cuda runs the same tests on a GPU (scripts/gpu.sh on a lent machine).
    device = os.environ.get("EMBED_TEST_DEVICE", "cpu")
    settings: dict[str, object] = {"grpc_port": 0, "http_port": 0, "metrics_port": 0,
                                   "poll_seconds": 0, "default_model": "tiny", "device": device,
                                   # a failing version is refused at once (not "not ready
                                   # yet"): tests/service/engine/test_copy_in.py sets a grace
                                   "load_grace_seconds": 0,
                                   **overrides}
    config = ServerConfig(model_repository=repo, **settings)  # type: ignore[arg-type]
    return start_in_thread(config)

"""Shared fixtures: real checkpoints written by the real writer, real servers on port 0."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
import torch

from service.checkpoint import write_checkpoint
from service.server import ServerHandle
from service.tokenizer import default_ranks_path, gpt2_spec
from tests.tiny_model import (
    DIM,
    MAX_SEQ_LEN,
    TABLE_ROWS,
    TRAINED_ROWS,
    VOCAB_SIZE,
    MakeCheckpoint,
    start,
    tiny_tables,
)


@pytest.fixture(scope="session")
def gpt2_ranks() -> Path:
    """The verified GPT-2 BPE ranks (scripts/fetch_tokenizer.py put them there)."""
    path = default_ranks_path()
    if not path.exists():
        pytest.fail(f"{path} missing: run scripts/setup.sh (make test does)")
    return path


@pytest.fixture(scope="session")
def make_checkpoint(gpt2_ranks: Path) -> MakeCheckpoint:
    """Write a random-table checkpoint with the GPT-2 tokenizer; returns the version dir."""

    def make(repo: Path, name: str = "tiny", version: int = 1, seed: int = 0,
             position: str = "learned", dim: int = DIM, max_seq_len: int = MAX_SEQ_LEN,
             row_updates: bool = True) -> Path:
        token_table, position_table = tiny_tables(seed, dim, max_seq_len)
        updates = None
        if row_updates:
            updates = torch.zeros(TABLE_ROWS, dtype=torch.int64)
            updates[:TRAINED_ROWS] = 7
        out = repo / name / str(version)
        write_checkpoint(out, token_table=token_table,
                         position_table=position_table if position == "learned" else None,
                         position=position, max_seq_len=max_seq_len, vocab_size=VOCAB_SIZE,
                         tokenizer_spec=gpt2_spec(), tokenizer_ranks=gpt2_ranks,
                         row_updates=updates, provenance={"source": "test", "seed": seed})
        return out

    return make


@pytest.fixture(scope="session")
def tiny_repo(tmp_path_factory: pytest.TempPathFactory, make_checkpoint: MakeCheckpoint) -> Path:
    """A repository with model "tiny" (learned) and "rope" (position none)."""
    repo = tmp_path_factory.mktemp("models")
    make_checkpoint(repo, "tiny")
    make_checkpoint(repo, "rope", position="none", seed=1)
    return repo


@pytest.fixture(scope="session")
def server(tiny_repo: Path) -> Iterator[ServerHandle]:
    """One shared server over the tiny repository (read-only tests only)."""
    handle = start(tiny_repo)
    yield handle
    handle.stop()

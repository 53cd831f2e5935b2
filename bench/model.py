"""The benchmark checkpoint: GPT-2 sized tables with random values, cached between runs."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

__all__ = ["MODEL_NAME", "VOCAB_SIZE", "ensure_model"]

MODEL_NAME = "bench"
# GPT-2's tokenizer: the ids the load generator sends are drawn from 0 .. VOCAB_SIZE-1.
VOCAB_SIZE = 50257
_SHAPE_FILE = "bench-shape.json"


def ensure_model(repo: Path, dim: int, max_seq_len: int, seed: int = 0) -> Path:
    """Return a model repository holding ``bench/1`` with [VOCAB_SIZE, dim] tables.

    The checkpoint is written once by the real writer and reused while its shape matches;
    a different shape replaces it.
    """
    shape = {"vocab_size": VOCAB_SIZE, "dim": dim, "max_seq_len": max_seq_len, "seed": seed}
    version_dir = repo / "models" / MODEL_NAME / "1"
    stamp = repo / _SHAPE_FILE
    if version_dir.is_dir() and stamp.is_file() and json.loads(stamp.read_text()) == shape:
        return repo
    # torch only here: the load generator and the ceiling server never import it.
    import torch

    from service.format.writer import write_checkpoint
    from service.format.tokenizer import default_ranks_path, gpt2_spec

    shutil.rmtree(repo, ignore_errors=True)
    gen = torch.Generator().manual_seed(seed)
    token_table = torch.randn(VOCAB_SIZE, dim, generator=gen)  # (vocab_size, C)
    position_table = torch.randn(max_seq_len, dim, generator=gen) * 0.1  # (max_seq_len, C)
    write_checkpoint(version_dir, token_table=token_table, position="learned",
                     max_seq_len=max_seq_len, vocab_size=VOCAB_SIZE,
                     tokenizer_spec=gpt2_spec(), tokenizer_ranks=default_ranks_path(),
                     position_table=position_table,
                     provenance={"source": "bench: random tables"})
    stamp.write_text(json.dumps(shape))
    return repo

"""The repository the soak's REST and slow-reader tests serve: the soak model and the wide
model, each published with its oracle."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from bench.soak.oracle import Oracle, Publisher
from bench.soak.slow import WIDE_MODEL, WIDE_VOCAB
from service.format.tokenizer import default_ranks_path, gpt2_spec, load_tokenizer


def publish_soak_models(root: Path, L: int, T: int, C: int) -> tuple[Oracle, Oracle, Any]:
    """``soak`` (C=8, L positions) and the wide model (T positions, C wide) under
    ``root/models``; returns their oracles and the tokenizer."""
    tokenizer = load_tokenizer(gpt2_spec(), default_ranks_path())
    oracle = Oracle(L, tokenizer.encode)
    Publisher(root, oracle, dim=8, max_seq_len=L).publish()
    wide = Oracle(T, tokenizer.encode, WIDE_MODEL)
    Publisher(root, wide, C, T, WIDE_VOCAB, tokenizer=False).publish()
    return oracle, wide, tokenizer

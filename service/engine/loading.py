"""One model version, loaded: verified tables on the device, its tokenizer, its statistics.

``load_model`` reads a version directory (every file's sha256 checked, ``service.format``)
into a ``LoadedModel``, or raises ``CheckpointError`` naming what is wrong; the repository
(``repository.py``) decides which versions to load and when.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import torch

from service.engine.tables import EmbeddingTables
from service.errors import FailedPrecondition
from service.format.checkpoint import Checkpoint, read_checkpoint
from service.format.hf_tokenizer import TextTokenizer, load_text_tokenizer
from service.format.positions import sinusoidal_table
from service.format.tensorfile import CheckpointError

__all__ = ["LoadedModel", "load_model"]

_MAX_SINUSOIDAL = 1 << 28  # elements of a computed position table (1 GiB of fp32)


@dataclass(frozen=True)
class LoadedModel:
    """One served model version: tables on the device, its tokenizer, its statistics."""

    name: str
    version: int
    checkpoint: Checkpoint
    text_tokenizer: TextTokenizer | None  # None: an ids-only model
    tables: EmbeddingTables
    untrained: torch.Tensor | None  # (table_rows,) bool: never updated in training

    @property
    def checkpoint_id(self) -> str:
        """sha256 of manifest.json."""
        return self.checkpoint.checkpoint_id

    @property
    def tokenizer(self) -> TextTokenizer:
        """The model's tokenizer; FAILED_PRECONDITION for an ids-only model, so every
        RPC that needs text (Embed text, Tokenize, Detokenize, OIP text) refuses alike."""
        if self.text_tokenizer is None:
            raise FailedPrecondition(f"model {self.name!r} was imported without a tokenizer "
                                     f"(ids-only): send token_ids, not text")
        return self.text_tokenizer


def load_model(name: str, version_dir: Path, device: torch.device,
               table_dtype: torch.dtype | None) -> LoadedModel:
    """Verify and load one version directory (CheckpointError/ValueError when invalid).

    ``table_dtype`` None keeps the stored dtype (the tables stay memory maps on CPU).
    """
    ckpt = read_checkpoint(version_dir)
    m = ckpt.manifest
    tokenizer = None
    if m.tokenizer is not None and ckpt.tokenizer_path is not None:
        tokenizer = load_text_tokenizer(m.tokenizer, ckpt.tokenizer_path)
        # tiktoken: its n_vocab is the vocabulary. A tokenizer.json may cover fewer ids
        # than the model's rows (Qwen2 pads its table), never more.
        bad = (tokenizer.n_vocab > m.vocab_size if m.tokenizer.kind == "hf"
               else tokenizer.n_vocab != m.vocab_size)
        if bad:
            raise CheckpointError(f"{version_dir}: tokenizer has {tokenizer.n_vocab} tokens, "
                                  f"manifest vocab_size is {m.vocab_size}")
    position_table = ckpt.position_table
    if m.position == "sinusoidal":
        if m.max_seq_len * m.dim > _MAX_SINUSOIDAL:
            raise CheckpointError(f"{version_dir.name}: a sinusoidal table of max_seq_len "
                                  f"{m.max_seq_len} x dim {m.dim} is too large")
        position_table = sinusoidal_table(m.max_seq_len, m.dim)  # (max_seq_len, C)
    tables = EmbeddingTables(ckpt.token_table, position_table, device, table_dtype,
                             m.rules, ckpt.rule_tensors, ckpt.token_max_abs)
    untrained = None if ckpt.row_updates is None else ckpt.row_updates == 0  # (rows,)
    return LoadedModel(name, int(version_dir.name), ckpt, tokenizer, tables, untrained)

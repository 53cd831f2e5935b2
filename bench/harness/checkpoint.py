"""The benchmarks' checkpoints: random tables of real sizes, by the real writer."""

from __future__ import annotations

import json
import shutil
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import torch

__all__ = ["GPT2", "LLAMA3", "MODEL_NAME", "VOCAB_SIZE", "Shape", "ensure_model",
           "random_tables", "write_random"]

MODEL_NAME = "bench"
# GPT-2's tokenizer: request ids are drawn from 0 .. VOCAB_SIZE-1.
VOCAB_SIZE = 50257
_STAMP = "bench-shape.json"


@dataclass(frozen=True)
class Shape:
    """A model's tables: rows x C in ``dtype``; learned positions up to ``max_seq_len``
    (else none, as Llama's RoPE); GPT-2's tokenizer when ``rows`` is its vocabulary."""

    rows: int
    dim: int
    max_seq_len: int
    dtype: str = "float32"
    learned: bool = True
    family: str = ""  # an imported family's name (its rules: none here)

    @property
    def table_bytes(self) -> int:
        """Bytes of both tables as stored."""
        per = 2 if self.dtype == "bfloat16" else 4
        return (self.rows + (self.max_seq_len if self.learned else 0)) * self.dim * per


GPT2 = Shape(VOCAB_SIZE, 768, 1024)
LLAMA3 = Shape(128256, 4096, 131072, "bfloat16", learned=False, family="llama")


def random_tables(rows: int, dim: int, max_seq_len: int, seed: int, learned: bool = True,
                  position_scale: float = 1.0) -> tuple[torch.Tensor, torch.Tensor | None]:
    """fp32 (token_table (rows, C), position_table (max_seq_len, C) or None) from ``seed``."""
    import torch  # only here: the load generator never needs it

    gen = torch.Generator().manual_seed(seed)
    token_table = torch.randn(rows, dim, generator=gen)
    if not learned:
        return token_table, None
    return token_table, torch.randn(max_seq_len, dim, generator=gen) * position_scale


def write_random(version_dir: Path, rows: int, dim: int, max_seq_len: int, seed: int, *,
                 tokenizer: bool, dtype: str = "float32", learned: bool = True,
                 position_scale: float = 1.0, family: str = "",
                 provenance: dict[str, Any] | None = None
                 ) -> tuple[torch.Tensor, torch.Tensor | None]:
    """A version of ``random_tables`` in ``dtype`` (GPT-2's tokenizer or ids only); its
    tables as written."""
    import torch

    from service.format.rules import Rules
    from service.format.tokenizer import default_ranks_path, gpt2_spec
    from service.format.writer import write_checkpoint

    token_table, position_table = random_tables(rows, dim, max_seq_len, seed, learned,
                                                position_scale)
    token_table = token_table.to(getattr(torch, dtype))
    if position_table is not None:
        position_table = position_table.to(getattr(torch, dtype))
    write_checkpoint(version_dir, token_table=token_table,
                     position="learned" if learned else "none", position_table=position_table,
                     max_seq_len=max_seq_len, vocab_size=rows,
                     tokenizer_spec=gpt2_spec() if tokenizer else None,
                     tokenizer_ranks=default_ranks_path() if tokenizer else None,
                     family=family, rules=Rules() if family else None, provenance=provenance)
    return token_table, position_table


def ensure_model(repo: Path, shape: Shape, model: str = MODEL_NAME, seed: int = 0) -> Path:
    """A model repository at ``repo`` whose ``models/<model>/1`` has tables of ``shape``;
    kept while its shape matches, else written again. Returns ``repo``."""
    stamp = repo / _STAMP
    want = {**asdict(shape), "model": model, "seed": seed}
    version_dir = repo / "models" / model / "1"
    if version_dir.is_dir() and stamp.is_file() and json.loads(stamp.read_text()) == want:
        return repo
    shutil.rmtree(repo, ignore_errors=True)
    write_random(version_dir, shape.rows, shape.dim, shape.max_seq_len, seed,
                 tokenizer=shape.rows == VOCAB_SIZE, dtype=shape.dtype, learned=shape.learned,
                 position_scale=0.1, family=shape.family,
                 provenance={"source": "bench: random tables"})
    stamp.write_text(json.dumps(want))
    return repo

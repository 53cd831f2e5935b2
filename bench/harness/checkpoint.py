"""The benchmarks' checkpoints: random tables of real sizes, written by the real writer and
cached between runs (rewritten when their shape changes)."""

from __future__ import annotations

import json
import shutil
from dataclasses import asdict, dataclass
from pathlib import Path

__all__ = ["GPT2", "LLAMA3", "MODEL_NAME", "VOCAB_SIZE", "Shape", "ensure_model"]

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


def ensure_model(repo: Path, shape: Shape, model: str = MODEL_NAME, seed: int = 0) -> Path:
    """A model repository at ``repo`` whose ``models/<model>/1`` has tables of ``shape``;
    kept while its shape matches, else written again. Returns ``repo``."""
    stamp = repo / _STAMP
    want = {**asdict(shape), "model": model, "seed": seed}
    version_dir = repo / "models" / model / "1"
    if version_dir.is_dir() and stamp.is_file() and json.loads(stamp.read_text()) == want:
        return repo
    import torch  # only here: the load generator never needs it

    from service.format.rules import Rules
    from service.format.tokenizer import default_ranks_path, gpt2_spec
    from service.format.writer import write_checkpoint

    shutil.rmtree(repo, ignore_errors=True)
    dtype = getattr(torch, shape.dtype)
    gen = torch.Generator().manual_seed(seed)
    token_table = torch.randn(shape.rows, shape.dim, generator=gen).to(dtype)  # (rows, C)
    position_table = None  # none learned: RoPE's models
    if shape.learned:
        position_table = (torch.randn(shape.max_seq_len, shape.dim, generator=gen) * 0.1
                          ).to(dtype)  # (max_seq_len, C)
    gpt2 = shape.rows == VOCAB_SIZE
    write_checkpoint(version_dir, token_table=token_table,
                     position="learned" if shape.learned else "none",
                     position_table=position_table,
                     max_seq_len=shape.max_seq_len, vocab_size=shape.rows,
                     tokenizer_spec=gpt2_spec() if gpt2 else None,
                     tokenizer_ranks=default_ranks_path() if gpt2 else None,
                     family=shape.family, rules=Rules() if shape.family else None,
                     provenance={"source": "bench: random tables"})
    stamp.write_text(json.dumps(want))
    return repo

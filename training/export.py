"""Export a trained GPT as the next version of ``<repository>/<name>/``.

The serving contract is service/format/checkpoint.py: the token table ``wte.weight``, the
position table ``wpe.weight`` when positions are learned (sinusoidal is recomputed by the
server, RoPE has none), the tokenizer's ranks, the per-row update counts, and the rest of
the LM (blocks, ln_f, lm_head) for downstream users. Trainer state never goes here.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from service.format.manifest import Manifest
from service.format.tokenizer import TokenizerSpec
from service.format.writer import next_version, write_checkpoint
from training.config import TrainConfig
from training.train import TrainResult

__all__ = ["export_model", "provenance"]

_TABLES = ("wte.weight", "wpe.weight")


def provenance(result: TrainResult, cfg: TrainConfig) -> dict[str, Any]:
    """What the manifest records about how these tables were made."""
    return {"source": "training", "step": result.step, "tokens": result.tokens,
            "val_loss": result.val_loss, "unigram_val_loss": result.unigram_val_loss,
            "train_loss": result.train_loss, "config": cfg.to_dict(),
            "corpus_sha256": result.corpus_sha256, "seed": cfg.seed}


def export_model(result: TrainResult, cfg: TrainConfig, tokenizer_spec: TokenizerSpec,
                 tokenizer_ranks: Path, vocab_size: int) -> tuple[Path, Manifest]:
    """Write version N+1 atomically; return its directory and manifest."""
    model = result.model
    model_dir = Path(cfg.out_repository) / cfg.name
    version_dir = model_dir / str(next_version(model_dir))
    state = model.state_dict()
    rest: dict[str, torch.Tensor] = {k: v.float() for k, v in state.items()
                                     if k not in _TABLES}
    if cfg.tie_weights:
        rest.pop("lm_head.weight", None)  # the same tensor as token_embedding (HF does too)
    position_table = model.wpe.weight.float() if model.wpe is not None else None
    manifest = write_checkpoint(
        version_dir,
        token_table=model.wte.weight.detach().float(),  # (table_rows, C)
        position=cfg.position,
        max_seq_len=cfg.block_size,
        vocab_size=vocab_size,
        tokenizer_spec=tokenizer_spec,
        tokenizer_ranks=tokenizer_ranks,
        position_table=position_table,  # (block_size, C) or None
        row_updates=result.row_updates,
        model_tensors=rest,
        provenance=provenance(result, cfg),
    )
    return version_dir, manifest

"""A repository with one model per rule the server applies, for the CUDA write's
bit-for-bit tests (on CPU tables here, on GPU tables in the gpu-marked tests).

Written by the real checkpoint writer with each family's rules and rule tensors (what the
HF importer writes for Gemma, BioGPT, Granite, OPT-350m, BERT and BLOOM, whose equality
with transformers is tests/training/importers/test_families.py's), so it needs no transformers:
the GPU image has none.
"""

from __future__ import annotations

import math
from pathlib import Path

import torch

from service.format.rules import Rules
from service.format.writer import write_checkpoint

__all__ = ["FAMILIES", "FAMILY_IDS", "REDUCING", "family_repo"]

VOCAB, DIM, HIDDEN, MAX_POS = 96, 8, 24, 40
# name -> (rules, position kind, stored dtype). One of each rule: a plain lookup with learned
# positions (GPT-2) and without (Llama), a scale in the table dtype (Gemma), a scale as a
# Python float (BioGPT), an input scale (Granite), project_in with a position offset
# (OPT-350m: 8-wide token rows), token type + LayerNorm (BERT), LayerNorm without positions
# (BLOOM); and bf16-stored ones, served in bf16, whose rules round in bf16.
FAMILIES: dict[str, tuple[Rules, str, torch.dtype]] = {
    "plain": (Rules(), "learned", torch.float32),
    "rope": (Rules(), "none", torch.float32),
    "scale": (Rules(embed_scale=math.sqrt(HIDDEN)), "none", torch.float32),
    "scale-float": (Rules(embed_scale=math.sqrt(HIDDEN), embed_scale_float=True), "learned",
                    torch.float32),
    "input-scale": (Rules(input_scale=0.15), "none", torch.float32),
    "project-in": (Rules(position_offset=2, project_in=True), "learned", torch.float32),
    "token-type-ln": (Rules(token_type=True, layernorm_eps=1e-12), "learned", torch.float32),
    "ln": (Rules(layernorm_eps=1e-5), "none", torch.float32),
    "plain-bf16": (Rules(), "learned", torch.bfloat16),
    "scale-bf16": (Rules(embed_scale=math.sqrt(HIDDEN)), "none", torch.bfloat16),
    "project-in-bf16": (Rules(position_offset=2, project_in=True), "learned", torch.bfloat16),
    "token-type-ln-bf16": (Rules(token_type=True, layernorm_eps=1e-12), "learned",
                           torch.bfloat16),
}
# Rules that reduce (a GEMM, a LayerNorm): a GPU sums in another order than a CPU.
REDUCING = {name for name, (rules, _, _) in FAMILIES.items()
            if rules.project_in or rules.layernorm_eps is not None}
FAMILY_IDS = [5, 17, 0, VOCAB - 1, 42, 42, 7, 63, 1, 88, 30]  # T=11: the last row, a repeat


def _rule_tensors(rules: Rules, g: torch.Generator, dtype: torch.dtype
                  ) -> dict[str, torch.Tensor]:
    shapes = {"project_in_weight": (HIDDEN, DIM), "token_type_embedding": (1, HIDDEN),
              "layernorm_weight": (HIDDEN,), "layernorm_bias": (HIDDEN,)}
    return {name: (torch.randn(*shapes[name], generator=g) * 0.5).to(dtype)
            for name in rules.tensors()}


def family_repo(tmp: Path) -> Path:
    """Each of FAMILIES, random tables and rule tensors, ids-only, as ``<name>/1``."""
    repo = tmp / "models"
    for seed, (name, (rules, position, dtype)) in enumerate(FAMILIES.items()):
        g = torch.Generator().manual_seed(seed)
        width = DIM if rules.project_in else HIDDEN
        positions = MAX_POS + rules.position_offset
        write_checkpoint(
            repo / name / "1", token_table=(torch.randn(VOCAB, width, generator=g) * 0.5
                                            ).to(dtype),
            position_table=(None if position == "none" else
                            (torch.randn(positions, HIDDEN, generator=g) * 0.5).to(dtype)),
            position=position, max_seq_len=MAX_POS, vocab_size=VOCAB, tokenizer_spec=None,
            tokenizer_ranks=None, family=name, rules=rules,
            hidden_size=HIDDEN if rules.project_in else 0,
            rule_tensors=_rule_tensors(rules, g, dtype),
            provenance={"source": "test: one model per rule"})
    return repo

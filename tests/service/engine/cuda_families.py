"""A repository of HF families, one per rule the server applies, for the CUDA write's
bit-for-bit tests (on CPU tables here, on GPU tables in the gpu-marked tests)."""

from __future__ import annotations

from pathlib import Path

import torch

from tests.hf_models import MAX_POS, VOCAB, build, save
from training.importers import main as import_main

__all__ = ["FAMILIES", "FAMILY_IDS", "family_repo"]

# model name in the repository -> (family, stored dtype). One of each rule: plain learned
# positions (gpt2), none (llama), scale in the table dtype (gemma), a Python-float scale
# (biogpt), an input scale (granite), project_in and a position offset (opt-proj),
# token type + LayerNorm (bert), LayerNorm without positions (bloom); bf16-stored ones
# served in bf16, whose rules round in bf16.
FAMILIES: dict[str, tuple[str, torch.dtype]] = {
    "gpt2": ("gpt2", torch.float32),
    "llama": ("llama", torch.float32),
    "gemma": ("gemma", torch.float32),
    "biogpt": ("biogpt", torch.float32),
    "granite": ("granite", torch.float32),
    "opt-proj": ("opt-proj", torch.float32),
    "bert": ("bert", torch.float32),
    "bloom": ("bloom", torch.float32),
    "gpt2-bf16": ("gpt2", torch.bfloat16),
    "gemma-bf16": ("gemma", torch.bfloat16),
    "opt-proj-bf16": ("opt-proj", torch.bfloat16),
    "bert-bf16": ("bert", torch.bfloat16),
}
FAMILY_IDS = [5, 17, 0, VOCAB - 1, 42, 42, 7, 63, 1, 88, 30]  # T=11: the last row, a repeat


def family_repo(tmp: Path) -> Path:
    """Each of FAMILIES built at random, saved and imported by the real importer."""
    repo = tmp / "models"
    for seed, (name, (family, dtype)) in enumerate(FAMILIES.items()):
        src = save(build(family, seed=seed, dtype=dtype), tmp / "src" / name)
        args = ["hf", str(src), "--out", str(repo / name / "1")]
        if family == "bloom":
            args += ["--max-seq-len", str(MAX_POS)]
        assert import_main(args) == 0, name
    return repo

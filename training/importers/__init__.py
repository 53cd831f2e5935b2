"""Importers: pretrained embedding tables from other formats into a model repository.

Each importer reads only the tensors the input embeddings need (token table, and the
position table, LayerNorm, projection or token-type row where the family has one) through
an explicit name map, checks their shapes against the source's own config, and writes a
version with ``service.format.checkpoint.write_checkpoint`` (atomic, hashed). Sources are
read without unpickling: safetensors for Hugging Face, ``torch.load(weights_only=True)``
for nanoGPT's ``ckpt.pt``; nothing from a model directory is ever imported or run.

    source.py          reading safetensors directories, name resolution, shape checks
    families.py        the hand-written HF model types: names, config keys, rules
    hf.py              an HF directory -> tables + rules (hand-written, else discovered)
    reference.py       the family's own transformers model, cut down to its embeddings
    candidates.py      the rule vocabulary's candidates for one model
    discovery.py       the one candidate that reproduces the reference bit for bit
    tokenizer_json.py  tokenizer.json + tokenizer_config.json -> what AutoTokenizer builds
    spm_tokenizer.py   a SentencePiece tokenizer.model, converted by transformers
    nanogpt.py         nanoGPT's ckpt.pt
    untrusted.py       a model directory is data: code it names is refused, transformers
                       is called offline with remote code refused and no standard input
    options.py         the options, each checked before any work
    cli.py             the command line and the writer
"""

from __future__ import annotations

from training.importers.cli import LLAMA3_PAT_STR, main, write_imported
from training.importers.families import FAMILIES, Family
from training.importers.hf import load_hf
from training.importers.nanogpt import NANOGPT_NAMES, load_nanogpt
from training.importers.source import ImporterError, SourceTables, resolve_names

__all__ = ["FAMILIES", "LLAMA3_PAT_STR", "NANOGPT_NAMES", "Family", "ImporterError",
           "SourceTables", "load_hf", "load_nanogpt", "main", "resolve_names",
           "write_imported"]

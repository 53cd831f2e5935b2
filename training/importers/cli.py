"""``python -m training.importers``: the command line, the tokenizer choice, the writer.

    python -m training.importers hf DIR --out models/NAME/VERSION [--max-seq-len N]
                                                     [--discover]
    python -m training.importers hf-gpt2 DIR ...    (alias of hf: model_type gpt2 only,
                                                      GPT-2 ranks when DIR has no tokenizer)
    python -m training.importers hf-llama DIR ...   (alias of hf: model_type llama only)
    python -m training.importers nanogpt ckpt.pt --out models/nanogpt/1
"""

from __future__ import annotations

import argparse
import hashlib
import json
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path

import torch
from safetensors import SafetensorError

from service.format.checkpoint import MANIFEST_FILE, Manifest
from service.format.tokenizer import (
    GPT2_PAT_STR,
    GPT2_SPECIAL_TOKENS,
    TokenizerSpec,
    default_ranks_path,
    gpt2_spec,
    load_tokenizer,
)
from service.format.writer import write_checkpoint
from training.importers.hf import load_hf
from training.importers.nanogpt import load_nanogpt
from training.importers.source import ImporterError, SourceTables
from training.importers.spm_tokenizer import convert
from training.importers.tokenizer_json import ResolvedTokenizer, resolve

__all__ = ["LLAMA3_PAT_STR", "main", "write_imported"]

# Llama 3's pre-tokenizer regex (its tiktoken-format tokenizer.model uses this split).
LLAMA3_PAT_STR = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}|"
                  r" ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")
_DTYPES = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}
_HF_COMMANDS = {"hf": None, "hf-gpt2": "gpt2", "hf-llama": "llama"}  # alias -> model_type

# What a version's tokenizer is: a tiktoken ranks file, a resolved tokenizer.json, or none.
Choice = tuple[TokenizerSpec, Path] | ResolvedTokenizer | None


def write_imported(out: Path, tables: SourceTables, tokenizer: Choice,
                   dtype: str = "keep") -> Manifest:
    """Check the table covers the tokenizer's ids, then write the version atomically."""
    if not out.name.isdigit() or int(out.name) <= 0:
        raise ImporterError(f"--out {out}: must be models/<name>/<version>, version a "
                            f"positive integer")
    table_rows = tables.token_table.shape[0]
    token_name = tables.names["token_embedding"]
    vocab_size = tables.vocab_size or table_rows  # ids the model itself accepts
    token_table = tables.token_table
    if dtype != "keep":
        token_table = token_table.to(_DTYPES[dtype])
    elif token_table.dtype not in _DTYPES.values():
        raise ImporterError(f"{token_name}: dtype {token_table.dtype} not storable; pass "
                            f"--dtype float32|float16|bfloat16")
    rule_tensors = {k: v.to(token_table.dtype) for k, v in tables.rule_tensors.items()}
    provenance = {**tables.provenance, "tensor_names": dict(tables.names)}
    with tempfile.TemporaryDirectory() as tmp:
        spec: TokenizerSpec | None = None
        path: Path | None = None
        if isinstance(tokenizer, ResolvedTokenizer):
            if tokenizer.n_vocab > table_rows:
                raise ImporterError(f"{token_name}: {table_rows} rows < the tokenizer.json's "
                                    f"{tokenizer.n_vocab} ids: some ids would have no row")
            spec, path = tokenizer.spec, Path(tmp) / tokenizer.spec.file
            path.write_text(tokenizer.data, encoding="utf-8")
            provenance.update(tokenizer.provenance)
        elif tokenizer is not None:
            spec, path = tokenizer
            n_vocab = load_tokenizer(spec, path).n_vocab
            if table_rows < n_vocab:
                raise ImporterError(
                    f"{token_name}: {table_rows} rows < the tokenizer's n_vocab {n_vocab} "
                    f"({path.name}): ids {table_rows}..{n_vocab - 1} would have no row; "
                    f"import with the tokenizer the model was trained with")
            vocab_size = n_vocab  # a tiktoken vocabulary: its ids are the valid ones
        return write_checkpoint(
            out, token_table=token_table, position=tables.position,
            position_table=tables.position_table, max_seq_len=tables.max_seq_len,
            vocab_size=vocab_size, tokenizer_spec=spec, tokenizer_ranks=path,
            provenance=provenance, family=tables.family, rules=tables.rules,
            hidden_size=tables.hidden_size, rule_tensors=rule_tensors)


def _tiktoken_choice(args: argparse.Namespace, family: str) -> tuple[TokenizerSpec, Path]:
    """A tiktoken ranks file from the flags (GPT-2's rules for GPT-2, Llama 3's else)."""
    gpt2 = family in ("gpt2", "") and args.pat_str is None and args.special_tokens is None
    if gpt2:
        return gpt2_spec(sha256=""), Path(args.tokenizer)
    special = args.special_tokens or ("{}" if family != "gpt2"
                                      else json.dumps(GPT2_SPECIAL_TOKENS))
    if Path(special).is_file():
        special = Path(special).read_text()
    try:
        special_tokens = {str(k): int(v) for k, v in json.loads(special).items()}
    except (ValueError, AttributeError) as e:
        raise ImporterError(f"--special-tokens: need a JSON object of name -> id ({e})") from e
    pat_str = args.pat_str or (GPT2_PAT_STR if family == "gpt2" else LLAMA3_PAT_STR)
    encoding = args.encoding or ("gpt2" if family == "gpt2" else "llama3")
    return (TokenizerSpec(file="tokenizer.tiktoken", encoding=encoding, pat_str=pat_str,
                          special_tokens=special_tokens), Path(args.tokenizer))


def _choose_tokenizer(args: argparse.Namespace, tables: SourceTables) -> Choice:
    """--no-tokenizer; --tokenizer FILE.tiktoken; DIR/tokenizer.json; DIR/tokenizer.model
    (SentencePiece, converted by transformers); else ids-only."""
    if args.command == "nanogpt":
        if args.tokenizer is None:
            return gpt2_spec(), default_ranks_path()  # sha256 checked on load
        return gpt2_spec(sha256=""), Path(args.tokenizer)
    if args.no_tokenizer:
        return None
    if args.tokenizer is not None:
        return _tiktoken_choice(args, tables.family)
    resolved = resolve(args.dir, tables.family) or convert(args.dir, tables.family)
    if resolved is not None:
        return resolved
    if args.command == "hf-gpt2":
        return gpt2_spec(), default_ranks_path()  # GPT-2's own ranks, sha256 checked
    print(f"note: {args.dir} has no tokenizer.json or tokenizer.model: importing ids-only "
          f"(text requests will get FAILED_PRECONDITION)", file=sys.stderr)
    return None


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m training.importers", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="command", required=True)
    helps = {"hf": "a Hugging Face model directory (config.json + safetensors), any "
                   "supported model_type",
             "hf-gpt2": "alias of hf for model_type gpt2 (GPT-2 ranks if no tokenizer.json)",
             "hf-llama": "alias of hf for model_type llama",
             "nanogpt": "nanoGPT ckpt.pt (loaded with weights_only=True)"}
    for name, help_ in helps.items():
        s = sub.add_parser(name, help=help_)
        s.add_argument("ckpt" if name == "nanogpt" else "dir", type=Path)
        s.add_argument("--out", type=Path, help="models/<name>/<version> (required to write)")
        s.add_argument("--dtype", choices=["keep", *_DTYPES], default="keep")
        s.add_argument("--name-map-check", action="store_true",
                       help="resolve names and check shapes, print the map, write nothing")
        s.add_argument("--tokenizer", help=".tiktoken ranks file (default: DIR/tokenizer.json)")
        if name == "nanogpt":
            continue
        s.add_argument("--no-tokenizer", action="store_true",
                       help="import ids-only even when DIR has a tokenizer.json")
        s.add_argument("--max-seq-len", type=int, help="context length where config.json "
                       "states none (BLOOM); families without a position table only")
        s.add_argument("--pat-str", help="pre-tokenizer regex of a --tokenizer .tiktoken")
        s.add_argument("--special-tokens", help="JSON object (or file) of name -> id")
        s.add_argument("--encoding", help="encoding name of a --tokenizer .tiktoken")
        s.add_argument("--discover", action="store_true",
                       help="find the rule by running the family's transformers code even "
                            "for a hand-written family, and refuse unless both agree "
                            "(model types without an entry are always discovered)")
    return p


def main(argv: Sequence[str] | None = None) -> int:
    """CLI entry point; returns the exit status (2 with a message on a bad source)."""
    parser = _parser()
    args = parser.parse_args(argv)
    if args.out is None and not args.name_map_check:
        parser.error("--out models/<name>/<version> is required (or --name-map-check)")
    try:
        if args.command in _HF_COMMANDS:
            tables = load_hf(args.dir, args.max_seq_len, _HF_COMMANDS[args.command],
                             discover=args.discover)
        else:
            tables = load_nanogpt(args.ckpt)
        if args.name_map_check:
            read = {"token_embedding": tables.token_table,
                    "position_embedding": tables.position_table, **tables.rule_tensors}
            for ours, src in tables.names.items():
                t = read.get(ours)
                if t is not None:
                    dtype = str(t.dtype).removeprefix("torch.")
                    print(f"{src} -> {ours} {list(t.shape)} {dtype}")
            return 0
        manifest = write_imported(args.out, tables, _choose_tokenizer(args, tables),
                                  args.dtype)
    except (ImporterError, SafetensorError, OSError, ValueError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    checkpoint_id = hashlib.sha256((args.out / MANIFEST_FILE).read_bytes()).hexdigest()
    tokenizer = "none (ids-only)" if manifest.tokenizer is None else (
        f"{manifest.tokenizer.kind}:{manifest.tokenizer.file}")
    print(f"wrote {args.out}: family={manifest.family or '-'} rules="
          f"{manifest.rules.describe()!r} vocab_size={manifest.vocab_size} table_rows="
          f"{manifest.table_rows} dim={manifest.dim} hidden_size={manifest.width} "
          f"max_seq_len={manifest.max_seq_len} position={manifest.position} "
          f"dtype={manifest.dtype} tokenizer={tokenizer} checkpoint_id={checkpoint_id}")
    return 0

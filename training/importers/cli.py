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
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path

import torch

from client.flags import internal_error
from service.format.checkpoint import is_version_name
from service.format.manifest import MANIFEST_FILE, Manifest
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
from training.importers.options import HF_COMMANDS, PROG, build_parser, parse
from training.importers.source import ImporterError, SourceTables, reason
from training.importers.spm_tokenizer import convert
from training.importers.tokenizer_json import ResolvedTokenizer, resolve

__all__ = ["LLAMA3_PAT_STR", "main", "write_imported"]

_DESCRIPTION = """\
Import another project's checkpoint as a model version the server serves: its token
table, position table and embedding rules, and its tokenizer (docs/importers.md).

    python -m training.importers hf DIR --out models/NAME/VERSION
    python -m training.importers hf DIR --name-map-check          (a dry run)
    python -m training.importers nanogpt ckpt.pt --out models/nanogpt/1

Each subcommand's --help lists its options. Exit status 0 with one line naming the
version written; 2 with one line for a mistake in the options or a source that cannot
be imported (nothing written); 1 with one line naming a log file for an internal error.
"""

_parser = build_parser  # the parser the deploy tests check manifests' args with

# Llama 3's pre-tokenizer regex (its tiktoken-format tokenizer.model uses this split).
LLAMA3_PAT_STR = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}|"
                  r" ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")
_DTYPES = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}

# What a version's tokenizer is: a tiktoken ranks file, a resolved tokenizer.json, or none.
Choice = tuple[TokenizerSpec, Path] | ResolvedTokenizer | None


def write_imported(out: Path, tables: SourceTables, tokenizer: Choice,
                   dtype: str = "keep") -> Manifest:
    """Check the table covers the tokenizer's ids, then write the version atomically."""
    if not is_version_name(out.name):
        raise ImporterError(f"--out {out}: must be models/<name>/<version>, the version a "
                            f"positive integer without leading zeros")
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
            try:
                n_vocab = load_tokenizer(spec, path).n_vocab
            except (ValueError, OSError) as e:  # not a ranks file, or not the expected one
                raise ImporterError(f"{path}: not a tiktoken ranks file this importer can "
                                    f"read ({reason(e)})") from None
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
    special_tokens = args.special_tokens  # parsed and checked by options.parse
    if special_tokens is None:
        special_tokens = dict(GPT2_SPECIAL_TOKENS) if family == "gpt2" else {}
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


def main(argv: Sequence[str] | None = None) -> int:
    """CLI entry point; returns the exit status: 0, 2 with one line for a usage error or
    a source that cannot be imported, 70 with one line naming a log file for an internal
    error (a bug)."""
    args = parse(argv, _DESCRIPTION)
    try:
        return _run(args)
    except ImporterError as e:
        print(f"{PROG}: error: {' '.join(str(e).split())}", file=sys.stderr)
        return 2
    except OSError as e:  # a file the user named cannot be read or written
        where = f"{e.filename}: " if e.filename else ""
        print(f"{PROG}: error: {where}{e.strerror or reason(e)}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print(f"{PROG}: error: interrupted; nothing written", file=sys.stderr)
        return 130
    except Exception as e:  # a bug: its traceback goes to a file, the terminal gets one line
        return internal_error(PROG, e, note="nothing written")


def _run(args: argparse.Namespace) -> int:
    if args.command in HF_COMMANDS:
        tables = load_hf(args.dir, args.max_seq_len, HF_COMMANDS[args.command],
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
                              args.dtype or "keep")
    checkpoint_id = hashlib.sha256((args.out / MANIFEST_FILE).read_bytes()).hexdigest()
    tokenizer = "none (ids-only)" if manifest.tokenizer is None else (
        f"{manifest.tokenizer.kind}:{manifest.tokenizer.file}")
    print(f"wrote {args.out}: family={manifest.family or '-'} rules="
          f"{manifest.rules.describe()!r} vocab_size={manifest.vocab_size} table_rows="
          f"{manifest.table_rows} dim={manifest.dim} hidden_size={manifest.width} "
          f"max_seq_len={manifest.max_seq_len} position={manifest.position} "
          f"dtype={manifest.dtype} tokenizer={tokenizer} checkpoint_id={checkpoint_id}")
    return 0

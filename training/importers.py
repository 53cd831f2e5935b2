"""Importers: pretrained embedding tables from other formats into a model repository.

Each importer reads only the two input tables (token, and position where the model has
one) through an explicit name map, checks their shapes against the source's own config,
and writes a version with ``service.format.checkpoint.write_checkpoint`` (atomic, hashed).
Sources are read without unpickling: safetensors for Hugging Face, and
``torch.load(weights_only=True)`` for nanoGPT's ``ckpt.pt``.

    python -m training.importers hf-gpt2 DIR --out models/gpt2/1 [--name-map-check]
    python -m training.importers hf-llama DIR --tokenizer FILE.tiktoken --out models/llama/1
    python -m training.importers nanogpt ckpt.pt --out models/nanogpt/1
"""

from __future__ import annotations

import argparse
import hashlib
import json
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from safetensors import SafetensorError, safe_open

from service.format.checkpoint import MANIFEST_FILE, Manifest, write_checkpoint
from service.format.tokenizer import TokenizerSpec, default_ranks_path, gpt2_spec, load_tokenizer

__all__ = [
    "HF_GPT2_NAMES", "HF_LLAMA_NAMES", "LLAMA3_PAT_STR", "NANOGPT_NAMES", "ImporterError",
    "SourceTables", "load_hf_gpt2", "load_hf_llama", "load_nanogpt", "main", "resolve_names",
    "write_imported",
]

# Source tensor name -> our name. The only place the importers learn names.
HF_GPT2_NAMES: dict[str, str] = {
    "wte.weight": "token_embedding",  # GPT2Model
    "transformer.wte.weight": "token_embedding",  # GPT2LMHeadModel (lm_head tied, not saved)
    "wpe.weight": "position_embedding",
    "transformer.wpe.weight": "position_embedding",
}
HF_LLAMA_NAMES: dict[str, str] = {
    "embed_tokens.weight": "token_embedding",  # LlamaModel
    "model.embed_tokens.weight": "token_embedding",  # LlamaForCausalLM
}
NANOGPT_NAMES: dict[str, str] = {
    "transformer.wte.weight": "token_embedding",
    "transformer.wpe.weight": "position_embedding",
}
# Llama 3's pre-tokenizer regex (its tiktoken-format tokenizer.model uses this split).
LLAMA3_PAT_STR = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}|"
                  r" ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")
_TORCH_COMPILE_PREFIX = "_orig_mod."
_DTYPES = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}


class ImporterError(Exception):
    """A source that cannot be imported; the message names the file and tensor."""


@dataclass(frozen=True)
class SourceTables:
    """The input tables read from a source, with where they came from."""

    token_table: torch.Tensor  # (table_rows, C)
    position_table: torch.Tensor | None  # (max_seq_len, C); None for RoPE models
    max_seq_len: int
    names: dict[str, str]  # our name -> source tensor name
    provenance: dict[str, Any] = field(default_factory=dict)

    @property
    def position(self) -> str:
        """The manifest's position kind: a stored table is learned; without one, RoPE."""
        return "none" if self.position_table is None else "learned"


def resolve_names(available: Sequence[str], name_map: Mapping[str, str],
                  wanted: Sequence[str], where: str) -> dict[str, str]:
    """Map each wanted name of ours to the one source name present; error if none or two."""
    present = set(available)
    resolved: dict[str, str] = {}
    for ours in wanted:
        candidates = [src for src, dst in name_map.items() if dst == ours and src in present]
        expected = [src for src, dst in name_map.items() if dst == ours]
        if not candidates:
            sample = ", ".join(sorted(present)[:8]) or "(no tensors)"
            raise ImporterError(f"{where}: no tensor for {ours}: expected one of "
                                f"{expected}; the file has {sample}")
        if len(candidates) > 1:
            raise ImporterError(f"{where}: {ours} is ambiguous: {candidates} are all present")
        resolved[ours] = candidates[0]
    return resolved


def _check_shape(where: str, name: str, shape: Sequence[int], expected: tuple[int, int],
                 meaning: str) -> None:
    if tuple(shape) != expected:
        raise ImporterError(f"{where}: {name} has shape {tuple(shape)}, expected "
                            f"{expected} = {meaning}")


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with path.open("rb") as f:
        while chunk := f.read(1 << 22):
            h.update(chunk)
    return h.hexdigest()


def _config_int(config: Mapping[str, Any], keys: Sequence[str], where: str) -> int:
    for key in keys:
        if isinstance(config.get(key), int):
            return int(config[key])
    raise ImporterError(f"{where}: no integer {' or '.join(keys)}")


class _SafetensorsDir:
    """A Hugging Face save directory: config.json plus one or sharded safetensors files."""

    def __init__(self, model_dir: Path) -> None:
        self.dir = Path(model_dir)
        config_path = self.dir / "config.json"
        if not config_path.is_file():
            raise ImporterError(f"{config_path}: missing (need the model's config.json)")
        self.config: dict[str, Any] = json.loads(config_path.read_text())
        index = self.dir / "model.safetensors.index.json"
        if (self.dir / "model.safetensors").is_file():
            with safe_open(str(self.dir / "model.safetensors"), framework="pt") as f:
                self.weight_map = dict.fromkeys(f.keys(), "model.safetensors")
        elif index.is_file():
            self.weight_map = {str(k): str(v)
                               for k, v in json.loads(index.read_text())["weight_map"].items()}
        else:
            raise ImporterError(f"{self.dir}: no model.safetensors or "
                                f"model.safetensors.index.json (only safetensors are read)")
        self.files_read: set[str] = {"config.json"}

    def where(self, name: str) -> str:
        """The file holding a tensor, for messages."""
        return str(self.dir / self.weight_map[name])

    def shape(self, name: str) -> list[int]:
        """A tensor's shape, without reading its data."""
        with safe_open(self.where(name), framework="pt") as f:
            return list(f.get_slice(name).get_shape())

    def tensor(self, name: str) -> torch.Tensor:
        """A tensor's data (a fresh copy, not a view of the file)."""
        self.files_read.add(self.weight_map[name])
        with safe_open(self.where(name), framework="pt") as f:
            return f.get_tensor(name)

    def provenance(self, source: str) -> dict[str, Any]:
        """Source name, the HF config and the sha256 of every file read."""
        files = {name: _sha256(self.dir / name) for name in sorted(self.files_read)}
        return {"source": source, "hf_config": self.config, "source_files": files}


def load_hf_gpt2(model_dir: Path) -> SourceTables:
    """wte/wpe from a GPT2Model or GPT2LMHeadModel save, shapes checked against config.json."""
    src = _SafetensorsDir(model_dir)
    names = resolve_names(list(src.weight_map), HF_GPT2_NAMES,
                          ["token_embedding", "position_embedding"], str(src.dir))
    cfg = src.config
    n_vocab = _config_int(cfg, ["vocab_size"], "config.json")
    n_embd = _config_int(cfg, ["n_embd", "hidden_size"], "config.json")
    n_positions = _config_int(cfg, ["n_positions", "n_ctx"], "config.json")
    wte, wpe = names["token_embedding"], names["position_embedding"]
    _check_shape(src.where(wte), wte, src.shape(wte), (n_vocab, n_embd),
                 "[vocab_size, n_embd] from config.json")
    _check_shape(src.where(wpe), wpe, src.shape(wpe), (n_positions, n_embd),
                 "[n_positions, n_embd] from config.json")
    token_table = src.tensor(wte)  # (vocab_size, C)
    position_table = src.tensor(wpe)  # (n_positions, C)
    return SourceTables(token_table, position_table, n_positions, names,
                        src.provenance("hf-gpt2"))


def load_hf_llama(model_dir: Path) -> SourceTables:
    """embed_tokens from a Llama save; RoPE, so no position table."""
    src = _SafetensorsDir(model_dir)
    names = resolve_names(list(src.weight_map), HF_LLAMA_NAMES, ["token_embedding"],
                          str(src.dir))
    cfg = src.config
    n_vocab = _config_int(cfg, ["vocab_size"], "config.json")
    hidden = _config_int(cfg, ["hidden_size"], "config.json")
    max_seq_len = _config_int(cfg, ["max_position_embeddings"], "config.json")
    emb = names["token_embedding"]
    _check_shape(src.where(emb), emb, src.shape(emb), (n_vocab, hidden),
                 "[vocab_size, hidden_size] from config.json")
    return SourceTables(src.tensor(emb), None, max_seq_len, names, src.provenance("hf-llama"))


def _json_scalars(d: Mapping[str, Any]) -> dict[str, Any]:
    """Keep the JSON-safe scalar entries (a train config can hold anything)."""
    return {str(k): v for k, v in d.items() if isinstance(v, str | int | float | bool)}


def load_nanogpt(ckpt_path: Path) -> SourceTables:
    """wte/wpe from nanoGPT's ckpt.pt (weights_only load; torch.compile prefix stripped)."""
    where = str(ckpt_path)
    try:
        ckpt = torch.load(ckpt_path, map_location="cpu", weights_only=True)
    except Exception as e:  # weights_only refuses anything but tensors and plain containers
        raise ImporterError(f"{where}: cannot load with weights_only=True ({e})") from e
    if not isinstance(ckpt, dict) or not isinstance(ckpt.get("model"), dict):
        raise ImporterError(f"{where}: not a nanoGPT checkpoint (no 'model' state dict)")
    if not isinstance(ckpt.get("model_args"), dict):
        raise ImporterError(f"{where}: not a nanoGPT checkpoint (no 'model_args' dict)")
    state = {k.removeprefix(_TORCH_COMPILE_PREFIX): v for k, v in ckpt["model"].items()}
    args: dict[str, Any] = ckpt["model_args"]
    names = resolve_names(list(state), NANOGPT_NAMES,
                          ["token_embedding", "position_embedding"], where)
    table_rows = _config_int(args, ["vocab_size"], f"{where} model_args")
    n_embd = _config_int(args, ["n_embd"], f"{where} model_args")
    block_size = _config_int(args, ["block_size"], f"{where} model_args")
    wte, wpe = names["token_embedding"], names["position_embedding"]
    _check_shape(where, wte, state[wte].shape, (table_rows, n_embd),
                 "[vocab_size, n_embd] from model_args")
    _check_shape(where, wpe, state[wpe].shape, (block_size, n_embd),
                 "[block_size, n_embd] from model_args")
    val_loss = ckpt.get("best_val_loss")
    provenance: dict[str, Any] = {
        "source": "nanogpt", "model_args": _json_scalars(args),
        "train_config": _json_scalars(ckpt.get("config") or {}),
        "source_files": {ckpt_path.name: _sha256(ckpt_path)}}
    if isinstance(ckpt.get("iter_num"), int):
        provenance["step"] = ckpt["iter_num"]
    if isinstance(val_loss, torch.Tensor | float):  # nanoGPT stores a 0-d tensor
        provenance["val_loss"] = float(val_loss)
    # clone: wte shares storage with the tied lm_head.weight
    return SourceTables(state[wte].clone(), state[wpe].clone(), block_size, names, provenance)


def write_imported(out: Path, tables: SourceTables, spec: TokenizerSpec, ranks_path: Path,
                   dtype: str = "keep") -> Manifest:
    """Check the table covers the tokenizer's vocabulary, then write the version atomically."""
    if not out.name.isdigit() or int(out.name) <= 0:
        raise ImporterError(f"--out {out}: must be models/<name>/<version>, version a "
                            f"positive integer")
    tokenizer = load_tokenizer(spec, ranks_path)
    table_rows = tables.token_table.shape[0]
    if table_rows < tokenizer.n_vocab:
        raise ImporterError(
            f"{tables.names['token_embedding']}: {table_rows} rows < the tokenizer's n_vocab "
            f"{tokenizer.n_vocab} ({ranks_path.name}): ids {table_rows}..{tokenizer.n_vocab - 1}"
            f" would have no row; import with the tokenizer the model was trained with")
    token_table = tables.token_table
    if dtype != "keep":
        token_table = token_table.to(_DTYPES[dtype])
    elif token_table.dtype not in _DTYPES.values():
        raise ImporterError(f"{tables.names['token_embedding']}: dtype {token_table.dtype} "
                            f"not storable; pass --dtype float32|float16|bfloat16")
    provenance = {**tables.provenance, "tensor_names": dict(tables.names)}
    return write_checkpoint(out, token_table=token_table, position=tables.position,
                            position_table=tables.position_table,
                            max_seq_len=tables.max_seq_len, vocab_size=tokenizer.n_vocab,
                            tokenizer_spec=spec, tokenizer_ranks=ranks_path,
                            provenance=provenance)


def _tokenizer_args(args: argparse.Namespace) -> tuple[TokenizerSpec, Path]:
    """The spec and ranks file: GPT-2 by default, or the flags' own."""
    if args.command in ("hf-gpt2", "nanogpt"):
        if args.tokenizer is None:
            return gpt2_spec(), default_ranks_path()  # sha256 checked on load
        return gpt2_spec(sha256=""), Path(args.tokenizer)
    special = args.special_tokens or "{}"
    if Path(special).is_file():
        special = Path(special).read_text()
    try:
        special_tokens = {str(k): int(v) for k, v in json.loads(special).items()}
    except (ValueError, AttributeError) as e:
        raise ImporterError(f"--special-tokens: need a JSON object of name -> id ({e})") from e
    spec = TokenizerSpec(file="tokenizer.tiktoken", encoding=args.encoding,
                         pat_str=args.pat_str, special_tokens=special_tokens)
    return spec, Path(args.tokenizer)


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m training.importers", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="command", required=True)
    for name, source, help_ in (
            ("hf-gpt2", "dir", "Hugging Face GPT-2 save (model.safetensors + config.json)"),
            ("hf-llama", "dir", "Hugging Face Llama save (RoPE: no position table)"),
            ("nanogpt", "ckpt", "nanoGPT ckpt.pt (loaded with weights_only=True)")):
        s = sub.add_parser(name, help=help_)
        s.add_argument(source, type=Path)
        s.add_argument("--out", type=Path, help="models/<name>/<version> (required to write)")
        s.add_argument("--dtype", choices=["keep", *_DTYPES], default="keep")
        s.add_argument("--name-map-check", action="store_true",
                       help="resolve names and check shapes, print the map, write nothing")
        if name == "hf-llama":
            s.add_argument("--tokenizer", required=True, help=".tiktoken ranks file")
            s.add_argument("--pat-str", default=LLAMA3_PAT_STR, help="pre-tokenizer regex")
            s.add_argument("--special-tokens", help="JSON object (or file) of name -> id")
            s.add_argument("--encoding", default="llama3", help="encoding name")
        else:
            s.add_argument("--tokenizer", help="ranks file (default: the GPT-2 ranks)")
    return p


def main(argv: Sequence[str] | None = None) -> int:
    """CLI entry point; returns the exit status (2 with a message on a bad source)."""
    parser = _parser()
    args = parser.parse_args(argv)
    if args.out is None and not args.name_map_check:
        parser.error("--out models/<name>/<version> is required (or --name-map-check)")
    try:
        if args.command == "hf-gpt2":
            tables = load_hf_gpt2(args.dir)
        elif args.command == "hf-llama":
            tables = load_hf_llama(args.dir)
        else:
            tables = load_nanogpt(args.ckpt)
        if args.name_map_check:
            read = {"token_embedding": tables.token_table,
                    "position_embedding": tables.position_table}
            for ours, src in tables.names.items():
                t = read[ours]
                if t is not None:
                    dtype = str(t.dtype).removeprefix("torch.")
                    print(f"{src} -> {ours} {list(t.shape)} {dtype}")
            return 0
        spec, ranks = _tokenizer_args(args)
        manifest = write_imported(args.out, tables, spec, ranks, args.dtype)
    except (ImporterError, SafetensorError, OSError, ValueError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    checkpoint_id = hashlib.sha256((args.out / MANIFEST_FILE).read_bytes()).hexdigest()
    print(f"wrote {args.out}: vocab_size={manifest.vocab_size} table_rows={manifest.table_rows}"
          f" dim={manifest.dim} max_seq_len={manifest.max_seq_len} position={manifest.position}"
          f" dtype={manifest.dtype} checkpoint_id={checkpoint_id}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Writing a version directory: the training job's and the importers' side of the format.

A version is written whole under a temporary name in its model's folder, made durable and
readable by every user, then renamed into place (``checkpoint.py`` reads and verifies it):
a server polling the repository never sees half a version, and versions are immutable.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Mapping
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import torch

from service.dtypes import BY_TORCH
from service.format.checkpoint import list_versions
from service.format.manifest import (
    EMBEDDINGS_FILE,
    FORMAT,
    MANIFEST_FILE,
    MODEL_FILE,
    POSITION_KINDS,
    ROW_UPDATES_FILE,
    Manifest,
)
from service.format.rules import Rules
from service.format.tensorfile import sha256_file
from service.format.tokenizer import TokenizerSpec

__all__ = ["DIR_MODE", "FILE_MODE", "next_version", "write_checkpoint"]

# Modes of what write_checkpoint writes: a version is readable by every user (the server runs
# as another uid than the writer: the image's 10001, a training pod, a CI job).
FILE_MODE = 0o644
DIR_MODE = 0o755


def next_version(model_dir: Path) -> int:
    """One past the newest version (1 for a new model)."""
    versions = list_versions(model_dir)
    return versions[-1] + 1 if versions else 1


def _make_readable_dirs(path: Path) -> None:
    """``mkdir -p`` whose new directories are DIR_MODE whatever the umask."""
    missing = [p for p in (path, *path.parents) if not p.exists()]
    path.mkdir(parents=True, exist_ok=True)
    for p in reversed(missing):
        os.chmod(p, DIR_MODE)


def write_checkpoint(
    version_dir: Path,
    *,
    token_table: torch.Tensor,
    position: str,
    max_seq_len: int,
    vocab_size: int,
    tokenizer_spec: TokenizerSpec | None,
    tokenizer_ranks: Path | None,
    position_table: torch.Tensor | None = None,
    row_updates: torch.Tensor | None = None,
    model_tensors: Mapping[str, torch.Tensor] | None = None,
    provenance: Mapping[str, Any] | None = None,
    family: str = "",
    rules: Rules | None = None,
    hidden_size: int = 0,
    rule_tensors: Mapping[str, torch.Tensor] | None = None,
) -> Manifest:
    """Write a complete version directory atomically (temp dir in the parent, then rename).

    ``tokenizer_spec``/``tokenizer_ranks`` None: an ids-only model. ``family``, ``rules``,
    ``hidden_size`` and ``rule_tensors`` describe an imported family (service.format.rules).
    Raises FileExistsError if ``version_dir`` exists: versions are immutable.
    """
    from safetensors.torch import save_file  # the reference writer

    version_dir = Path(version_dir)
    if version_dir.exists():
        raise FileExistsError(f"{version_dir} exists; versions are immutable")
    if position not in POSITION_KINDS:
        raise ValueError(f"position {position!r} not in {POSITION_KINDS}")
    table_rows, dim = token_table.shape
    if table_rows < vocab_size:
        raise ValueError(f"token_table has {table_rows} rows < vocab_size {vocab_size}")
    if (position == "learned") != (position_table is not None):
        raise ValueError("position_table is required exactly when position == 'learned'")
    rules = rules or Rules()
    want = (max_seq_len + rules.position_offset,
            dim if rules.position_width_is_dim else hidden_size or dim)
    if position_table is not None and tuple(position_table.shape) != want:
        raise ValueError(f"position_table shape {tuple(position_table.shape)} != {want}")
    if sorted(rule_tensors or {}) != sorted(rules.tensors()):
        raise ValueError(f"rule_tensors {sorted(rule_tensors or {})} != what rules "
                         f"{rules.names()} need: {sorted(rules.tensors())}")
    dtype = BY_TORCH[token_table.dtype].name if token_table.dtype in BY_TORCH else None
    if dtype is None:
        raise ValueError(f"token_table dtype {token_table.dtype} not supported")

    _make_readable_dirs(version_dir.parent)
    tmp = Path(tempfile.mkdtemp(prefix=f".{version_dir.name}.tmp-", dir=version_dir.parent))
    try:
        tables = {"token_embedding": token_table.detach().contiguous().cpu()}
        if position_table is not None:
            tables["position_embedding"] = position_table.detach().to(token_table.dtype)
            tables["position_embedding"] = tables["position_embedding"].contiguous().cpu()
        for name, t in (rule_tensors or {}).items():  # kept in their own dtype, as stored
            tables[name] = t.detach().contiguous().cpu()
        save_file(tables, str(tmp / EMBEDDINGS_FILE), metadata={"format": FORMAT})
        if tokenizer_spec is not None and tokenizer_ranks is not None:
            shutil.copyfile(tokenizer_ranks, tmp / tokenizer_spec.file)
        if row_updates is not None:
            counts = row_updates.detach().to(torch.int64).contiguous().cpu()
            save_file({"token_row_updates": counts}, str(tmp / ROW_UPDATES_FILE))
        if model_tensors:
            rest = {k: v.detach().contiguous().cpu() for k, v in model_tensors.items()}
            save_file(rest, str(tmp / MODEL_FILE))
        files = {p.name: sha256_file(p) for p in sorted(tmp.iterdir())}
        spec = None if tokenizer_spec is None else TokenizerSpec(
            file=tokenizer_spec.file, encoding=tokenizer_spec.encoding,
            pat_str=tokenizer_spec.pat_str, special_tokens=dict(tokenizer_spec.special_tokens),
            sha256=files[tokenizer_spec.file], kind=tokenizer_spec.kind)
        prov = {"created": datetime.now(UTC).isoformat(timespec="seconds"),
                **dict(provenance or {})}
        manifest = Manifest(vocab_size=vocab_size, table_rows=table_rows, dim=dim,
                            max_seq_len=max_seq_len, position=position, dtype=dtype,
                            tokenizer=spec, files=files, provenance=prov, family=family,
                            rules=rules, hidden_size=hidden_size)
        (tmp / MANIFEST_FILE).write_bytes(manifest.to_json())
        for p in tmp.iterdir():  # durable before it becomes visible
            # Readable by any user who can reach the repository (a server with another uid,
            # a shared volume), whatever the writer's umask or safetensors' own 0600.
            os.chmod(p, FILE_MODE)
            with p.open("rb") as f:
                os.fsync(f.fileno())
        os.chmod(tmp, DIR_MODE)
        os.rename(tmp, version_dir)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return manifest

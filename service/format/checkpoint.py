"""The checkpoint format: the contract between the training job and the server.

A model repository holds ``models/<model>/<version>/`` (version a positive integer)::

    manifest.json            format, sizes, position kind, tokenizer spec, file hashes, provenance
    embeddings.safetensors   token_embedding [table_rows, C]; position_embedding [max_seq_len, C]
    tokenizer.tiktoken       the BPE ranks (no network, ever), or tokenizer.json (an HF
                             model's own); absent for an ids-only model (``tokenizer: null``)
    row_updates.safetensors  optional: token_row_updates [table_rows] int64
    model.safetensors        optional: the rest of the trained LM

Safetensors only: nothing here unpickles. Every file's sha256 is checked at load.
Versions are written under a temporary name and renamed into place, so a reader never
sees half a version. ``checkpoint_id`` is the sha256 of manifest.json.

The manifest itself is `manifest.py`; the table files are read by `tensorfile.py`. Reading
is safe against the disk changing under it: a table file is read once into
private anonymous memory, its sha256 computed over exactly those bytes, and the tensors
are built on that buffer. Nothing served is a map of the file, so a checkpoint truncated
or rewritten in place while served can neither crash the server (no SIGBUS) nor change
the rows it serves. Anything malformed (wrong JSON types, a header that is not a mapping,
offsets outside the file, missing or extra files, NaN/Inf in a table) is a
``CheckpointError`` naming the file.
"""

from __future__ import annotations

import hashlib
import os
import re
import shutil
import tempfile
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import torch

from service.dtypes import BY_TORCH
from service.format.manifest import (
    EMBEDDINGS_FILE,
    FORMAT,
    MANIFEST_FILE,
    MODEL_FILE,
    POSITION_KINDS,
    ROW_UPDATES_FILE,
    TOKENIZER_FILE,
    Manifest,
)
from service.format.rules import Rules
from service.format.tensorfile import (
    CheckpointError,
    check_finite,
    parse_safetensors,
    read_private,
    read_safetensors,
    sha256_file,
)
from service.format.tokenizer import TokenizerSpec

__all__ = [
    "EMBEDDINGS_FILE",
    "FORMAT",
    "MANIFEST_FILE",
    "MODEL_FILE",
    "POSITION_KINDS",
    "ROW_UPDATES_FILE",
    "TOKENIZER_FILE",
    "Checkpoint",
    "CheckpointError",
    "Manifest",
    "check_finite",
    "is_version_name",
    "list_versions",
    "next_version",
    "parse_safetensors",
    "read_checkpoint",
    "read_private",
    "read_safetensors",
    "verify_checkpoint",
    "write_checkpoint",
]

# Modes of what write_checkpoint writes: a version is readable by every user (the server runs
# as another uid than the writer: the image's 10001, a training pod, a CI job).
FILE_MODE = 0o644
DIR_MODE = 0o755

_VERSION = re.compile(r"[1-9][0-9]{0,17}")  # a version folder: ASCII digits, no leading 0



@dataclass(frozen=True)
class Checkpoint:
    """One loaded, verified version. Tensors view private memory holding the files' bytes
    as read and hashed at load (never a map of the files)."""

    path: Path
    manifest: Manifest
    checkpoint_id: str  # sha256 of manifest.json
    token_table: torch.Tensor  # (table_rows, C)
    position_table: torch.Tensor | None  # (max_seq_len, C), only when position == "learned"
    row_updates: torch.Tensor | None  # (table_rows,) int64: steps that touched each row
    # The rules' own tensors (service.format.rules.RULE_TENSORS), e.g. layernorm_weight.
    rule_tensors: dict[str, torch.Tensor] = field(default_factory=dict)
    token_max_abs: float | None = None  # largest |value| of the token table, read at load

    @property
    def tokenizer_path(self) -> Path | None:
        """The tokenizer file inside the version directory (None: ids-only)."""
        tok = self.manifest.tokenizer
        return None if tok is None else self.path / tok.file


def verify_checkpoint(version_dir: Path, hashed_when_read: tuple[str, ...] = ()
                      ) -> tuple[Manifest, str]:
    """Check the manifest, that the folder holds exactly its files, and every listed file's
    sha256 (except ``hashed_when_read``: the caller checks those over the bytes it reads);
    return (manifest, checkpoint_id)."""
    manifest_path = version_dir / MANIFEST_FILE
    try:
        raw = manifest_path.read_bytes()
    except OSError as e:
        raise CheckpointError(f"{manifest_path}: cannot read ({e.strerror})") from e
    manifest = Manifest.from_json(raw, str(manifest_path))
    extra = sorted(p.name for p in version_dir.iterdir()
                   if p.name != MANIFEST_FILE and p.name not in manifest.files)
    if extra:
        raise CheckpointError(f"{version_dir}: {extra[0][:64]!r} is not listed in the "
                              f"manifest ({len(extra)} such files)")
    for name, want in sorted(manifest.files.items()):
        path = version_dir / name
        if "/" in name or "\0" in name or name.startswith(".") or not path.is_file():
            raise CheckpointError(f"{path}: listed in the manifest but missing")
        if name in hashed_when_read:
            continue
        got = sha256_file(path)
        if got != want:
            raise CheckpointError(f"{path}: sha256 {got[:16]}… does not match manifest "
                                  f"{want[:16]}… (file changed or corrupt)")
    return manifest, hashlib.sha256(raw).hexdigest()


def read_checkpoint(version_dir: Path, verify: bool = True) -> Checkpoint:
    """Load one version: verify, read the tables into private memory (hashed as read), and
    check their shapes and values."""
    version_dir = Path(version_dir)
    read_here = (EMBEDDINGS_FILE, ROW_UPDATES_FILE)
    if verify:
        manifest, checkpoint_id = verify_checkpoint(version_dir, read_here)
    else:
        raw = (version_dir / MANIFEST_FILE).read_bytes()
        manifest, checkpoint_id = Manifest.from_json(raw), hashlib.sha256(raw).hexdigest()
    m = manifest

    def want(name: str) -> str | None:
        return m.files.get(name) if verify else None

    tensors = read_safetensors(version_dir / EMBEDDINGS_FILE, want(EMBEDDINGS_FILE))
    token_table = tensors.get("token_embedding")
    if token_table is None or tuple(token_table.shape) != (m.table_rows, m.dim):
        got = None if token_table is None else tuple(token_table.shape)
        raise CheckpointError(f"{EMBEDDINGS_FILE}: token_embedding shape {got}, "
                              f"manifest says {(m.table_rows, m.dim)}")
    position_table = tensors.get("position_embedding")
    if m.position == "learned":
        offset = m.rules.position_offset  # OPT stores 2 rows before position 0
        expected = (m.max_seq_len + offset,
                    m.dim if m.rules.position_width_is_dim else m.width)
        if position_table is None or tuple(position_table.shape) != expected:
            got = None if position_table is None else tuple(position_table.shape)
            raise CheckpointError(f"{EMBEDDINGS_FILE}: position_embedding shape {got}, "
                                  f"manifest says {expected}")
        position_table = position_table[offset:]  # a view: row p is position p
    else:
        position_table = None
    token_max_abs = check_finite(EMBEDDINGS_FILE, "token_embedding", token_table)
    if position_table is not None:
        check_finite(EMBEDDINGS_FILE, "position_embedding", position_table)
    rule_tensors = {}
    shapes = _rule_shapes(m)
    for name in m.rules.tensors():
        t = tensors.get(name)
        if t is None:
            raise CheckpointError(f"{EMBEDDINGS_FILE}: no {name} for rules "
                                  f"{m.rules.names()}")
        if tuple(t.shape) != shapes[name]:
            raise CheckpointError(f"{EMBEDDINGS_FILE}: {name} shape {tuple(t.shape)}, the "
                                  f"manifest's sizes and rules say {shapes[name]}")
        rule_tensors[name] = t
    row_updates = None
    if ROW_UPDATES_FILE in m.files:
        row_updates = read_safetensors(version_dir / ROW_UPDATES_FILE,
                                       want(ROW_UPDATES_FILE)).get("token_row_updates")
        if row_updates is None or tuple(row_updates.shape) != (m.table_rows,):
            raise CheckpointError(f"{ROW_UPDATES_FILE}: token_row_updates must be [table_rows]")
    return Checkpoint(version_dir, manifest, checkpoint_id, token_table, position_table,
                      row_updates, rule_tensors, token_max_abs)


def _rule_shapes(m: Manifest) -> dict[str, tuple[int, ...]]:
    """The shape each rule tensor must have: rows added before ``project_hidden`` have
    the token rows' width (dim), the others the hidden size (``m.width``)."""
    summed = m.dim if m.rules.position_width_is_dim else m.width
    return {"project_in_weight": (m.width, m.dim), "token_type_embedding": (1, summed),
            "layernorm_weight": (summed,), "layernorm_bias": (summed,),
            "project_hidden_weight": (m.width, m.dim), "project_hidden_bias": (m.width,)}


def list_versions(model_dir: Path) -> list[int]:
    """Positive integer version directories, ascending (temporary names are skipped)."""
    if not model_dir.is_dir():
        return []
    return sorted(int(p.name) for p in model_dir.iterdir()
                  if is_version_name(p.name) and p.is_dir())


def is_version_name(name: str) -> bool:
    """A version folder's name: a positive integer in ASCII digits, no leading zero ("²",
    "01" or 5,000 digits are not versions)."""
    return _VERSION.fullmatch(name) is not None


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

"""The checkpoint format: the contract between the training job and the server.

A model repository holds ``models/<model>/<version>/`` (version a positive integer)::

    manifest.json            format, sizes, position kind, tokenizer spec, file hashes, provenance
    embeddings.safetensors   token_embedding [table_rows, C]; position_embedding [max_seq_len, C]
    tokenizer.tiktoken       the BPE ranks (no network, ever), or tokenizer.json (an HF
                             model's own); absent for an ids-only model (``tokenizer: null``)
    row_updates.safetensors  optional: token_row_updates [table_rows] int64
    model.safetensors        optional: the rest of the trained LM

Safetensors only: nothing here unpickles. Every file's sha256 is checked at load.
Versions are written under a temporary name and renamed into place (``writer.py``), so a
reader never sees half a version. ``checkpoint_id`` is the sha256 of manifest.json.

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
import re
from dataclasses import dataclass, field
from pathlib import Path

import torch

from service.format.manifest import (
    EMBEDDINGS_FILE,
    MANIFEST_FILE,
    ROW_UPDATES_FILE,
    Manifest,
)
from service.format.tensorfile import (
    CheckpointError,
    check_finite,
    read_safetensors,
    sha256_file,
)

__all__ = ["Checkpoint", "is_version_name", "list_versions", "read_checkpoint", "verify_checkpoint"]

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

"""manifest.json: the description of one checkpoint version, validated before anything is
built (the JSON type of every field, the sizes, the files a version must list)."""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from typing import Any

from service.dtypes import TABLE_DTYPE_NAMES
from service.format.rules import Rules
from service.format.tensorfile import CheckpointError
from service.format.tokenizer import TokenizerSpec

__all__ = [
    "EMBEDDINGS_FILE",
    "FORMAT",
    "MANIFEST_FILE",
    "MODEL_FILE",
    "POSITION_KINDS",
    "ROW_UPDATES_FILE",
    "TOKENIZER_FILE",
    "Manifest",
]

FORMAT = "embedding-checkpoint/1"
MANIFEST_FILE = "manifest.json"
EMBEDDINGS_FILE = "embeddings.safetensors"
TOKENIZER_FILE = "tokenizer.tiktoken"
ROW_UPDATES_FILE = "row_updates.safetensors"
MODEL_FILE = "model.safetensors"
POSITION_KINDS = ("learned", "sinusoidal", "none")

_MAX_SIZE = 1 << 31  # bound on vocab_size, table_rows, dim, max_seq_len
# JSON type of each manifest field (None: may be null); checked before anything is built.
_MANIFEST_TYPES: dict[str, tuple[type, ...]] = {
    "format": (str,), "vocab_size": (int,), "table_rows": (int,), "dim": (int,),
    "max_seq_len": (int,), "position": (str,), "dtype": (str,),
    "tokenizer": (dict, type(None)), "files": (dict,)}
_OPTIONAL_TYPES: dict[str, tuple[type, ...]] = {
    "provenance": (dict, type(None)), "family": (str,), "rules": (dict, type(None)),
    "hidden_size": (int,)}


@dataclass(frozen=True)
class Manifest:
    """manifest.json, validated."""

    vocab_size: int  # tokenizer n_vocab: valid ids are 0..vocab_size-1
    table_rows: int  # >= vocab_size (nanoGPT pads 50257 -> 50304)
    dim: int  # C
    max_seq_len: int  # rows of the position table / the context window
    position: str  # learned | sinusoidal | none
    dtype: str  # storage dtype of the tables
    tokenizer: TokenizerSpec | None  # None: an ids-only model (text is refused)
    files: dict[str, str] = field(default_factory=dict)  # name -> sha256
    provenance: dict[str, Any] = field(default_factory=dict)
    format: str = FORMAT
    # The source family (HF model_type, e.g. "gemma"; "" for the training job's GPT) and
    # its rules (service.format.rules). Written only when set, so older manifests keep
    # their bytes and checkpoint_id.
    family: str = ""
    rules: Rules = field(default_factory=Rules)
    hidden_size: int = 0  # width of the default compose; 0 = dim (differs for OPT project_in)

    @property
    def width(self) -> int:
        """Width of what the first block reads (hidden_size; dim unless project_in)."""
        return self.hidden_size or self.dim

    def to_json(self) -> bytes:
        """Canonical bytes (sorted keys), so the same manifest always hashes the same."""
        d = {"format": self.format, "vocab_size": self.vocab_size,
             "table_rows": self.table_rows, "dim": self.dim, "max_seq_len": self.max_seq_len,
             "position": self.position, "dtype": self.dtype,
             "tokenizer": None if self.tokenizer is None else self.tokenizer.to_dict(),
             "files": dict(self.files), "provenance": self.provenance}
        if self.family:
            d["family"] = self.family
        if self.rules.names():
            d["rules"] = self.rules.to_dict()
        if self.hidden_size:
            d["hidden_size"] = self.hidden_size
        return (json.dumps(d, indent=2, sort_keys=True) + "\n").encode()

    @classmethod
    def from_json(cls, data: bytes, where: str = MANIFEST_FILE) -> Manifest:
        """Parse and validate; CheckpointError names the field."""
        try:
            d = json.loads(data)
            _check_manifest_types(d, where)
            m = cls(vocab_size=int(d["vocab_size"]), table_rows=int(d["table_rows"]),
                    dim=int(d["dim"]), max_seq_len=int(d["max_seq_len"]),
                    position=str(d["position"]), dtype=str(d["dtype"]),
                    tokenizer=(None if d["tokenizer"] is None
                               else TokenizerSpec.from_dict(d["tokenizer"])),
                    files={str(k): str(v) for k, v in d["files"].items()},
                    provenance=dict(d.get("provenance") or {}), format=str(d["format"]),
                    family=str(d.get("family", "")),
                    rules=Rules.from_dict(d.get("rules") or {}),
                    hidden_size=int(d.get("hidden_size", 0)))
        except json.JSONDecodeError as e:
            raise CheckpointError(f"{where}: not valid JSON ({e.msg} at line {e.lineno} "
                                  f"column {e.colno})") from None
        except KeyError as e:
            raise CheckpointError(f"{where}: invalid manifest (no field {e})") from None
        except (ValueError, TypeError, AttributeError) as e:
            raise CheckpointError(f"{where}: invalid manifest ({e})") from None
        if m.format != FORMAT:
            raise CheckpointError(f"{where}: format {m.format!r}, expected {FORMAT!r}")
        if m.position not in POSITION_KINDS:
            raise CheckpointError(f"{where}: position {m.position!r} not in {POSITION_KINDS}")
        if not (0 < m.vocab_size <= m.table_rows) or m.dim <= 0 or m.max_seq_len <= 0:
            raise CheckpointError(f"{where}: need 0 < vocab_size <= table_rows, dim > 0, "
                                  f"max_seq_len > 0")
        if max(m.vocab_size, m.table_rows, m.dim, m.max_seq_len) > _MAX_SIZE:
            raise CheckpointError(f"{where}: sizes above {_MAX_SIZE} are not supported")
        if m.dtype not in TABLE_DTYPE_NAMES:
            raise CheckpointError(f"{where}: dtype {m.dtype!r} not supported")
        if m.hidden_size < 0 or (m.hidden_size and m.hidden_size != m.dim
                                 and not (m.rules.project_in or m.rules.project_hidden)):
            raise CheckpointError(f"{where}: hidden_size {m.hidden_size} differs from dim "
                                  f"{m.dim} without a project_in or project_hidden rule")
        names = [EMBEDDINGS_FILE] + ([] if m.tokenizer is None else [m.tokenizer.file])
        for name in names:
            if name not in m.files:
                raise CheckpointError(f"{where}: files has no entry for {name}")
        return m


def _check_manifest_types(d: Any, where: str) -> None:
    """Every known field has its JSON type (an int is not a bool, a float or a string)."""
    if not isinstance(d, dict):
        raise CheckpointError(f"{where}: invalid manifest (a JSON object is needed, not "
                              f"{type(d).__name__})")
    for key, types in (*_MANIFEST_TYPES.items(), *_OPTIONAL_TYPES.items()):
        if key not in d:
            if key in _MANIFEST_TYPES:
                raise CheckpointError(f"{where}: invalid manifest (no {key!r})")
            continue
        value = d[key]
        if isinstance(value, bool) or not isinstance(value, types):
            raise CheckpointError(f"{where}: invalid manifest ({key!r} is a "
                                  f"{type(value).__name__})")
    for name, digest in d["files"].items():
        if not isinstance(digest, str) or not re.fullmatch(r"[0-9a-f]{64}", digest):
            raise CheckpointError(f"{where}: invalid manifest (files[{name!r}] is not a "
                                  f"sha256 hex digest)")

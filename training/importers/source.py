"""Reading a source: safetensors only (never a pickle), names through explicit maps.

``SafetensorsDir`` is a Hugging Face save directory (``config.json`` plus one or sharded
safetensors files); ``SourceTables`` is what every importer hands the writer.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from safetensors import SafetensorError, safe_open

from service.format.rules import Rules
from service.format.tensorfile import sha256_file  # re-exported: one file hash for the project

__all__ = ["CONTEXT_KEYS", "ImporterError", "SafetensorsDir", "SourceTables", "check_shape",
           "config_int", "context_length", "read_json_object", "reason", "resolve_names",
           "sha256_file"]

# The names transformers' families (and the checkpoints they load) give the context
# length, first found wins: GPT-2 n_positions/n_ctx, MPT and DBRX max_seq_len, RWKV
# context_length, ChatGLM seq_length, Kimi model_max_length, ...
CONTEXT_KEYS = ("max_position_embeddings", "n_positions", "n_ctx", "max_seq_len",
                "max_sequence_length", "max_seq_length", "seq_length", "context_length",
                "model_max_length")
_MAX_CONTEXT = (1 << 31) - 1  # above: a tokenizer's "no limit" sentinel, not a length
# Pickled weight files: refused by name, never opened.
_PICKLE_SUFFIXES = (".bin", ".pt", ".pth", ".ckpt", ".pkl")


# Sentences of library messages that never reach a user: advice to weaken a safety
# setting (remote code, unpickling, verification). Matched case-insensitively.
_WEAKENING = re.compile(
    r"trust_remote_code|remote code|custom code|weights_only|pickl|allow_unsafe|unsafe"
    r"|insecure|verify\s*=\s*false|disabl\w*[\s_-]+(ssl|verif|check)|no[-_]verify"
    r"|trusted? (the )?source|can still be loaded",
    re.IGNORECASE)


_CONTROL = re.compile(r"\x1b\[[0-9;]*[A-Za-z]|[\x00-\x08\x0b-\x1f\x7f]")


class ImporterError(Exception):
    """A source that cannot be imported; the message names the file and tensor."""


def reason(e: BaseException) -> str:
    """A library's exception as a clause of our own one-line message: the whole sentences
    of its first line that fit in 200 characters, without any that advise weakening a
    safety setting (its type name where nothing is left)."""
    text = _CONTROL.sub("", str(e))  # terminal colours and other control characters
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    sentences = re.split(r"(?<=[.!?])\s+", lines[0]) if lines else []
    kept: list[str] = []
    for sentence in sentences:
        if _WEAKENING.search(sentence):
            continue
        if kept and len(" ".join([*kept, sentence])) > 200:
            break
        kept.append(sentence)
    text = " ".join(kept) or type(e).__name__
    return text if len(text) <= 200 else text[:197] + "..."


@contextmanager
def _safetensors(path: Path) -> Iterator[Any]:
    """``safe_open`` with a malformed or missing file as one ImporterError naming it."""
    try:
        with safe_open(str(path), framework="pt") as f:
            yield f
    except (SafetensorError, OSError) as e:
        raise ImporterError(f"{path}: cannot be read as safetensors "
                            f"({reason(e)})") from None


def read_json_object(path: Path) -> dict[str, Any]:
    """A JSON file holding an object; ImporterError naming the file, line and column when
    it is not valid JSON (a truncated download, an HTML error page saved as JSON)."""
    try:
        value = json.loads(path.read_bytes())
    except UnicodeDecodeError as e:
        raise ImporterError(f"{path}: not UTF-8 text (byte {e.start}); download it again"
                            ) from None
    except json.JSONDecodeError as e:
        raise ImporterError(f"{path}: not valid JSON ({e.msg} at line {e.lineno} column "
                            f"{e.colno}); download it again") from None
    if not isinstance(value, dict):
        raise ImporterError(f"{path}: holds a JSON {type(value).__name__}, not an object")
    return value


@dataclass(frozen=True)
class SourceTables:
    """The input tables read from a source, its family's rules, and where they came from."""

    token_table: torch.Tensor  # (table_rows, dim)
    position_table: torch.Tensor | None  # (max_seq_len + offset, C); None without one
    max_seq_len: int
    names: dict[str, str]  # our name -> source tensor name
    provenance: dict[str, Any] = field(default_factory=dict)
    family: str = ""  # HF model_type; "" for nanoGPT (the training job's own GPT)
    rules: Rules = field(default_factory=Rules)
    hidden_size: int = 0  # 0 = the token rows' width
    rule_tensors: dict[str, torch.Tensor] = field(default_factory=dict)
    vocab_size: int = 0  # the model's id range (config vocab_size); 0 = the tokenizer's

    @property
    def position(self) -> str:
        """The manifest's position kind: a stored table is learned; without one, none."""
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


def check_shape(where: str, name: str, shape: Sequence[int], expected: tuple[int, ...],
                meaning: str) -> None:
    """Refuse a tensor whose shape is not what the source's own config says."""
    if tuple(shape) != expected:
        raise ImporterError(f"{where}: {name} has shape {tuple(shape)}, expected "
                            f"{expected} = {meaning}")


def config_int(config: Mapping[str, Any], keys: Sequence[str], where: str) -> int:
    """The first integer among ``keys`` (config names differ between families)."""
    for key in keys:
        if isinstance(config.get(key), int) and not isinstance(config.get(key), bool):
            return int(config[key])
    raise ImporterError(f"{where}: no integer {' or '.join(keys)}")


def context_length(*configs: Any) -> tuple[str, int] | None:
    """(key, value) of the first of CONTEXT_KEYS stated as a positive integer, searching
    each config in turn (a transformers config object, or a config.json dict)."""
    for config in configs:
        for key in CONTEXT_KEYS:
            value = (config.get(key) if isinstance(config, Mapping)
                     else getattr(config, key, None))
            if (isinstance(value, int) and not isinstance(value, bool)
                    and 0 < value <= _MAX_CONTEXT):
                return key, value
    return None


class SafetensorsDir:
    """A Hugging Face save directory: config.json plus one or sharded safetensors files."""

    def __init__(self, model_dir: Path) -> None:
        self.dir = Path(model_dir)
        config_path = self.dir / "config.json"
        if not config_path.is_file():
            raise ImporterError(f"{config_path}: missing (need the model's config.json)")
        self.config: dict[str, Any] = read_json_object(config_path)
        index = self.dir / "model.safetensors.index.json"
        if (self.dir / "model.safetensors").is_file():
            with _safetensors(self.dir / "model.safetensors") as f:
                self.weight_map = dict.fromkeys(f.keys(), "model.safetensors")
        elif index.is_file():
            weight_map = read_json_object(index).get("weight_map")
            if not isinstance(weight_map, dict):
                raise ImporterError(f"{index}: no \"weight_map\" object")
            self.weight_map = {str(k): str(v) for k, v in weight_map.items()}
            for name, shard in self.weight_map.items():
                # a shard is a file of this directory: never a path that leaves it
                if Path(shard).name != shard or shard in (".", ".."):
                    raise ImporterError(f"{index}: weight_map[{json.dumps(name)}] is "
                                        f"{json.dumps(shard)}: a shard must be a file name in "
                                        f"{self.dir}, not a path")
        else:
            pickles = sorted(p.name for p in self.dir.iterdir()
                             if p.suffix in _PICKLE_SUFFIXES)
            found = f" (found {', '.join(pickles)}: pickled weights are never opened)" \
                if pickles else ""
            raise ImporterError(f"{self.dir}: no model.safetensors or "
                                f"model.safetensors.index.json{found}; only safetensors are "
                                f"read: convert the weights with save_pretrained("
                                f"safe_serialization=True)")
        self.files_read: set[str] = {"config.json"}

    def where(self, name: str) -> str:
        """The file holding a tensor, for messages."""
        return str(self.dir / self.weight_map[name])

    def shape(self, name: str) -> list[int]:
        """A tensor's shape, without reading its data."""
        with _safetensors(Path(self.where(name))) as f:
            return list(f.get_slice(name).get_shape())

    def tensor(self, name: str) -> torch.Tensor:
        """A tensor's data (a fresh copy, not a view of the file)."""
        self.files_read.add(self.weight_map[name])
        with _safetensors(Path(self.where(name))) as f:
            return f.get_tensor(name)

    def provenance(self, source: str) -> dict[str, Any]:
        """Source name, the HF config and the sha256 of every file read."""
        files = {name: sha256_file(self.dir / name) for name in sorted(self.files_read)}
        return {"source": source, "hf_config": self.config, "source_files": files}

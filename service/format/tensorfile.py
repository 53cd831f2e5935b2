"""Safetensors files read safely: once, into private memory, hashed as read, every header
field checked before a tensor is built.

Nothing here maps a file: what is verified is exactly what is served, and a file
truncated or rewritten in place afterwards cannot reach the tensors (no SIGBUS, no
silently changed rows). Nothing unpickles.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np
import torch

from service.dtypes import SAFETENSORS
from service.format import shared_tables

__all__ = [
    "CheckpointError",
    "check_finite",
    "parse_safetensors",
    "read_private",
    "read_safetensors",
    "sha256_file",
]

_READ_CHUNK = 4 << 20  # read+hash step: the chunk is hashed while it is still in cache


class CheckpointError(Exception):
    """A version directory that must not be served; the message names the file and why."""


def sha256_file(path: Path) -> str:
    """Hex sha256 of a file, read in 4 MB chunks (files that are not tables: manifests,
    tokenizers, sources an importer reads)."""
    h = hashlib.sha256()
    with path.open("rb") as f:
        while chunk := f.read(_READ_CHUNK):
            h.update(chunk)
    return h.hexdigest()


def read_private(path: Path, sha256: str | None = None) -> np.ndarray:
    """The whole file, read once into private anonymous memory, its sha256 computed over
    those very bytes as they arrive (checked against ``sha256`` when given).

    One read, one buffer: what is verified is exactly what is served, and nothing maps the
    file (a truncation or an in-place rewrite cannot reach it afterwards). Under
    ``--workers N`` a file the supervisor already read, hashed and sealed is shared
    instead (``shared_tables``: same guarantees, one copy for every worker).
    """
    shared = _shared(sha256)
    if shared is not None:
        return shared
    with path.open("rb", buffering=0) as f:
        size = os.fstat(f.fileno()).st_size
        # Private anonymous memory (malloc maps it fresh), untouched until read into. Not
        # asked for in huge pages: measured, MADV_HUGEPAGE's synchronous compaction made
        # start-up 2-3x slower here and huge pages do not speed the gather up.
        buf = np.empty(size, dtype=np.uint8)
        view = buf.data  # a memoryview of the buffer
        h = hashlib.sha256()
        # Reading and hashing overlap: the next chunk is read (a copy out of the page cache
        # plus the first touch of fresh memory) while this one is hashed; both release the
        # GIL, so a 1 GB table costs about the larger of the two, not their sum.
        with ThreadPoolExecutor(1, thread_name_prefix="embed-read") as reader:
            at = 0
            pending = reader.submit(f.readinto, view[:_READ_CHUNK]) if size else None
            while pending is not None:
                n = pending.result()
                if not n:
                    raise CheckpointError(f"{path.name}: shrank to {at} bytes while read "
                                          f"(expected {size})")
                end = at + n
                pending = (reader.submit(f.readinto, view[end: end + _READ_CHUNK])
                           if end < size else None)
                h.update(view[at:end])
                at = end
    if sha256 is not None and h.hexdigest() != sha256:
        raise CheckpointError(f"{path.name}: sha256 {h.hexdigest()[:16]}… does not match "
                              f"manifest {sha256[:16]}… (file changed or corrupt)")
    return buf


def _shared(sha256: str | None) -> np.ndarray | None:
    """The supervisor's sealed copy of the file hashing to ``sha256``, if it made one."""
    view = shared_tables.lookup(sha256)
    return None if view is None else np.frombuffer(view, dtype=np.uint8)


def read_safetensors(path: Path, sha256: str | None = None) -> dict[str, torch.Tensor]:
    """A safetensors file's tensors, on one private buffer (``read_private``): no pickle,
    no map of the file. Every header field is checked before a tensor is built."""
    buf = read_private(path, sha256)
    return parse_safetensors(buf, path.name)


def parse_safetensors(buf: np.ndarray, where: str) -> dict[str, torch.Tensor]:
    """Tensors viewing ``buf`` (a whole safetensors file); CheckpointError if malformed."""
    size = int(buf.shape[0])
    if size < 8:
        raise CheckpointError(f"{where}: too short for safetensors")
    n = int.from_bytes(buf[:8].tobytes(), "little")
    if n > size - 8:
        raise CheckpointError(f"{where}: header length {n} past end of file")
    try:
        header = json.loads(buf[8: 8 + n].tobytes())
    except (ValueError, RecursionError) as e:
        raise CheckpointError(f"{where}: header is not JSON") from e
    if not isinstance(header, dict):
        raise CheckpointError(f"{where}: header is a JSON {type(header).__name__}, not an "
                              f"object")
    tensors: dict[str, torch.Tensor] = {}
    for name, info in header.items():
        if name == "__metadata__":
            continue
        dtype, shape, begin, end = _tensor_entry(where, name, info)
        count = math.prod(shape)
        if end - begin != count * dtype.itemsize or 8 + n + end > size:
            raise CheckpointError(f"{where}: {name} offsets do not match its shape")
        if count == 0:
            tensors[name] = torch.empty(shape, dtype=dtype)
            continue
        flat = torch.frombuffer(buf, dtype=dtype, count=count, offset=8 + n + begin)
        tensors[name] = flat.view(shape)
    return tensors


def _tensor_entry(where: str, name: str, info: Any) -> tuple[torch.dtype, list[int], int, int]:
    """(dtype, shape, begin, end) of one header entry, every field type-checked."""
    if not isinstance(info, dict):
        raise CheckpointError(f"{where}: header entry {name[:64]!r} is not an object")
    name_of_dtype = info.get("dtype")
    dtype = SAFETENSORS.get(name_of_dtype) if isinstance(name_of_dtype, str) else None
    if dtype is None:
        raise CheckpointError(f"{where}: {name[:64]} has unsupported dtype "
                              f"{str(info.get('dtype'))[:32]}")
    shape, offsets = _ints(info.get("shape")), _ints(info.get("data_offsets"))
    if shape is None or offsets is None or len(offsets) != 2 or offsets[0] > offsets[1]:
        raise CheckpointError(f"{where}: {name[:64]} needs shape and data_offsets as lists of "
                              f"non-negative integers (begin <= end)")
    return dtype, shape, offsets[0], offsets[1]


def _ints(value: Any) -> list[int] | None:
    """``value`` if it is a list of non-negative JSON integers (not bools), else None."""
    if not isinstance(value, list) or len(value) > 64:
        return None
    if not all(type(x) is int and 0 <= x < 1 << 62 for x in value):
        return None
    return value


def check_finite(where: str, name: str, table: torch.Tensor) -> float:
    """CheckpointError if a floating table holds NaN or ±Inf (one pass, no allocation:
    min and max propagate NaN and reach ±Inf); else the table's largest |value|, which the
    server keeps (the float16 range check) instead of reading 1 GB a second time."""
    if not table.is_floating_point() or table.numel() == 0:
        return 0.0
    low, high = torch.aminmax(table)
    if not (math.isfinite(float(low)) and math.isfinite(float(high))):
        raise CheckpointError(f"{where}: {name} holds NaN or Inf values")
    return max(abs(float(low)), abs(float(high)))

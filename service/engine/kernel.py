"""The one-pass CPU lookup (``lookup.c``): built once with the system C compiler, loaded
with ctypes, used by ``tables`` for fp32 tables whenever it is there.

    python -m service.engine.kernel      # build it now (setup and image build stages)

The library's file name carries the source's hash, so an edited ``lookup.c`` is never
served by a stale build. It is built into this package's folder (or ``EMBED_KERNEL_DIR``)
through a temporary name and an atomic rename, so workers starting together never load a
half-written file. Where no compiler is found (a runtime image built without running the
command above) ``load`` returns None and the tables take torch's path: same bits, more
passes over the answer (docs/performance.md counts both).
"""

from __future__ import annotations

import ctypes
import functools
import hashlib
import logging
import os
import shutil
import subprocess
import tempfile
from pathlib import Path

import torch

__all__ = ["OUT_KINDS", "BusError", "build", "embed_rows", "guarded", "load"]

log = logging.getLogger(__name__)
_guarded = False  # set by load()
_SOURCE = Path(__file__).with_name("lookup.c")
# IEEE sums and roundings only: no -ffast-math, and no FMA contraction of to_f16's scale.
_FLAGS = ["-O3", "-shared", "-fPIC", "-std=c11", "-ffp-contract=off", "-fno-math-errno"]
OUT_KINDS = {torch.float32: 0, torch.bfloat16: 1, torch.float16: 2}


def _library_path() -> Path:
    digest = hashlib.sha256(_SOURCE.read_bytes() + " ".join(_FLAGS).encode()).hexdigest()
    folder = Path(os.environ.get("EMBED_KERNEL_DIR") or _SOURCE.parent)
    return folder / f"_lookup-{digest[:16]}.so"


def build() -> Path:
    """Compile ``lookup.c`` (if not built yet) and return the library's path."""
    target = _library_path()
    if target.exists():
        return target
    cc = os.environ.get("CC") or shutil.which("cc") or shutil.which("gcc")
    if cc is None:
        raise FileNotFoundError("no C compiler (cc, gcc or $CC) to build the lookup kernel")
    target.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=target.parent, prefix=".lookup-", suffix=".so")
    os.close(fd)
    try:
        subprocess.run([cc, *_FLAGS, "-o", tmp, str(_SOURCE)], check=True,
                       capture_output=True, text=True)
        os.replace(tmp, target)
        for stale in target.parent.glob("_lookup-*.so"):  # builds of an older lookup.c
            if stale != target:
                stale.unlink(missing_ok=True)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)
    return target


@functools.lru_cache(maxsize=1)
def load() -> ctypes.CDLL | None:
    """The loaded kernel, built first if needed; None (torch's path) if it cannot be."""
    if os.environ.get("EMBED_LOOKUP_KERNEL", "1") == "0":  # the torch path, for comparison
        return None
    try:
        path = _library_path()
        if not path.exists():
            path = build()
        lib = ctypes.CDLL(str(path))  # CDLL: the GIL is released during each call
    except (OSError, subprocess.CalledProcessError) as e:
        detail = e.stderr if isinstance(e, subprocess.CalledProcessError) else e
        log.warning("one-pass lookup kernel unavailable (%s); using torch's gather, add "
                    "and cast", str(detail).strip()[:300])
        return None
    for fn in (lib.embed_rows, lib.embed_rows_guarded):
        fn.restype = ctypes.c_int
        fn.argtypes = (ctypes.c_void_p, ctypes.c_int64, ctypes.c_int64, ctypes.c_void_p,
                       ctypes.c_int64, ctypes.c_void_p, ctypes.c_int64, ctypes.c_void_p,
                       ctypes.c_int64, ctypes.c_void_p, ctypes.c_int)
    lib.install_guard.restype = ctypes.c_int
    global _guarded
    _guarded = lib.install_guard() == 0  # SIGBUS in a guarded write: an error, not a crash
    if not _guarded:
        log.warning("lookup kernel: SIGBUS guard not installed; shared memory is written "
                    "with pwrite")
    return lib


def guarded() -> bool:
    """Whether the loaded kernel's SIGBUS guard is installed (guarded writes allowed)."""
    return _guarded


class BusError(OSError):
    """A guarded write's memory went away under it (its shared-memory object shrank)."""


def embed_rows(lib: ctypes.CDLL, table: torch.Tensor, ids: torch.Tensor,
               position_table: torch.Tensor | None, positions: torch.Tensor | None,
               start: int, out: torch.Tensor, guarded: bool = False) -> None:
    """out[i] = table[ids[i]] (+ position_table[positions[i] or start + i]), fp32 add,
    rounded once into out's dtype. Tables fp32 and contiguous; ids/positions int64
    contiguous; out (N, dim) contiguous. Raises IndexError if an index is outside its
    table; ``guarded`` (out maps memory another process may shrink): BusError if a store
    faulted, and the rows are then partly written."""
    n, dim = int(ids.shape[0]), int(table.shape[1])
    # The C side trusts these: a mismatch would write outside ``out``.
    if not (out.is_contiguous() and tuple(out.shape) == (n, dim) and table.is_contiguous()
            and table.dtype == torch.float32 and ids.dtype == torch.int64
            and ids.is_contiguous() and (positions is None or (
                positions.dtype == torch.int64 and positions.is_contiguous()
                and int(positions.shape[0]) == n)) and (position_table is None or (
                position_table.dtype == torch.float32 and position_table.is_contiguous()
                and int(position_table.shape[1]) == dim))):
        raise ValueError("lookup kernel: tensors of the wrong layout, dtype or shape")
    rc = (lib.embed_rows_guarded if guarded else lib.embed_rows)(
        table.data_ptr(), int(table.shape[0]), dim, ids.data_ptr(), n,
        None if position_table is None else position_table.data_ptr(),
        0 if position_table is None else int(position_table.shape[0]),
        None if positions is None else positions.data_ptr(), start,
        out.data_ptr(), OUT_KINDS[out.dtype])
    if rc == -3:
        raise BusError("the memory being written went away (SIGBUS)")
    if rc != 0:
        raise IndexError(f"lookup kernel refused its indices (rc={rc})")


if __name__ == "__main__":
    print(build())

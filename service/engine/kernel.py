"""The one-pass CPU lookup (``lookup.c``): built once with the system C compiler, loaded
with ctypes, used by ``tables`` for fp32 tables whenever it is there.

    python -m service.engine.kernel      # build it now (scripts/setup.sh does)

Built by ``kernel_build`` (the standard library only: the images' build stage runs it
without torch and copies the library into the runtime stage, which has no compiler).
Where there is neither a library nor a compiler ``load`` returns None and the tables take
torch's path: same bits, more passes over the answer (docs/performance.md counts both).
"""

from __future__ import annotations

import ctypes
import functools
import logging
import os
import subprocess

import torch

from service.engine.kernel_build import build, library_path

__all__ = ["OUT_KINDS", "BusError", "build", "embed_rows", "guarded", "load"]

log = logging.getLogger(__name__)
_guarded = False  # set by load()
OUT_KINDS = {torch.float32: 0, torch.bfloat16: 1, torch.float16: 2}
_F32, _I64 = torch.float32, torch.int64  # dtypes are singletons: compared with `is`


@functools.lru_cache(maxsize=1)
def load() -> ctypes.CDLL | None:
    """The loaded kernel, built first if needed; None (torch's path) if it cannot be."""
    if os.environ.get("EMBED_LOOKUP_KERNEL", "1") == "0":  # the torch path, for comparison
        return None
    try:
        path = library_path()
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
    n, dim = ids.shape[0], table.shape[1]  # torch.Size holds Python ints
    # The C side trusts these: a mismatch would write outside ``out``.
    if not (out.is_contiguous() and out.shape == (n, dim) and table.is_contiguous()
            and table.dtype is _F32 and ids.dtype is _I64 and ids.is_contiguous()
            and (positions is None or (positions.dtype is _I64 and positions.is_contiguous()
                                       and positions.shape[0] == n))
            and (position_table is None or (position_table.dtype is _F32
                                            and position_table.is_contiguous()
                                            and position_table.shape[1] == dim))):
        raise ValueError("lookup kernel: tensors of the wrong layout, dtype or shape")
    rc = (lib.embed_rows_guarded if guarded else lib.embed_rows)(
        table.data_ptr(), table.shape[0], dim, ids.data_ptr(), n,
        None if position_table is None else position_table.data_ptr(),
        0 if position_table is None else position_table.shape[0],
        None if positions is None else positions.data_ptr(), start,
        out.data_ptr(), OUT_KINDS[out.dtype])
    if rc == -3:
        raise BusError("the memory being written went away (SIGBUS)")
    if rc != 0:
        raise IndexError(f"lookup kernel refused its indices (rc={rc})")


if __name__ == "__main__":
    print(build())

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

import numpy as np
import torch

from service.engine.kernel_build import build, library_path

__all__ = ["OUT_KINDS", "BusError", "KernelTables", "build", "guarded", "load"]

log = logging.getLogger(__name__)
_guarded = False  # set by load()
OUT_KINDS = {torch.float32: 0, torch.bfloat16: 1, torch.float16: 2}
_ITEMSIZE = {kind: dtype.itemsize for dtype, kind in OUT_KINDS.items()}
_F32 = torch.float32  # torch dtypes are singletons: compared with `is`
_I64 = np.dtype(np.int64)


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


class KernelTables:
    """A table (and the position table added to it, if any) as the kernel reads them:
    their layout checked once, then only addresses and sizes. Holds the tensors, so the
    addresses stay valid while it lives (the tables are frozen: never resized)."""

    __slots__ = ("_keep", "dim", "lib", "position", "position_rows", "table", "table_rows")

    def __init__(self, lib: ctypes.CDLL, table: torch.Tensor,
                 position_table: torch.Tensor | None) -> None:
        # The C side trusts these: a mismatch would read outside a table.
        if not (table.dim() == 2 and table.is_contiguous() and table.dtype is _F32
                and (position_table is None
                     or (position_table.dim() == 2 and position_table.dtype is _F32
                         and position_table.is_contiguous()
                         and position_table.shape[1] == table.shape[1]))):
            raise ValueError("lookup kernel: tables of the wrong layout, dtype or shape")
        self.lib = lib
        self._keep = (table, position_table)
        self.table, self.table_rows = table.data_ptr(), table.shape[0]
        self.dim = table.shape[1]  # torch.Size holds Python ints
        self.position = None if position_table is None else position_table.data_ptr()
        self.position_rows = 0 if position_table is None else position_table.shape[0]

    def write(self, ids: np.ndarray, positions: np.ndarray | None, start: int,
              address: int, nbytes: int, kind: int, guarded: bool = False) -> None:
        """Rows of ``ids`` (+ position rows at ``positions``, or from ``start``) into the
        ``nbytes`` of writable memory at ``address``, in the out dtype ``kind``
        (``OUT_KINDS``). IndexError if an index is outside its table; ``guarded`` (the
        memory maps an object another process may shrink): BusError if a store faulted,
        and the rows are then partly written."""
        n = ids.shape[0]
        # The C side trusts these: a mismatch would write outside the memory given.
        if not (ids.dtype == _I64 and ids.ndim == 1
                and nbytes == n * self.dim * _ITEMSIZE[kind]
                and (positions is None or (positions.dtype == _I64 and positions.ndim == 1
                                           and positions.shape[0] == n))):
            raise ValueError("lookup kernel: ids or output of the wrong layout or size")
        lib = self.lib
        # The indices go as bytes (ctypes passes a bytes object's own buffer): a copy of
        # 8 B per row is cheaper than reading a numpy array's address through ctypes.
        rc = (lib.embed_rows_guarded if guarded else lib.embed_rows)(
            self.table, self.table_rows, self.dim, ids.tobytes(), n, self.position,
            self.position_rows, None if positions is None else positions.tobytes(), start,
            address, kind)
        if rc == -3:
            raise BusError("the memory being written went away (SIGBUS)")
        if rc != 0:
            raise IndexError(f"lookup kernel refused its indices (rc={rc})")


if __name__ == "__main__":
    print(build())

"""One registered shared-memory object: an open descriptor, a shared mapping of its region
where stores into it are guarded, and writes checked against what the object is now.

The object's owner may shrink, truncate or unlink it at any time (service/engine/shm.py
says how each case is answered); everything here checks before it writes, and writes
either with ``pwrite`` (fails with an errno) or through the lookup kernel's guarded store
(a SIGBUS becomes an error: ``shm_plan.ShmPlan.lookup``).
"""

from __future__ import annotations

import contextlib
import ctypes
import mmap
import os
from dataclasses import dataclass

from service.errors import FailedPrecondition

__all__ = ["Descriptor", "Region", "short"]

def short(value: str, limit: int = 64) -> str:
    """A value quoted for a message: repr, at most ``limit`` characters of it."""
    return repr(value) if len(value) <= limit else repr(value[:limit]) + "…"


class Descriptor:
    """An open descriptor of one object, and (where the lookup kernel's SIGBUS guard is
    installed) a shared mapping of its region; both released when the last holder lets
    it go."""

    __slots__ = ("address", "fd", "length")

    def __init__(self, fd: int) -> None:
        self.fd = fd
        self.address: int | None = None  # of the mapping's first byte (page-aligned)
        self.length = 0

    def map(self, offset: int, byte_size: int) -> int | None:
        """Map bytes [offset, offset + byte_size) shared; the address of ``offset`` in it,
        or None (no mapping: writes use pwrite)."""
        start = offset - offset % mmap.PAGESIZE
        length = offset - start + byte_size
        address = _libc.mmap(None, length, mmap.PROT_READ | mmap.PROT_WRITE, mmap.MAP_SHARED,
                             self.fd, start)
        if address in (None, _MAP_FAILED):
            return None
        self.address, self.length = address, length
        return int(address) + offset - start

    def __del__(self) -> None:
        if self.address is not None:
            _libc.munmap(self.address, self.length)
        with contextlib.suppress(OSError):
            os.close(self.fd)


_libc = ctypes.CDLL(None, use_errno=True)
_libc.mmap.restype = ctypes.c_void_p
_libc.mmap.argtypes = (ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int,
                       ctypes.c_int, ctypes.c_long)
_libc.munmap.argtypes = (ctypes.c_void_p, ctypes.c_size_t)
_MAP_FAILED = ctypes.c_void_p(-1).value


@dataclass(frozen=True, eq=False)
class Region:
    """A registered region: ``byte_size`` bytes from ``offset`` of object ``key``."""

    name: str
    key: str
    offset: int
    byte_size: int
    owner: str  # the identity that registered it
    inode: tuple[int, int]  # (st_dev, st_ino) of the object
    handle: Descriptor
    mapped: int | None = None  # address of the region's first byte when mapped

    def check(self, at: int, n: int) -> None:
        """FAILED_PRECONDITION unless ``n`` bytes at ``at`` are still inside the object."""
        where = self.offset + at
        st = os.fstat(self.handle.fd)
        if st.st_nlink == 0:
            raise FailedPrecondition(
                f"shared-memory object {short(self.key)} of region {short(self.name)} "
                f"was unlinked; create it again and re-register the region")
        if st.st_size < where + n:
            raise FailedPrecondition(
                f"shared-memory object {short(self.key)} of region {short(self.name)} "
                f"is now {st.st_size} bytes, shrunk below the {where + n} this output "
                f"needs; re-register the region after resizing it")

    def write(self, at: int, data: memoryview) -> None:
        """``data`` at ``at`` bytes into the region: pwrite, never a store into a mapping."""
        fd, n = self.handle.fd, len(data)
        where = self.offset + at
        try:
            self.check(at, n)
            done = 0
            while done < n:  # a shrink racing the check only makes this extend it again
                written = os.pwrite(fd, data[done:], where + done)
                if written <= 0:
                    raise OSError(0, "no progress")
                done += written
        except OSError as e:
            raise FailedPrecondition(
                f"shared-memory object {short(self.key)} of region {short(self.name)} "
                f"cannot be written: {e.strerror}") from None


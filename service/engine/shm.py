"""System shared memory (Triton-style): outputs written straight into a client's region.

A client creates a POSIX shared-memory object (a file under ``/dev/shm``), registers it by
name with a key, offset and size, and names region + offset in a request. The one-pass
lookup kernel stores the [T, C] rows straight into the server's mapping of the region
(``ShmPlan.lookup``: each byte written once); without the kernel the rows go into a private
buffer and ``os.pwrite`` copies them into the object. The response carries only shape,
dtype and the byte range, so the tensor never crosses the transport. This module is the
registry of /dev/shm objects (tenancy, caps and bounds are ``regions``', shared with CUDA
regions); ``shm_region`` one object's descriptor, mapping and checked writes;
``shm_plan`` where a request's rows go.

Safe against its own users, by construction:

- **No unguarded store.** The object's owner can shrink, truncate or unlink it at any
  time. A region is an open descriptor plus, where ``kernel.guarded()``, a shared mapping
  that only ``lookup.c``'s guarded row loop stores into: a SIGBUS there (a shrink under the
  stores) becomes ``kernel.BusError`` and FAILED_PRECONDITION for that request, never a
  dead process. Elsewhere (no kernel, padded OIP outputs) a write is a ``pwrite`` that
  fails with an errno (or extends the object again). Before each write the object's size
  and link count are checked, so a shrunk or unlinked object gets FAILED_PRECONDITION
  naming the region. A region costs one descriptor and the address space of its range.
- **Tenancy.** A region belongs to the identity that registered it (``Caller.identity``,
  resolved by the frame from the token or certificate; "" when auth is off: one
  namespace). Listing, unregistering (``""`` = all of the caller's own) and writing see
  only the caller's regions; another identity's region is "not registered". One object
  (device + inode) is registered by one identity at a time.
- **Local peers only.** Every shared-memory call from a peer that is not loopback or a
  Unix socket is PERMISSION_DENIED unless ``allow_remote`` (``--shm-allow-remote``).
- **Bounds.** Every write is checked against the region's ``byte_size`` (and a request's
  own ``byte_size`` bound, as Triton's ``shared_memory_byte_size``); registrations are
  capped per identity and in all (RESOURCE_EXHAUSTED).
- **Names.** A key is a plain object name (``/name``: ASCII letters, digits, ``._-``), opened
  under ``/dev/shm`` with ``O_NOFOLLOW``, never created, and must be a regular file; a
  region name is printable and short. Anything else is INVALID_ARGUMENT.

Unregistering drops the registry's reference only: a request in flight holds its region
(and so its descriptor), finishes, and the descriptor is closed after it.
"""

from __future__ import annotations

import os
import re
import stat
from pathlib import Path

import torch

from service.engine import kernel
from service.engine.regions import Caller, RegionTable, check_name
from service.engine.shm_plan import ShmPlan
from service.engine.shm_region import Descriptor, Region, short
from service.errors import InvalidArgument, NotFound, PermissionDenied

__all__ = ["SHM_ROOT", "SharedMemoryRegistry"]

SHM_ROOT = Path("/dev/shm")
_KEY = re.compile(r"[A-Za-z0-9._-]{1,255}")  # an object name under /dev/shm (NAME_MAX)


class SharedMemoryRegistry(RegionTable[Region]):
    """Registered /dev/shm regions by (owner, name); safe from the event loop and compute
    thread."""

    def __init__(self, root: Path = SHM_ROOT, allow_remote: bool = False,
                 max_per_identity: int = 16, max_regions: int = 1024) -> None:
        super().__init__(allow_remote, max_per_identity, max_regions)
        self.root = root

    def register(self, caller: Caller, name: str, key: str, offset: int,
                 byte_size: int) -> Region:
        """Open the object ``key`` as region ``name`` of the caller, bounds-checked now."""
        self.check_peer(caller)
        check_name(name)
        path = self._path(key)
        if byte_size <= 0:
            raise InvalidArgument(f"byte_size={byte_size} of region {short(name)} must be > 0")
        with self._lock:
            self._check_room(caller.identity, name)
        try:
            fd = os.open(path, os.O_RDWR | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK)
        except FileNotFoundError:
            raise NotFound(f"shared-memory object {short(key)} does not exist under "
                           f"{self.root}") from None
        except OSError as e:  # a symlink (ELOOP), a directory, no permission, no fds
            raise InvalidArgument(f"shared-memory object {short(key)} cannot be opened: "
                                  f"{e.strerror}") from None
        handle = Descriptor(fd)  # closes fd whenever it is dropped, on any path
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise InvalidArgument(f"shared-memory object {short(key)} is not a regular file")
        if offset + byte_size > st.st_size:
            raise InvalidArgument(
                f"region {short(name)}: offset {offset} + byte_size {byte_size} = "
                f"{offset + byte_size} exceeds the size of {short(key)} ({st.st_size} bytes)")
        # Mapped only where every store into it is guarded (kernel.guarded: a SIGBUS from
        # a shrink becomes FAILED_PRECONDITION); otherwise the rows go in with pwrite.
        mapped = (handle.map(offset, byte_size)
                  if kernel.load() is not None and kernel.guarded() else None)
        region = Region(name, key, offset, byte_size, caller.identity,
                        (st.st_dev, st.st_ino), handle, mapped)
        with self._lock:
            self._check_room(caller.identity, name)  # again: another call may have won
            for other in self._regions.values():
                if other.inode == region.inode and other.owner != region.owner:
                    raise PermissionDenied(f"shared-memory object {short(key)} is registered "
                                           f"by another client")
            self._regions[(caller.identity, name)] = region
        return region

    def plan(self, caller: Caller, name: str, offset: int, shape: tuple[int, ...],
             dtype: torch.dtype, field: str, byte_size: int | None = None) -> ShmPlan:
        """Where ``shape`` rows of ``dtype`` go: ``offset`` bytes into the caller's region
        ``name``, within the region and within ``byte_size`` (the request's own bound)."""
        region, _ = self._fitting(caller, name, offset, shape, dtype.itemsize, field,
                                  byte_size)
        return ShmPlan(region, offset, shape, dtype)

    def _path(self, key: str) -> Path:
        name = key[1:] if key.startswith("/") else key
        if not _KEY.fullmatch(name) or name in (".", ".."):
            raise InvalidArgument(f"shared-memory key {short(key)} must name an object "
                                  f"directly under {self.root} (like '/my-region': ASCII "
                                  f"letters, digits, '.', '_', '-'; no other '/')")
        return self.root / name

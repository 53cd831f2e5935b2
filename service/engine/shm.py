"""System shared memory (Triton-style): outputs written straight into a client's region.

A client creates a POSIX shared-memory object (a file under ``/dev/shm``), registers it by
name with a key, offset and size, and names region + offset in a request. The one-pass
lookup kernel stores the [T, C] rows straight into the server's mapping of the region
(``ShmPlan.lookup``: each byte written once); without the kernel the rows go into a private
buffer and ``os.pwrite`` copies them into the object. The response carries only shape,
dtype and the byte range, so the tensor never crosses the transport. This module is the
registry (names, tenancy, bounds); ``shm_region`` one object's descriptor, mapping and
checked writes; ``shm_plan`` where a request's rows go.

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

import ipaddress
import os
import re
import stat
import threading
import urllib.parse
from pathlib import Path
from typing import Protocol

import torch

from service.engine import kernel
from service.engine.shm_plan import ShmPlan
from service.engine.shm_region import Descriptor, Region, short
from service.errors import (
    AlreadyExists,
    InvalidArgument,
    NotFound,
    PermissionDenied,
    ResourceExhausted,
)

__all__ = ["SHM_ROOT", "Caller", "SharedMemoryRegistry", "is_local_peer"]

SHM_ROOT = Path("/dev/shm")
MAX_NAME_CHARS = 128  # a region name's length
_KEY = re.compile(r"[A-Za-z0-9._-]{1,255}")  # an object name under /dev/shm (NAME_MAX)
_LOCAL_SCHEMES = ("unix:", "unix-abstract:")


class Caller(Protocol):
    """Who asks (the frame's ``Call`` is one): the identity owning regions, the peer."""

    @property
    def identity(self) -> str: ...

    @property
    def peer(self) -> str: ...


def is_local_peer(peer: str) -> bool:
    """A Unix socket or a loopback address (``ipv4:127.0.0.1:5``, ``ipv6:[::1]:5``, also
    percent-encoded as newer gRPC writes it)."""
    if peer.startswith(_LOCAL_SCHEMES):
        return True
    scheme, _, rest = peer.partition(":")
    if scheme not in ("ipv4", "ipv6"):
        return False
    host = urllib.parse.unquote(rest).rpartition(":")[0].strip("[]")
    try:
        address = ipaddress.ip_address(host)
    except ValueError:
        return False
    if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
        address = address.ipv4_mapped
    return address.is_loopback


class SharedMemoryRegistry:
    """Registered regions by (owner, name); safe from the event loop and compute thread."""

    def __init__(self, root: Path = SHM_ROOT, allow_remote: bool = False,
                 max_per_identity: int = 16, max_regions: int = 1024) -> None:
        self.root = root
        self.allow_remote = allow_remote
        self.max_per_identity = max_per_identity
        self.max_regions = max_regions
        self._regions: dict[tuple[str, str], Region] = {}
        self._lock = threading.Lock()

    def check_peer(self, caller: Caller) -> None:
        """PERMISSION_DENIED for a non-local peer unless remote use is allowed."""
        if not self.allow_remote and not is_local_peer(caller.peer):
            raise PermissionDenied(
                "shared-memory calls are served to local peers only (loopback or a Unix "
                "socket); this peer is not local (the server's --shm-allow-remote enables "
                "them)")

    def register(self, caller: Caller, name: str, key: str, offset: int,
                 byte_size: int) -> Region:
        """Open the object ``key`` as region ``name`` of the caller, bounds-checked now."""
        self.check_peer(caller)
        _check_name(name)
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

    def _check_room(self, owner: str, name: str) -> None:
        if (owner, name) in self._regions:
            raise AlreadyExists(f"region {short(name)} is already registered; unregister it "
                                f"first")
        mine = sum(1 for o, _ in self._regions if o == owner)
        if mine >= self.max_per_identity:
            raise ResourceExhausted(f"{mine} regions registered by this client: "
                                    f"max_shm_regions_per_identity={self.max_per_identity}; "
                                    f"unregister one first")
        if len(self._regions) >= self.max_regions:
            raise ResourceExhausted(f"{len(self._regions)} regions registered: "
                                    f"max_shm_regions={self.max_regions}; retry later")

    def unregister(self, caller: Caller, name: str) -> None:
        """Forget one of the caller's regions ("" = every one of the caller's own);
        requests in flight keep theirs until they finish."""
        self.check_peer(caller)
        with self._lock:
            if not name:
                for key in [k for k in self._regions if k[0] == caller.identity]:
                    del self._regions[key]
            elif self._regions.pop((caller.identity, name), None) is None:
                raise NotFound(f"region {short(name)} is not registered")

    def regions(self, caller: Caller, name: str = "") -> list[Region]:
        """The caller's registered regions, or the one named."""
        self.check_peer(caller)
        with self._lock:
            if not name:
                return [r for (owner, _), r in sorted(self._regions.items())
                        if owner == caller.identity]
            region = self._regions.get((caller.identity, name))
        if region is None:
            raise NotFound(f"region {short(name)} is not registered")
        return [region]

    def plan(self, caller: Caller, name: str, offset: int, shape: tuple[int, ...],
             dtype: torch.dtype, field: str, byte_size: int | None = None) -> ShmPlan:
        """Where ``shape`` rows of ``dtype`` go: ``offset`` bytes into the caller's region
        ``name``, within the region and within ``byte_size`` (the request's own bound)."""
        if not name:  # "" lists every region elsewhere; here it names none
            raise InvalidArgument(f"{field}.region is empty: name a registered region")
        (region,) = self.regions(caller, name)
        nbytes = dtype.itemsize
        for n in shape:
            nbytes *= n
        limit, what = region.byte_size - offset, f"region {short(name)} has " \
            f"{region.byte_size} bytes"
        if byte_size is not None and byte_size < limit:
            limit, what = byte_size, f"the request allows {byte_size} bytes"
        if offset < 0 or nbytes > limit:
            row = nbytes // max(1, shape[-2]) if len(shape) >= 2 else nbytes
            raise InvalidArgument(
                f"{field}: the output needs {nbytes} bytes at offset {offset} but {what}; "
                f"the largest T that fits is {max(0, limit) // max(1, row)}")
        return ShmPlan(region, offset, shape, dtype)

    def _path(self, key: str) -> Path:
        name = key[1:] if key.startswith("/") else key
        if not _KEY.fullmatch(name) or name in (".", ".."):
            raise InvalidArgument(f"shared-memory key {short(key)} must name an object "
                                  f"directly under {self.root} (like '/my-region': ASCII "
                                  f"letters, digits, '.', '_', '-'; no other '/')")
        return self.root / name


def _check_name(name: str) -> None:
    if not name:
        raise InvalidArgument("region name is empty")
    if len(name) > MAX_NAME_CHARS or not name.isprintable():
        raise InvalidArgument(f"region name {short(name)} must be printable and at most "
                              f"{MAX_NAME_CHARS} characters")

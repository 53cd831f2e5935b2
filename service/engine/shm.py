"""System shared memory (Triton-style): outputs written straight into a client's region.

A client creates a POSIX shared-memory object (a file under ``/dev/shm``), registers it by
name with a key, offset and size, and names region + offset in a request. The one-pass
lookup kernel stores the [T, C] rows straight into the server's mapping of the region
(``ShmPlan.lookup``: each byte written once); without the kernel the rows go into a private
buffer and ``os.pwrite`` copies them into the object. The response carries only shape,
dtype and the byte range, so the tensor never crosses the transport.

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

import contextlib
import ctypes
import ipaddress
import mmap
import os
import re
import stat
import threading
import urllib.parse
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import torch

from service.engine import kernel
from service.engine.batcher import Timing
from service.engine.tables import EmbeddingTables, Span
from service.errors import (
    AlreadyExists,
    FailedPrecondition,
    InvalidArgument,
    NotFound,
    PermissionDenied,
    ResourceExhausted,
)

__all__ = ["SHM_ROOT", "Caller", "Region", "SharedMemoryRegistry", "ShmDestination", "ShmPlan",
           "is_local_peer"]

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


def _short(value: str, limit: int = 64) -> str:
    """A value quoted for a message: repr, at most ``limit`` characters of it."""
    return repr(value) if len(value) <= limit else repr(value[:limit]) + "…"


class _Descriptor:
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
_memory_view = ctypes.pythonapi.PyMemoryView_FromMemory
_memory_view.restype = ctypes.py_object
_memory_view.argtypes = (ctypes.c_void_p, ctypes.c_ssize_t, ctypes.c_int)
_PyBUF_WRITE = 0x200


@dataclass(frozen=True, eq=False)
class Region:
    """A registered region: ``byte_size`` bytes from ``offset`` of object ``key``."""

    name: str
    key: str
    offset: int
    byte_size: int
    owner: str  # the identity that registered it
    inode: tuple[int, int]  # (st_dev, st_ino) of the object
    handle: _Descriptor
    mapped: int | None = None  # address of the region's first byte when mapped

    def check(self, at: int, n: int) -> None:
        """FAILED_PRECONDITION unless ``n`` bytes at ``at`` are still inside the object."""
        where = self.offset + at
        st = os.fstat(self.handle.fd)
        if st.st_nlink == 0:
            raise FailedPrecondition(
                f"shared-memory object {_short(self.key)} of region {_short(self.name)} "
                f"was unlinked; create it again and re-register the region")
        if st.st_size < where + n:
            raise FailedPrecondition(
                f"shared-memory object {_short(self.key)} of region {_short(self.name)} "
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
                f"shared-memory object {_short(self.key)} of region {_short(self.name)} "
                f"cannot be written: {e.strerror}") from None


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
            raise InvalidArgument(f"byte_size={byte_size} of region {_short(name)} must be > 0")
        with self._lock:
            self._check_room(caller.identity, name)
        try:
            fd = os.open(path, os.O_RDWR | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK)
        except FileNotFoundError:
            raise NotFound(f"shared-memory object {_short(key)} does not exist under "
                           f"{self.root}") from None
        except OSError as e:  # a symlink (ELOOP), a directory, no permission, no fds
            raise InvalidArgument(f"shared-memory object {_short(key)} cannot be opened: "
                                  f"{e.strerror}") from None
        handle = _Descriptor(fd)  # closes fd whenever it is dropped, on any path
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise InvalidArgument(f"shared-memory object {_short(key)} is not a regular file")
        if offset + byte_size > st.st_size:
            raise InvalidArgument(
                f"region {_short(name)}: offset {offset} + byte_size {byte_size} = "
                f"{offset + byte_size} exceeds the size of {_short(key)} ({st.st_size} bytes)")
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
                    raise PermissionDenied(f"shared-memory object {_short(key)} is registered "
                                           f"by another client")
            self._regions[(caller.identity, name)] = region
        return region

    def _check_room(self, owner: str, name: str) -> None:
        if (owner, name) in self._regions:
            raise AlreadyExists(f"region {_short(name)} is already registered; unregister it "
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
                raise NotFound(f"region {_short(name)} is not registered")

    def regions(self, caller: Caller, name: str = "") -> list[Region]:
        """The caller's registered regions, or the one named."""
        self.check_peer(caller)
        with self._lock:
            if not name:
                return [r for (owner, _), r in sorted(self._regions.items())
                        if owner == caller.identity]
            region = self._regions.get((caller.identity, name))
        if region is None:
            raise NotFound(f"region {_short(name)} is not registered")
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
        limit, what = region.byte_size - offset, f"region {_short(name)} has " \
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
            raise InvalidArgument(f"shared-memory key {_short(key)} must name an object "
                                  f"directly under {self.root} (like '/my-region': ASCII "
                                  f"letters, digits, '.', '_', '-'; no other '/')")
        return self.root / name


def _check_name(name: str) -> None:
    if not name:
        raise InvalidArgument("region name is empty")
    if len(name) > MAX_NAME_CHARS or not name.isprintable():
        raise InvalidArgument(f"region name {_short(name)} must be printable and at most "
                              f"{MAX_NAME_CHARS} characters")


class _Buffers:
    """Private row buffers, reused: a fresh multi-MB buffer per request is page-faulted in
    each time (measured: half the cost of the pwrite path with glibc's default malloc).
    Every row of a reused buffer is written before it is copied out (the lookup writes
    all N rows; padding rows are zeroed), so nothing of an earlier request leaks."""

    def __init__(self, max_idle_bytes: int = 64 << 20) -> None:
        self.max_idle_bytes = max_idle_bytes
        self._idle: list[torch.Tensor] = []  # uint8, smallest first
        self._idle_bytes = 0
        self._lock = threading.Lock()

    def take(self, nbytes: int) -> torch.Tensor:
        """A uint8 buffer of at least ``nbytes``."""
        with self._lock:
            for i, buf in enumerate(self._idle):
                if buf.numel() >= nbytes:
                    del self._idle[i]
                    self._idle_bytes -= buf.numel()
                    return buf
        return torch.empty(nbytes, dtype=torch.uint8)

    def give(self, buf: torch.Tensor) -> None:
        """Keep ``buf`` for a later request (while the idle total stays bounded)."""
        with self._lock:
            if self._idle_bytes + buf.numel() <= self.max_idle_bytes:
                self._idle.append(buf)
                self._idle.sort(key=lambda b: b.numel())
                self._idle_bytes += buf.numel()


_BUFFERS = _Buffers()


class ShmPlan:
    """A request's rows for a region: either stored straight into the region's mapping by
    the guarded one-pass lookup (``lookup``), or written into a private buffer (``rows``:
    the torch path, padded OIP outputs) and copied into the object by ``write`` (pwrite)."""

    __slots__ = ("_at", "_buffer", "_direct", "byte_size", "dtype", "region", "shape")

    def __init__(self, region: Region, at: int, shape: tuple[int, ...],
                 dtype: torch.dtype) -> None:
        self.region = region  # held: its descriptor (and mapping) stay until it is done
        self._at = at
        self.shape, self.dtype = shape, dtype
        nbytes = dtype.itemsize
        for n in shape:
            nbytes *= n
        self.byte_size = nbytes
        self._buffer: torch.Tensor | None = None
        self._direct = False  # the rows went straight into the mapping

    @property
    def rows(self) -> torch.Tensor:
        """The private buffer of the rows, shaped ``shape`` (taken on first use)."""
        if self._buffer is None:
            self._buffer = _BUFFERS.take(self.byte_size)
        return self._buffer[: self.byte_size].view(self.dtype).view(self.shape)

    def lookup(self, tables: EmbeddingTables, ids: torch.Tensor, spans: list[Span],
               compose: int) -> bool:
        """Store the rows straight into the region's mapping, in one guarded pass; False
        (nothing done) where that path is not open: no mapping, no guarded kernel."""
        if self.region.mapped is None or not tables.writes_guarded or not self.byte_size:
            return False
        self.region.check(self._at, self.byte_size)
        view = _memory_view(self.region.mapped + self._at, self.byte_size, _PyBUF_WRITE)
        rows = torch.frombuffer(view, dtype=self.dtype).view(-1, self.shape[-1])  # (N, C)
        try:
            tables.embed_guarded(ids, spans, compose, rows)
        except kernel.BusError:
            self.region.check(self._at, self.byte_size)  # names the size it shrank to
            raise FailedPrecondition(
                f"shared-memory object {_short(self.region.key)} of region "
                f"{_short(self.region.name)} shrank while its rows were written; "
                f"re-register the region after resizing it") from None
        self._direct = True
        return True

    def write(self) -> None:
        """The private rows into the region (FAILED_PRECONDITION if the object shrank or
        went); the buffer goes back for reuse either way. Nothing to do after ``lookup``."""
        try:
            if self.byte_size and not self._direct:
                data = self.rows.reshape(-1).view(torch.uint8).numpy().data
                self.region.write(self._at, data)
        finally:
            buffer, self._buffer = self._buffer, None
            if buffer is not None:
                _BUFFERS.give(buffer)

    def destination(self, encode: Callable[[Timing], Any]) -> ShmDestination:
        """The batcher destination: every row, flattened to (N, C)."""
        return ShmDestination(self, encode)


class ShmDestination:
    """A job's rows for a region; the batcher calls ``lookup`` (rows straight into the
    mapping) and falls back to ``rows``; ``finish`` writes private rows there and builds
    the (small) response message."""

    __slots__ = ("_encode", "_plan", "dtype")

    def __init__(self, plan: ShmPlan, encode: Callable[[Timing], Any]) -> None:
        self._plan = plan
        self.dtype = plan.dtype
        self._encode = encode

    @property
    def rows(self) -> torch.Tensor:
        """The private rows, flattened (N, C)."""
        return self._plan.rows.view(-1, self._plan.shape[-1])

    def lookup(self, tables: EmbeddingTables, ids: torch.Tensor, spans: list[Span],
               compose: int) -> bool:
        """The rows straight into the region, if that path is open (``ShmPlan.lookup``)."""
        return self._plan.lookup(tables, ids, spans, compose)

    def finish(self, timing: Timing) -> Any:
        """Write the rows into the region, then the response with the timing."""
        self._plan.write()
        return self._encode(timing)

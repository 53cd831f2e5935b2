"""System shared memory (Triton-style): outputs written straight into a client's region.

A client creates a POSIX shared-memory object (a file under ``/dev/shm``), registers it by
name with a key, offset and size, and names region + offset in a request. The lookup then
writes the [T, C] rows into the mapped region (one copy: the gather itself, or the
cast-copy from the fp32 scratch), and the response carries only shape, dtype and the byte
range, so the tensor never crosses the transport.

Safety: a key is a plain object name (``/name`` or ``name``: no other slash, no ``..``),
opened under ``/dev/shm`` with ``O_NOFOLLOW`` and never created, so no request can reach a
file outside ``/dev/shm``; every write is bounds-checked against the registered range and
the object's size at registration. Unregistering drops the registry's reference only: a
request in flight holds its own reference to the mapping (the tensor view keeps the
``mmap`` alive), so its rows land in memory that is still mapped and nothing is
corrupted; the mapping is released when its last user is done.
"""

from __future__ import annotations

import mmap
import os
import threading
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from service.engine.batcher import Timing
from service.errors import AlreadyExists, InvalidArgument, NotFound, quote

__all__ = ["SHM_ROOT", "Region", "SharedMemoryRegistry", "ShmDestination"]

SHM_ROOT = Path("/dev/shm")


@dataclass(frozen=True)
class Region:
    """A registered region: ``byte_size`` bytes from ``offset`` of object ``key``."""

    name: str
    key: str
    offset: int
    byte_size: int
    mapping: mmap.mmap  # the object's pages [offset, offset + byte_size), mapped shared


class SharedMemoryRegistry:
    """Registered regions by name; safe to use from the event loop and the compute thread."""

    def __init__(self, root: Path = SHM_ROOT) -> None:
        self.root = root
        self._regions: dict[str, Region] = {}
        self._lock = threading.Lock()

    def register(self, name: str, key: str, offset: int, byte_size: int) -> Region:
        """Map ``byte_size`` bytes at ``offset`` of the object ``key`` under this name."""
        if not name:
            raise InvalidArgument("region name is empty")
        path = self._path(key)
        if byte_size <= 0:
            raise InvalidArgument(f"byte_size={byte_size} of region {quote(name)} must be > 0")
        try:
            fd = os.open(path, os.O_RDWR | os.O_NOFOLLOW | os.O_CLOEXEC)
        except FileNotFoundError:
            raise NotFound(f"shared-memory object {quote(key)} does not exist under "
                           f"{self.root}") from None
        except OSError as e:  # a symlink (ELOOP), a directory, no permission
            raise InvalidArgument(f"shared-memory object {quote(key)} cannot be opened: "
                                  f"{e.strerror}") from None
        try:
            size = os.fstat(fd).st_size
            if offset + byte_size > size:
                raise InvalidArgument(
                    f"region {quote(name)}: offset {offset} + byte_size {byte_size} = "
                    f"{offset + byte_size} exceeds the size of {quote(key)} ({size} bytes)")
            # mmap offsets must be page-aligned: map from the page start, view from offset.
            start = offset - offset % mmap.ALLOCATIONGRANULARITY
            mapping = mmap.mmap(fd, offset + byte_size - start, mmap.MAP_SHARED,
                                mmap.PROT_READ | mmap.PROT_WRITE, offset=start)
        finally:
            os.close(fd)
        region = Region(name, key, offset, byte_size, mapping)
        with self._lock:
            if name in self._regions:
                raise AlreadyExists(f"region {quote(name)} is already registered; unregister it "
                                    f"first")
            self._regions[name] = region
        return region

    def unregister(self, name: str) -> None:
        """Forget one region ("" = every region); requests in flight keep their mapping."""
        with self._lock:
            if not name:
                self._regions.clear()
            elif self._regions.pop(name, None) is None:
                raise NotFound(f"region {quote(name)} is not registered")

    def regions(self, name: str = "") -> list[Region]:
        """Every registered region, or the one named."""
        with self._lock:
            if not name:
                return [self._regions[n] for n in sorted(self._regions)]
            region = self._regions.get(name)
        if region is None:
            raise NotFound(f"region {quote(name)} is not registered")
        return [region]

    def rows(self, name: str, offset: int, shape: tuple[int, ...], dtype: torch.dtype,
             field: str) -> torch.Tensor:
        """A writable view of ``shape`` rows at ``offset`` inside region ``name``."""
        if not name:  # "" lists every region elsewhere; here it names none
            raise InvalidArgument(f"{field}.region is empty: name a registered region")
        (region,) = self.regions(name)
        nbytes = dtype.itemsize
        for n in shape:
            nbytes *= n
        if offset + nbytes > region.byte_size:
            raise InvalidArgument(
                f"{field}: the output needs {nbytes} bytes at offset {offset} but region "
                f"{quote(name)} has {region.byte_size} bytes; the largest T that fits is "
                f"{max(0, region.byte_size - offset) // (nbytes // max(1, shape[-2]))}"
                if len(shape) >= 2 else f"{field}: region {quote(name)} is too small")
        start = region.offset % mmap.ALLOCATIONGRANULARITY + offset  # inside the mapping
        if nbytes == 0:
            return torch.empty(shape, dtype=dtype)
        # frombuffer holds a reference to the mmap: it stays mapped while the view lives.
        flat = torch.frombuffer(region.mapping, dtype=torch.uint8, count=nbytes, offset=start)
        return flat.view(dtype).view(shape)

    def _path(self, key: str) -> Path:
        name = key[1:] if key.startswith("/") else key
        if not name or "/" in name or "\x00" in name or name in (".", ".."):
            raise InvalidArgument(f"shared-memory key {quote(key)} must name an object directly "
                                  f"under {self.root} (like '/my-region'): no other '/'")
        return self.root / name


class ShmDestination:
    """A job's rows in a region; ``finish`` builds the (small) response message."""

    __slots__ = ("_encode", "rows")

    def __init__(self, rows: torch.Tensor, encode: Callable[[Timing], Any]) -> None:
        self.rows = rows  # (N, C) view of the region
        self._encode = encode

    def finish(self, timing: Timing) -> Any:
        """The response, with the timing; the rows are already in the region."""
        del self.rows  # release the mapping as soon as the rows are written
        return self._encode(timing)

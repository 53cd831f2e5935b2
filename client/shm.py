"""Client side of shared-memory output: a /dev/shm region the server writes rows into.

    with SharedMemoryRegion("embed-0", 64 << 20) as region, EmbeddingClient() as client:
        client.register_shared_memory(region)
        e = client.embed("hello world", shm=region)   # e.array is a view of the region
        ...
        client.unregister_shared_memory(region.name)

The region is a POSIX shared-memory object (a file in /dev/shm) created here and mapped
with MAP_SHARED; the server maps the same pages when it is registered, so the rows it
writes are visible here without a copy. The server must share this /dev/shm (same host,
or a pod's containers sharing an ``emptyDir: {medium: Memory}`` at /dev/shm). An array
returned from a region is valid until the region is reused or closed: copy it to keep it.
"""

from __future__ import annotations

import mmap
import os
import secrets
from pathlib import Path
from types import TracebackType

import grpc
import numpy as np

from client.codec import EmbeddingError, tensor_view
from genproto.embedding.v1 import embedding_pb2 as pb

__all__ = ["SHM_ROOT", "SharedMemoryRegion", "rows_from_region"]

SHM_ROOT = Path("/dev/shm")


class SharedMemoryRegion:
    """A new shared-memory object of ``byte_size`` bytes, mapped read/write; ``close``
    unmaps and unlinks it."""

    def __init__(self, name: str, byte_size: int, key: str | None = None) -> None:
        self.name = name
        self.byte_size = byte_size
        # A random key: two clients (or two tests) never collide on one object.
        self.key = key or f"/embed-{name}-{secrets.token_hex(4)}"
        self.path = SHM_ROOT / self.key.lstrip("/")
        fd = os.open(self.path, os.O_CREAT | os.O_EXCL | os.O_RDWR | os.O_CLOEXEC, 0o600)
        try:
            os.ftruncate(fd, byte_size)
            self.mapping = mmap.mmap(fd, byte_size, mmap.MAP_SHARED,
                                     mmap.PROT_READ | mmap.PROT_WRITE)
        except BaseException:
            os.unlink(self.path)
            raise
        finally:
            os.close(fd)

    def region_message(self, offset: int = 0) -> pb.SharedMemoryRegion:
        """The RegisterSharedMemory body for this region (all of it, from ``offset``)."""
        return pb.SharedMemoryRegion(name=self.name, key=self.key, offset=offset,
                                     byte_size=self.byte_size - offset)

    def close(self) -> None:
        """Unmap and unlink (arrays still viewing it must be gone: numpy holds exports)."""
        try:
            self.mapping.close()
        finally:
            self.path.unlink(missing_ok=True)

    def __enter__(self) -> SharedMemoryRegion:
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.close()


def rows_from_region(region: SharedMemoryRegion, tensor: pb.Tensor,
                     placed: pb.SharedMemoryRange, raw_bfloat16: bool = False) -> np.ndarray:
    """The response's rows as a read-only view of the region (bf16 widened: a copy)."""
    if placed.region != region.name or placed.offset + placed.byte_size > region.byte_size:
        raise EmbeddingError(grpc.StatusCode.INTERNAL,
                             f"server placed {placed.byte_size} bytes at {placed.offset} of "
                             f"{placed.region!r}; this region is {region.name!r} "
                             f"({region.byte_size} bytes)")
    shape = tuple(int(d) for d in tensor.shape)
    return tensor_view(region.mapping, tensor.dtype, shape, placed.byte_size, raw_bfloat16,
                       offset=placed.offset)  # (T, C) view of the region, no copy

"""Where a request's rows go when its output is a registered shared-memory region.

Either stored straight into the region's mapping by the guarded one-pass lookup
(``ShmPlan.lookup``: each byte written once), or, without the kernel (and for padded OIP
outputs), written into a reused private buffer and copied in with ``pwrite``
(``ShmPlan.write``). The batcher sees a ``ShmDestination``.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

import numpy as np
import torch

from service.engine import kernel
from service.engine.batcher import Timing
from service.engine.shm_region import Region, short
from service.engine.tables import EmbeddingTables, Span
from service.errors import FailedPrecondition

__all__ = ["ShmDestination", "ShmPlan"]


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

    def lookup(self, tables: EmbeddingTables, ids: np.ndarray, spans: list[Span],
               compose: int) -> bool:
        """Store the rows straight into the region's mapping, in one guarded pass; False
        (nothing done) where that path is not open: no mapping, no guarded kernel."""
        if self.region.mapped is None or not tables.writes_guarded or not self.byte_size:
            return False
        self.region.check(self._at, self.byte_size)
        try:
            tables.write_at(ids, spans, compose, self.region.mapped + self._at,
                            self.byte_size, self.dtype, guarded=True)
        except kernel.BusError:
            self.region.check(self._at, self.byte_size)  # names the size it shrank to
            raise FailedPrecondition(
                f"shared-memory object {short(self.region.key)} of region "
                f"{short(self.region.name)} shrank while its rows were written; "
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

    def lookup(self, tables: EmbeddingTables, ids: np.ndarray, spans: list[Span],
               compose: int) -> bool:
        """The rows straight into the region, if that path is open (``ShmPlan.lookup``)."""
        return self._plan.lookup(tables, ids, spans, compose)

    def finish(self, timing: Timing) -> Any:
        """Write the rows into the region, then the response with the timing."""
        self._plan.write()
        return self._encode(timing)

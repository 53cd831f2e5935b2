"""Where a request's rows go when its output is a registered CUDA region, and the device
write that puts them there.

The batcher sees a ``CudaDestination``: it writes its own rows (``lookup``) by the device,
into the region's memory: the ids (and positions) go to the tables' device once, then
gather, the family's rule and the cast run there and store into the region; the answer is
built after a synchronisation, so the rows are in place when the client reads it. Nothing
of the rows passes through host memory.

The ops are those of the host-output path on the same tables (``EmbeddingTables.device_rows``
for plain lookups, ``EmbeddingTables.embed_into``'s rule path for families with computing
rules), in the same order and dtypes, so the bytes are the same bit for bit; a plain
lookup whose answer is in the table's dtype (or an fp32 sum) is gathered straight into the
region instead of into a temporary first. Device-agnostic like ``device_rows``: the CPU
tests run this exact code on CPU tables and a CPU buffer.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import torch

from service.engine.batcher import Timing
from service.engine.tables import (
    COMPOSE_POSITION_ONLY,
    COMPOSE_TOKEN_ONLY,
    EmbeddingTables,
    Span,
    positions_of,
)

__all__ = ["CudaDestination", "CudaPlan", "write_rows"]


class _IndexRows:
    """A reused (2, N) int64 host buffer, pinned where the tables are on a GPU (pinning one
    per request costs more than its gather); copied to the device synchronously, so the
    next request may refill it at once."""

    def __init__(self) -> None:
        self._buffer: torch.Tensor | None = None
        self._lock = threading.Lock()

    def to(self, device: torch.device, ids: np.ndarray, spans: Sequence[Span]
           ) -> torch.Tensor:
        """(2, N): ids and positions, on ``device``."""
        n = ids.shape[0]
        if device.type == "cpu":
            return torch.from_numpy(np.stack((ids, positions_of(spans))))  # (2, N)
        with self._lock:
            buf = self._buffer
            if buf is None or buf.numel() < 2 * n:
                buf = self._buffer = torch.empty(2 * max(n, 1024), dtype=torch.int64,
                                                 pin_memory=True)
            host = buf[: 2 * n].view(2, n)
            host[0].copy_(torch.from_numpy(ids))
            host[1].copy_(torch.from_numpy(positions_of(spans)))
            return host.to(device)  # (2, N): one H2D copy, complete on return


_INDEX = _IndexRows()


def write_rows(tables: EmbeddingTables, ids: np.ndarray, spans: Sequence[Span],
               compose: int, out: torch.Tensor) -> None:
    """Rows for ``ids`` at the spans' positions, per ``compose``, cast into ``out`` (N, C)
    by the tables' device (``out`` may be on another GPU: then one peer copy)."""
    if tables.rules.computes:  # the family's rules, on the device, cast into out
        tables.embed_into([(ids, list(spans), out)], compose)
        return
    device = tables.token_table.device  # with its index: tables.device may be "cuda"
    idx = _INDEX.to(device, ids, spans)  # (2, N)
    if out.device != device:
        out.copy_(tables.device_rows(idx, compose, out.dtype))
        return
    token, position = tables.token_table, tables.position_table
    if compose == COMPOSE_POSITION_ONLY:
        assert position is not None
        _gather(position, idx[1], out)
    elif compose == COMPOSE_TOKEN_ONLY or position is None:
        _gather(token, idx[0], out)
    elif token.dtype == out.dtype:  # device_rows: x = token rows; x += position rows
        torch.index_select(token, 0, idx[0], out=out)  # (N, C)
        out += torch.index_select(position, 0, idx[1])  # (N, C), rounded once
    else:  # device_rows: the sum in fp32, then one cast
        x = torch.index_select(token, 0, idx[0]).float()  # (N, C)
        x += torch.index_select(position, 0, idx[1])
        out.copy_(x)


def _gather(table: torch.Tensor, index: torch.Tensor, out: torch.Tensor) -> None:
    if table.dtype == out.dtype:
        torch.index_select(table, 0, index, out=out)  # (N, C), stored once
    else:
        out.copy_(torch.index_select(table, 0, index))  # (N, C), cast as it is stored


class CudaPlan:
    """A request's rows in a CUDA region: ``shape`` of ``dtype`` at ``offset`` bytes into
    ``data`` (the region's bytes on its device). Holds ``region`` (and so its mapping) until
    the request is done."""

    __slots__ = ("byte_size", "data", "dtype", "offset", "region", "shape")

    def __init__(self, data: torch.Tensor, offset: int, shape: tuple[int, ...],
                 dtype: torch.dtype, region: object = None) -> None:
        self.data, self.offset, self.shape, self.dtype = data, offset, shape, dtype
        self.region = region
        nbytes = dtype.itemsize
        for n in shape:
            nbytes *= n
        self.byte_size = nbytes

    @property
    def rows(self) -> torch.Tensor:
        """The output's place in the region, shaped ``shape``: a view of device memory."""
        return self.data[self.offset: self.offset + self.byte_size].view(self.dtype) \
            .view(self.shape)

    def destination(self, encode: Callable[[Timing], Any],
                    lengths: Sequence[int] | None = None) -> CudaDestination:
        """The batcher destination. ``lengths`` (OIP's padded [B, T, C]): sequence b's rows
        go to ``[b, :lengths[b]]`` and the rest of its T rows are zeroed; else packed."""
        return CudaDestination(self, encode, lengths)


class CudaDestination:
    """A job's rows for a CUDA region, written by ``lookup`` (always: the batcher never
    hands it host rows); ``finish`` builds the (small) response message."""

    __slots__ = ("_encode", "_lengths", "_plan", "dtype")

    def __init__(self, plan: CudaPlan, encode: Callable[[Timing], Any],
                 lengths: Sequence[int] | None) -> None:
        self._plan = plan
        self.dtype = plan.dtype
        self._encode = encode
        self._lengths = None if lengths is None or len(set(lengths)) <= 1 else list(lengths)

    @property
    def rows(self) -> torch.Tensor:
        """The region's rows, flattened (N, C)."""
        return self._plan.rows.view(-1, self._plan.shape[-1])

    def lookup(self, tables: EmbeddingTables, ids: np.ndarray, spans: list[Span],
               compose: int) -> bool:
        """Every row into the region by the device, then one synchronisation."""
        out = self._plan.rows
        if self._lengths is None:
            write_rows(tables, ids, spans, compose, out.view(-1, out.shape[-1]))  # (N, C)
        else:  # (B, T, C): packed on the device, then each sequence to its slot
            packed = torch.empty(int(ids.shape[0]), out.shape[-1], dtype=out.dtype,
                                 device=out.device)  # (N, C)
            write_rows(tables, ids, spans, compose, packed)
            row = 0
            for b, n in enumerate(self._lengths):
                out[b, :n].copy_(packed[row: row + n])  # (n, C)
                out[b, n:].zero_()  # (T - n, C) padding
                row += n
        for device in {out.device, tables.token_table.device}:
            if device.type == "cuda":
                torch.cuda.synchronize(device)
        return True

    def finish(self, timing: Timing) -> Any:
        """The response: the rows are already in the region."""
        return self._encode(timing)

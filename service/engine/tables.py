"""Frozen embedding tables on a device, and the gather+add that writes a batch's rows.

x = token_table[ids] + position_table[positions]  # (N, C), added in fp32

On CPU with float32 storage the tables are the checkpoint's buffer as read and hashed at
load (private memory, ``checkpoint.read_private``): no further copy, and nothing the disk
does afterwards can reach them; each worker holds its own. On CUDA the tables live on the
device and each batch costs one host→device copy of ids+positions (pinned), one gather,
one add, one cast, one device→host copy (pinned) and one synchronisation.

Rows are written into the caller's output tensors, which are the response bytes
(``message.MessageBuffer``). On CPU with fp32 tables, ``lookup.c`` (``kernel``) writes each row in
one pass: read from the tables once, summed in fp32, rounded into the wire dtype and
stored into the response once, whatever that dtype (torch has no fused gather+add+cast:
its path writes an fp32 intermediate, adds over it, then casts it in a third pass). Without
the built kernel, and for bf16-stored tables, torch's path serves: an fp32 response is
gathered into directly, and so is a token lookup whose output dtype is the table's (a
bf16 Llama table served in bf16: no widening).
A family with computing rules (Gemma's scale, OPT's project_in, BERT/BLOOM LayerNorm)
takes the slow path in ``service.engine.rules`` instead; the rest never pays for it.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np
import torch

from service.engine import kernel
from service.engine.rules import RuleTables
from service.format.rules import Rules

__all__ = ["COMPOSE_POSITION_ONLY", "COMPOSE_TOKEN_ONLY", "COMPOSE_TOKEN_PLUS_POSITION",
           "SHARED_GATHER_ROWS", "EmbeddingTables", "Part", "Span", "positions_of",
           "resolve_device"]


Span = tuple[int, int]  # (start_position, T): one sequence's rows, consecutive in a batch
# One request's share of a batch: ids (N,), its spans, and where its (N, C) rows go. Ids
# are host numpy arrays up to here; torch's paths wrap them (``torch.from_numpy``, no copy).
Part = tuple[np.ndarray, list[Span], torch.Tensor]
_TorchPart = tuple[torch.Tensor, list[Span], torch.Tensor]
# Parts of a batch share one gather while they total at most this many rows (3 MB of fp32
# scratch at C=768: cache-resident until copied out); larger batches gather per part.
SHARED_GATHER_ROWS = 1024
# Below this many rows per sequence a single gather of all positions beats a slice-add per
# sequence (each slice-add is a separate torch call, ~5 µs of Python and dispatch).
_MIN_ROWS_PER_SLICE = 32

# Mirrors embedding.v1.Compose (kept here so the tables need no generated code).
COMPOSE_TOKEN_PLUS_POSITION = 0
COMPOSE_TOKEN_ONLY = 1
COMPOSE_POSITION_ONLY = 2


def resolve_device(spec: str) -> torch.device:
    """``auto`` → cuda when torch sees a GPU, else cpu; otherwise torch's own parsing."""
    if spec == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    device = torch.device(spec)
    if device.type == "cuda" and not torch.cuda.is_available():
        raise ValueError(f"--device {spec}: torch sees no CUDA device")
    return device


def positions_of(spans: Sequence[Span]) -> np.ndarray:
    """Concatenated ``start .. start+T-1`` ranges of the spans, as one int64 array (N,)."""
    starts = np.fromiter((s for s, _ in spans), dtype=np.int64, count=len(spans))
    lengths = np.fromiter((t for _, t in spans), dtype=np.int64, count=len(spans))
    first_row = np.cumsum(lengths) - lengths  # row offset of each span
    n = int(lengths.sum())
    return np.repeat(starts - first_row, lengths) + np.arange(n)


def _max_abs(table: torch.Tensor) -> float:
    """max |x| over the table, without a temporary the size of it; NaN counts as inf."""
    if table.numel() == 0:
        return 0.0
    lo, hi = torch.aminmax(table)
    value = max(abs(float(lo)), abs(float(hi)))
    return math.inf if math.isnan(value) else value


class EmbeddingTables:
    """One model version's token and position tables, frozen, on one device."""

    def __init__(self, token_table: torch.Tensor, position_table: torch.Tensor | None,
                 device: torch.device, table_dtype: torch.dtype | None = torch.float32,
                 rules: Rules | None = None,
                 rule_tensors: dict[str, torch.Tensor] | None = None,
                 token_max_abs: float | None = None) -> None:
        """``table_dtype`` None keeps the stored dtype; ``token_max_abs``: the stored
        table's largest |value| when the loader already read it."""
        self.device = device
        self.device_type = device.type  # "cpu", "cuda": a str, read per batch for metrics
        dtype = table_dtype or token_table.dtype
        self.dim = int(token_table.shape[1])  # width of the token rows
        # The loaded buffer already is the table: .to() is a no-op for same device and dtype.
        self.token_table = token_table.to(device=device, dtype=dtype)  # (rows, dim)
        self.position_table = (None if position_table is None
                               else position_table.to(device=device, dtype=dtype))  # (P, C)
        self.rules = rules or Rules()
        self._rules = (RuleTables(self.rules, rule_tensors or {}, device, dtype)
                       if self.rules.computes else None)
        # Width of the default compose: what the first block reads (OPT project_in: C != dim)
        project = None if self._rules is None else (
            self._rules.project_in if self._rules.project_in is not None
            else self._rules.project_hidden)
        self.width = self.dim if project is None else int(project.shape[0])
        self._scratch: dict[torch.dtype, torch.Tensor] = {}
        self._bounds: dict[int, float] = {}  # compose -> max_abs, computed on first use
        # The one-pass lookup (``lookup.c``) serves fp32 tables on CPU whenever it is
        # built; otherwise (and for bf16/fp16-stored tables) torch's gather, add and cast.
        self._kernel = (kernel.load() if device.type == "cpu" and self._rules is None
                        and self.token_table.dtype == torch.float32
                        and self.token_table.is_contiguous()
                        and (self.position_table is None
                             or (self.position_table.dtype == torch.float32
                                 and self.position_table.is_contiguous())) else None)
        # The kernel's view of the tables for each compose (checked once, then addresses):
        # token rows plus position rows, token rows alone, position rows alone.
        self._kernel_rows: dict[int, kernel.KernelTables] = {}
        if self._kernel is not None:
            token = kernel.KernelTables(self._kernel, self.token_table, None)
            self._kernel_rows = {COMPOSE_TOKEN_ONLY: token, COMPOSE_TOKEN_PLUS_POSITION: token}
            if self.position_table is not None:
                self._kernel_rows[COMPOSE_TOKEN_PLUS_POSITION] = kernel.KernelTables(
                    self._kernel, self.token_table, self.position_table)
                self._kernel_rows[COMPOSE_POSITION_ONLY] = kernel.KernelTables(
                    self._kernel, self.position_table, None)
        # Largest |value| of each table, read once at load: what a request's output dtype
        # must be able to hold (validation.check_dtype_range refuses float16 past 65504).
        self.token_max_abs = (token_max_abs if token_max_abs is not None
                              and self.token_table.dtype == token_table.dtype
                              else _max_abs(self.token_table))
        self.position_max_abs = (0.0 if self.position_table is None
                                 else _max_abs(self.position_table))

    def max_abs(self, compose: int) -> float:
        """An upper bound on |value| of any row ``compose`` returns, from the tables'
        largest values and each computing rule's own bound (scale: times it; project_in:
        times W's largest row L1 norm; token_type: plus its largest value; LayerNorm:
        sqrt(C-1) * max|weight| + max|bias|, whatever its input). Computed once per
        compose: the tables are frozen."""
        bound = self._bounds.get(compose)
        if bound is None:
            bound = self._bounds[compose] = self._bound(compose)
        return bound

    def _bound(self, compose: int) -> float:
        if compose == COMPOSE_POSITION_ONLY:
            return self.position_max_abs
        r = self._rules
        x = self.token_max_abs
        if r is not None and r.scale is not None:
            x *= abs(float(r.scale))
        if compose == COMPOSE_TOKEN_ONLY:
            return x
        if r is not None and r.project_in is not None:  # (C, dim)
            x *= float(r.project_in.float().abs().sum(dim=1).max())
        if r is not None and r.token_type is not None:
            x += _max_abs(r.token_type)
        x += self.position_max_abs
        if r is not None and r.ln_weight is not None and r.ln_bias is not None:
            C = int(r.ln_weight.shape[0])
            x = math.sqrt(max(C - 1, 1)) * _max_abs(r.ln_weight) + _max_abs(r.ln_bias)
        if r is not None and r.project_hidden is not None:  # (H, C), then + bias
            x *= float(r.project_hidden.float().abs().sum(dim=1).max())
            x += 0.0 if r.project_hidden_bias is None else _max_abs(r.project_hidden_bias)
        return x

    def out_dim(self, compose: int) -> int:
        """Columns of the rows ``compose`` returns: token-only has the table's width, and
        so have position-only rows added before ``project_hidden``."""
        if compose == COMPOSE_TOKEN_ONLY or (compose == COMPOSE_POSITION_ONLY
                                             and self.rules.position_width_is_dim):
            return self.dim
        return self.width

    def _scratch_rows(self, n: int, dtype: torch.dtype = torch.float32) -> torch.Tensor:
        # Reused host buffer: its rows are copied out before the next batch runs, and a
        # buffer that stays allocated is never handed back to the OS and faulted in again.
        buf = self._scratch.get(dtype)
        if buf is None or buf.numel() < n * self.dim:
            pin = self.device.type == "cuda"
            buf = torch.empty(max(n, 64) * self.dim, dtype=dtype, pin_memory=pin)
            self._scratch[dtype] = buf
        return buf[: n * self.dim].view(n, self.dim)

    def _add_positions(self, x: torch.Tensor, spans: Sequence[Span]) -> None:
        """x += position rows, in place: slices where sequences are long, else one gather."""
        assert self.position_table is not None
        if len(spans) == 1 or len(spans) * _MIN_ROWS_PER_SLICE <= x.shape[0]:
            row = 0
            for start, T in spans:  # contiguous positions: no gather, no temporary
                x[row: row + T] += self.position_table[start: start + T]  # (T, C)
                row += T
        else:
            positions = torch.from_numpy(positions_of(spans))  # (N,)
            x += torch.index_select(self.position_table, 0, positions)  # (N, C)

    @staticmethod
    def _gather(table: torch.Tensor, index: torch.Tensor, x: torch.Tensor) -> None:
        if table.dtype == x.dtype:
            torch.index_select(table, 0, index, out=x)  # written in place
        else:
            x.copy_(torch.index_select(table, 0, index))  # widened to fp32

    def _sum(self, ids: torch.Tensor, spans: Sequence[Span], compose: int,
             x: torch.Tensor) -> None:
        """x = token rows + position rows (per ``compose``), in x's dtype (fp32)."""
        if compose == COMPOSE_POSITION_ONLY:
            assert self.position_table is not None
            self._gather(self.position_table, torch.from_numpy(positions_of(spans)), x)
            return
        self._gather(self.token_table, ids, x)
        if compose != COMPOSE_TOKEN_ONLY and self.position_table is not None:
            self._add_positions(x, spans)  # fp32 add

    def embed_into(self, parts: Sequence[Part], compose: int) -> None:
        """Write each part's rows, cast to its ``out`` dtype, into ``out`` (N_i, C).

        ``parts`` hold validated int64 host ids, their spans, and an output tensor (the
        response bytes, see ``message``) all of one dtype. On CUDA the whole batch is one
        gather+add on the device. On CPU, fp32 outputs are gathered straight into the
        response and the positions added in place; other dtypes go through a reused fp32
        scratch (the add is always fp32) and one cast-copy. Many small parts share one
        gather: below ``SHARED_GATHER_ROWS`` rows in all, one call beats a call per part,
        and the scratch stays in cache until it is copied out. Rows are elementwise sums,
        so every path gives the same bits.
        """
        # The kernel first: it is loaded only for fp32 tables on CPU without rules, where
        # none of the next three paths applies (and the common case skips their checks).
        if self._kernel is not None and all(p[2].is_contiguous() for p in parts):
            for ids, spans, out in parts:
                self._embed_kernel(ids, spans, compose, out)
            return
        self._embed_torch([(torch.from_numpy(ids), spans, out) for ids, spans, out in parts],
                          compose)

    def _embed_torch(self, parts: Sequence[_TorchPart], compose: int) -> None:
        """``embed_into`` where the kernel does not serve: torch's ops, ids as tensors."""
        if self._rules is not None:
            self._embed_rules(parts, compose)
            return
        if self.device.type != "cpu":
            self._embed_device(parts, compose)
            return
        if ((compose == COMPOSE_TOKEN_ONLY or self.position_table is None)
                and compose != COMPOSE_POSITION_ONLY
                and self.token_table.dtype != torch.float32  # fp32: the paths below
                and all(p[2].dtype == self.token_table.dtype for p in parts)):
            for ids, _, out in parts:  # rows already in the wire dtype: gather straight in
                torch.index_select(self.token_table, 0, ids, out=out)  # (N, dim)
            return
        if len(parts) > 1 and (n := sum(int(p[0].shape[0]) for p in parts)) <= SHARED_GATHER_ROWS:
            ids = torch.cat([p[0] for p in parts])  # (N,)
            x = self._scratch_rows(n)  # (N, C) fp32
            self._sum(ids, [span for p in parts for span in p[1]], compose, x)
            row = 0
            for _, _, out in parts:
                out.copy_(x[row: row + out.shape[0]])  # cast to the wire dtype
                row += out.shape[0]
            return
        for ids, spans, out in parts:
            if out.dtype == torch.float32:
                self._sum(ids, spans, compose, out)  # written once, in the response
            else:
                x = self._scratch_rows(int(ids.shape[0]))  # (T, C) fp32
                self._sum(ids, spans, compose, x)
                out.copy_(x)  # the cast and the write into the response: one pass

    @property
    def writes_guarded(self) -> bool:
        """Whether ``write_at(..., guarded=True)`` can write into memory its owner may
        shrink (a mapping of a client's shared-memory object): ``kernel.BusError`` then if
        the object shrank under the write, the rows partly written."""
        return self._kernel is not None and kernel.guarded()

    def _embed_kernel(self, ids: np.ndarray, spans: Sequence[Span], compose: int,
                      out: torch.Tensor) -> None:
        """One part in one pass (``lookup.c``): each row read once from the tables and
        written once into ``out`` (N, C), summed in fp32 and rounded into out's dtype."""
        if not (out.is_contiguous() and out.shape == (ids.shape[0], self.out_dim(compose))
                and out.dtype in kernel.OUT_KINDS):
            raise ValueError("lookup kernel: an output of the wrong layout, dtype or shape")
        self.write_at(ids, spans, compose, out.data_ptr(), out.numel() * out.element_size(),
                      out.dtype)

    def write_at(self, ids: np.ndarray, spans: Sequence[Span], compose: int, address: int,
                 nbytes: int, dtype: torch.dtype, guarded: bool = False) -> bool:
        """One part's rows in one pass (``lookup.c``) straight into the ``nbytes`` of
        writable memory at ``address`` (an answer's bytes), in ``dtype``: no tensor over
        that memory is built. False where the kernel does not serve these tables (the
        caller then hands ``embed_into`` its rows)."""
        if self._kernel is None:
            return False
        rows = self._kernel_rows.get(compose)
        assert rows is not None, "COMPOSE_POSITION_ONLY without a position table"
        kind = kernel.OUT_KINDS[dtype]
        if compose == COMPOSE_POSITION_ONLY:
            rows.write(positions_of(spans), None, 0, address, nbytes, kind, guarded)
        elif rows.position is None:
            rows.write(ids, None, 0, address, nbytes, kind, guarded)
        elif len(spans) == 1:  # its positions are start, start+1, ...: none to build
            rows.write(ids, None, spans[0][0], address, nbytes, kind, guarded)
        else:
            rows.write(ids, positions_of(spans), 0, address, nbytes, kind, guarded)
        return True

    def _embed_device(self, parts: Sequence[_TorchPart], compose: int) -> None:
        """The whole batch as one gather+add on the tables' device, then one copy back.

        Written for CUDA (pinned buffers, one synchronisation) but device-agnostic, so the
        tests run this exact path on CPU tables as well. An answer in the tables' own dtype
        is added in that dtype: torch adds bf16/fp16 in fp32 and rounds once, the same bits
        as widening first, without two fp32 intermediates.
        """
        cuda = self.device.type == "cuda"
        n = sum(int(p[0].shape[0]) for p in parts)
        idx = self._index_rows(n)  # (2, N): ids, positions; one H2D copy
        torch.cat([p[0] for p in parts], out=idx[0])
        idx[1].copy_(torch.from_numpy(positions_of([span for p in parts for span in p[1]])))
        dtype = parts[0][2].dtype
        x = self.device_rows(idx.to(self.device, non_blocking=True), compose, dtype)
        host = self._scratch_rows(n, dtype)  # (N, C), pinned on CUDA
        host.copy_(x, non_blocking=True)  # one D2H copy into pinned memory
        if cuda:
            torch.cuda.synchronize(self.device)  # the one sync per batch
        row = 0
        for _, _, out in parts:
            out.copy_(host[row: row + out.shape[0]])  # into the response bytes
            row += out.shape[0]

    def device_rows(self, idx: torch.Tensor, compose: int, dtype: torch.dtype) -> torch.Tensor:
        """The rows for ``idx`` ((2, N) ids and positions on the tables' device), in
        ``dtype``, on that device: the add in fp32 unless the answer is in table dtype."""
        if compose == COMPOSE_POSITION_ONLY:
            assert self.position_table is not None
            return self.position_table[idx[1]].to(dtype)  # (N, C)
        x = self.token_table[idx[0]]  # (N, C)
        if compose == COMPOSE_TOKEN_PLUS_POSITION and self.position_table is not None:
            if x.dtype != dtype:
                x = x.float()  # (N, C)
            x += self.position_table[idx[1]]  # (N, C), rounded once
        return x.to(dtype)  # (N, C)

    def _index_rows(self, n: int) -> torch.Tensor:
        """A reused (2, n) int64 host buffer, pinned on CUDA: pinning one per batch costs
        more than the batch's gather. Safe to reuse: each batch ends in a synchronize."""
        buf = self._scratch.get(torch.int64)
        if buf is None or buf.numel() < 2 * n:
            buf = torch.empty(2 * max(n, 1024), dtype=torch.int64,
                              pin_memory=self.device.type == "cuda")
            self._scratch[torch.int64] = buf
        return buf[: 2 * n].view(2, n)

    def _embed_rules(self, parts: Sequence[_TorchPart], compose: int) -> None:
        """A family with computing rules: each part's rows in the table dtype, with the
        reference's ops (``service.engine.rules``), then cast into ``out``."""
        assert self._rules is not None
        for ids, spans, out in parts:
            positions = torch.from_numpy(positions_of(spans)).to(self.device)  # (N,)
            x = self._rules.compose(self.token_table, self.position_table,
                                    ids.to(self.device), positions, spans, compose)  # (N, *)
            out.copy_(x)  # cast to the wire dtype (and device -> host)

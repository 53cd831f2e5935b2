"""The one-pass lookup kernel (service/engine/lookup.c) gives torch's bits on every path."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from service.engine import kernel
from service.engine.tables import (
    COMPOSE_POSITION_ONLY,
    COMPOSE_TOKEN_ONLY,
    COMPOSE_TOKEN_PLUS_POSITION,
    EmbeddingTables,
    positions_of,
)

V, C, P = 1000, 96, 64
DTYPES = (torch.float32, torch.bfloat16, torch.float16)


@pytest.fixture(scope="module")
def tables() -> tuple[EmbeddingTables, EmbeddingTables]:
    """The same tables twice: with the kernel, and on torch's path."""
    g = torch.Generator().manual_seed(7)
    token = torch.randn(V, C, generator=g) * 40  # past bf16/fp16 steps: rounding matters
    token[3, :8] = torch.tensor([65504.0, -65519.0, 2.0**-24, 2.0**-25, 1e-8, 6.1e-5,
                                 -3e-7, 1.5 * 2.0**-24])  # fp16 edges: max, subnormals
    position = torch.randn(P, C, generator=g)
    fast = EmbeddingTables(token, position, torch.device("cpu"))
    slow = EmbeddingTables(token, position, torch.device("cpu"))
    slow._kernel = None
    assert fast._kernel is not None, "the kernel must build here (gcc is on this machine)"
    return fast, slow


def embed_rows(lib: object, table: torch.Tensor, ids: torch.Tensor,
               position_table: torch.Tensor | None, positions: torch.Tensor | None,
               start: int, out: torch.Tensor, guarded: bool = False) -> None:
    """out (N, C) = table[ids] (+ position rows at ``positions``, or from ``start``): the
    kernel on tensors (ids and positions handed over as numpy, as the engine holds them),
    ``out``'s layout checked as the tables check theirs."""
    assert out.is_contiguous()
    assert out.shape == (ids.shape[0], table.shape[1])
    kernel.KernelTables(lib, table, position_table).write(  # type: ignore[arg-type]
        ids.numpy(), None if positions is None else positions.numpy(), start,
        out.data_ptr(), out.numel() * out.element_size(),
        kernel.OUT_KINDS[out.dtype], guarded)


def _bits(x: torch.Tensor) -> torch.Tensor:
    return x.view(torch.int32 if x.dtype == torch.float32 else torch.int16)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("compose", [COMPOSE_TOKEN_PLUS_POSITION, COMPOSE_TOKEN_ONLY,
                                     COMPOSE_POSITION_ONLY])
@pytest.mark.parametrize("spans", [[(0, 1)], [(5, 40)], [(0, 64)], [(3, 40), (0, 33)],
                                   [(i % 7, 2) for i in range(20)]])
def test_kernel_matches_torch_and_reference(tables: tuple[EmbeddingTables, EmbeddingTables],
                                            dtype: torch.dtype, compose: int,
                                            spans: list[tuple[int, int]]) -> None:
    fast, slow = tables
    n = sum(t for _, t in spans)
    g = torch.Generator().manual_seed(n)
    ids = torch.randint(0, V, (n,), generator=g)
    ids[0] = 3
    positions = positions_of(spans)
    token, position = fast.token_table[ids], fast.position_table[positions]  # type: ignore[index]
    reference = {COMPOSE_TOKEN_PLUS_POSITION: token + position, COMPOSE_TOKEN_ONLY: token,
                 COMPOSE_POSITION_ONLY: position}[compose].to(dtype)  # (N, C)
    # Two parts in one call, as a batch hands them over.
    half = spans[: max(1, len(spans) // 2)]
    k = sum(t for _, t in half)
    rest = spans[len(half):]
    outs = {}
    for name, t in (("fast", fast), ("slow", slow)):
        out = torch.full((n, C), 7.0).to(dtype)
        host = ids.numpy()  # the engine's ids: numpy arrays
        parts = [(host[:k], half, out[:k])] + ([(host[k:], rest, out[k:])] if rest else [])
        t.embed_into(parts, compose)
        outs[name] = out
    assert torch.equal(_bits(outs["fast"]), _bits(reference))
    assert torch.equal(_bits(outs["slow"]), _bits(reference))


# bf16's round-to-nearest-even at its ties (0x8000 below the kept bits: even keeps, odd
# rounds up), just off them, at the carry into the exponent and at the largest finite.
_BF16_EDGES = [0x3F808000, 0x3F818000, 0x3F807FFF, 0x3F808001, 0xBF808000, 0xBF818000,
               0x3F7FFFFF, 0x7F7FFFFF, 0x00018000, 0x80008000, 0x00000000, 0x80000000]


@pytest.mark.parametrize("dim", [16, 37, 768])  # whole 16-wide blocks, a tail, GPT-2's C
@pytest.mark.parametrize("dtype", DTYPES)
def test_rounding_edges_and_row_tails_match_torch(dim: int, dtype: torch.dtype) -> None:
    """Every output dtype's rounding, bit for bit against torch's, on rows whose width is
    and is not a multiple of the vector width, with and without positions."""
    lib = kernel.load()
    assert lib is not None
    g = torch.Generator().manual_seed(dim)
    table = torch.randn(8, dim, generator=g) * 40
    edges = torch.tensor(_BF16_EDGES * (dim // len(_BF16_EDGES) + 1), dtype=torch.int64)
    table[2] = edges[:dim].to(torch.int32).view(torch.float32)  # (C,)
    position = torch.randn(4, dim, generator=g)
    position[0] = 0.0  # row 2 + position 0 keeps the edge bits exact through the add
    ids = torch.tensor([2, 5, 2, 7])
    for pos_table, positions in ((None, None), (position, torch.tensor([0, 1, 0, 3]))):
        reference = table[ids] if pos_table is None else table[ids] + position[positions]
        out = torch.empty(4, dim, dtype=dtype)
        embed_rows(lib, table, ids, pos_table, positions, 0, out)
        assert torch.equal(_bits(out), _bits(reference.to(dtype)))


def test_kernel_refuses_an_index_outside_its_table() -> None:
    lib = kernel.load()
    assert lib is not None
    table, position = torch.randn(10, 4), torch.randn(5, 4)
    out = torch.zeros(2, 4)
    with pytest.raises(IndexError):
        embed_rows(lib, table, torch.tensor([1, 10]), None, None, 0, out)
    with pytest.raises(IndexError):
        embed_rows(lib, table, torch.tensor([-1, 0]), None, None, 0, out)
    with pytest.raises(IndexError):  # start + i runs past the position table
        embed_rows(lib, table, torch.tensor([1, 2]), position, None, 4, out)
    assert torch.equal(out, torch.zeros(2, 4))  # nothing written
    embed_rows(lib, table, torch.tensor([1, 2]), position, None, 3, out)
    assert torch.equal(out, table[[1, 2]] + position[3:5])


def test_kernel_refuses_memory_of_another_size_or_ids_of_another_type() -> None:
    """Rows written by address (``KernelTables.write``): the memory given must hold
    exactly n x dim values of the out dtype, and the ids must be int64, or nothing is
    written (the C side trusts both)."""
    lib = kernel.load()
    assert lib is not None
    table = torch.randn(10, 4)
    rows = kernel.KernelTables(lib, table, None)
    out = torch.zeros(3, 4)  # room for 3 rows of fp32
    ids = np.array([1, 2], dtype=np.int64)
    for nbytes, kind in ((3 * 4 * 4, 0), (2 * 4 * 4 - 1, 0), (2 * 4 * 2, 0), (2 * 4 * 4, 1)):
        with pytest.raises(ValueError):  # one row too many, a byte short, half, or bf16
            rows.write(ids, None, 0, out.data_ptr(), nbytes, kind)
    with pytest.raises(ValueError):
        rows.write(ids.astype(np.int32), None, 0, out.data_ptr(), 2 * 4 * 4, 0)
    with pytest.raises(ValueError):  # a torch tensor is not the engine's ids
        rows.write(torch.tensor([1, 2]), None, 0, out.data_ptr(), 2 * 4 * 4, 0)  # type: ignore[arg-type]
    with pytest.raises(ValueError):  # positions of another length
        rows.write(ids, np.array([0, 1, 2], dtype=np.int64), 0, out.data_ptr(), 2 * 4 * 4, 0)
    assert torch.equal(out, torch.zeros(3, 4))
    rows.write(ids, None, 0, out.data_ptr(), 2 * 4 * 4, 0)
    assert torch.equal(out[:2], table[[1, 2]])
    assert torch.equal(out[2], torch.zeros(4))
    with pytest.raises(ValueError):  # tables are checked once, when made
        kernel.KernelTables(lib, table.t(), None)
    with pytest.raises(ValueError):
        kernel.KernelTables(lib, table, torch.randn(5, 3))


def test_guarded_write_into_a_shrunk_object_is_an_error_not_a_crash() -> None:
    """A store past the end of a shrunk shared-memory object (SIGBUS) ends that write with
    BusError, on any thread, and the process goes on; an intact mapping is written."""
    import mmap
    import os
    import threading

    lib = kernel.load()
    assert lib is not None
    assert kernel.guarded()
    table = torch.randn(10, 1024)  # 4 KiB rows: one page each
    path = f"/dev/shm/embed-test-guard-{os.getpid()}"
    fd = os.open(path, os.O_CREAT | os.O_EXCL | os.O_RDWR, 0o600)
    try:
        os.ftruncate(fd, 8 * 4096)
        with mmap.mmap(fd, 8 * 4096) as mapping:
            rows = torch.frombuffer(mapping, dtype=torch.float32).view(8, 1024)
            ids = torch.tensor([1, 2, 3, 4, 5, 6, 7, 8])
            embed_rows(lib, table, ids, None, None, 0, rows, guarded=True)
            assert torch.equal(rows, table[ids])
            os.ftruncate(fd, 4096)  # the owner shrinks it to one page under the mapping
            with pytest.raises(kernel.BusError):
                embed_rows(lib, table, ids, None, None, 0, rows, guarded=True)
            errors: list[BaseException] = []

            def on_a_thread(out: torch.Tensor = rows) -> None:
                try:
                    embed_rows(lib, table, ids, None, None, 0, out, guarded=True)
                except BaseException as e:
                    errors.append(e)

            thread = threading.Thread(target=on_a_thread)
            thread.start()
            thread.join()
            del on_a_thread  # its default holds a view of the mapping
            assert [type(e) for e in errors] == [kernel.BusError]
            embed_rows(lib, table, ids[:1], None, None, 0, rows[:1], guarded=True)
            assert torch.equal(rows[0], table[1])  # the page still there is written
            del rows
    finally:
        os.close(fd)
        os.unlink(path)

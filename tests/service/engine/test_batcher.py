"""The dynamic batcher: coalescing, budgets, dropped work, bit-identical results."""

from __future__ import annotations

import asyncio
import os
import time

import numpy as np
import pytest
import torch

from genproto.embedding.v1 import embedding_pb2 as pb
from service.dtypes import BY_WIRE
from service.engine.batcher import Batcher, Job
from service.engine.message import MessageBuffer, message_head, timing_tag
from service.engine.tables import (
    COMPOSE_POSITION_ONLY,
    COMPOSE_TOKEN_ONLY,
    COMPOSE_TOKEN_PLUS_POSITION,
    SHARED_GATHER_ROWS,
    EmbeddingTables,
    positions_of,
)
from service.errors import DeadlineExceeded, ResourceExhausted
from tests.tiny_model import tiny_tables


@pytest.fixture(scope="module")
def tables() -> EmbeddingTables:
    token_table, position_table = tiny_tables(0)
    return EmbeddingTables(token_table, position_table, torch.device("cpu"))


def job(tables: EmbeddingTables, ids: list[int], seen: list[Job],
        deadline: float | None = None, dtype: int = pb.DTYPE_FLOAT32) -> Job:
    shape = (len(ids), tables.dim)
    fields = pb.EmbedResponse()
    buffer = MessageBuffer(message_head(*shape, dtype), shape, BY_WIRE[dtype].torch,
                           fields.SerializeToString(), timing_tag(fields.DESCRIPTOR))
    j = Job(tables, np.array(ids, dtype=np.int64), [(0, len(ids))],
            COMPOSE_TOKEN_PLUS_POSITION, buffer, time.perf_counter_ns(), 0, deadline)
    seen.append(j)
    return j


def rows_of(data: bytes) -> bytes:
    """The tensor bytes of an encoded EmbedResponse."""
    return pb.EmbedResponse.FromString(data).embeddings.data


def computed(seen: list[Job]) -> list[Job]:
    """The jobs that reached compute (a batch set their batch size)."""
    return [j for j in seen if j.batch_requests]


def run(coro):  # type: ignore[no-untyped-def]
    return asyncio.run(coro)


def test_concurrent_jobs_share_one_batch_and_match_single(tables: EmbeddingTables) -> None:
    async def main() -> tuple[list[bytes], list[Job]]:
        seen: list[Job] = []
        batcher = Batcher(max_batch_tokens=64, max_batch_delay_us=20_000, max_queue_tokens=64)
        batcher.start()
        out = await asyncio.gather(*(batcher.submit(job(tables, [i, i + 1], seen))
                                     for i in range(8)))
        await batcher.close()
        return list(out), computed(seen)

    out, seen = run(main())
    assert [s.batch_requests for s in seen] == [8] * 8
    assert seen[0].batch_tokens == 16
    token_table, position_table = tiny_tables(0)
    for i, data in enumerate(out):
        assert rows_of(data) == (token_table[[i, i + 1]] + position_table[:2]).numpy().tobytes()


def test_token_budget_splits_batches(tables: EmbeddingTables) -> None:
    async def main() -> list[Job]:
        seen: list[Job] = []
        batcher = Batcher(max_batch_tokens=4, max_batch_delay_us=20_000, max_queue_tokens=64)
        batcher.start()
        await asyncio.gather(*(batcher.submit(job(tables, [1, 2, 3], seen)) for _ in range(3)))
        await batcher.close()
        return computed(seen)

    assert [s.batch_tokens for s in run(main())] == [3, 3, 3]


def test_queue_limit(tables: EmbeddingTables) -> None:
    async def main() -> None:
        batcher = Batcher(max_batch_tokens=8, max_batch_delay_us=200_000, max_queue_tokens=8)
        batcher.start()
        first = asyncio.ensure_future(batcher.submit(job(tables, [1] * 6, [])))
        await asyncio.sleep(0)
        with pytest.raises(ResourceExhausted, match="max_queue_tokens=8"):
            await batcher.submit(job(tables, [1] * 6, []))
        await first
        await batcher.close()

    run(main())


def test_expired_and_cancelled_jobs_are_dropped_before_compute(
        tables: EmbeddingTables) -> None:
    async def main() -> list[Job]:
        seen: list[Job] = []
        batcher = Batcher(max_batch_tokens=64, max_batch_delay_us=100_000, max_queue_tokens=64)
        batcher.start()
        expired = asyncio.ensure_future(batcher.submit(
            job(tables, [1], seen, deadline=time.monotonic() + 0.02)))
        cancelled = asyncio.ensure_future(batcher.submit(job(tables, [2], seen)))
        kept = asyncio.ensure_future(batcher.submit(job(tables, [3], seen)))
        await asyncio.sleep(0.01)
        cancelled.cancel()
        with pytest.raises(DeadlineExceeded, match="no work was done"):
            await expired
        await kept
        await batcher.close()
        return computed(seen)

    seen = run(main())
    assert len(seen) == 1
    assert seen[0].batch_requests == 1


def test_deadline_already_passed_is_refused_at_submit(tables: EmbeddingTables) -> None:
    async def main() -> None:
        batcher = Batcher(max_batch_tokens=64, max_batch_delay_us=0, max_queue_tokens=64)
        batcher.start()
        with pytest.raises(DeadlineExceeded):
            await batcher.submit(job(tables, [1], [], deadline=time.monotonic() - 1))
        await batcher.close()

    run(main())


def embed(tables: EmbeddingTables, parts: list[tuple[list[int], list[tuple[int, int]]]],
          dtype: torch.dtype, compose: int = COMPOSE_TOKEN_PLUS_POSITION) -> list[torch.Tensor]:
    """Each part's rows from one ``embed_into`` call, in fresh output tensors."""
    outs = [torch.full((len(ids), tables.dim), float("nan"), dtype=dtype) for ids, _ in parts]
    tables.embed_into([(np.array(ids, dtype=np.int64), spans, out)
                       for (ids, spans), out in zip(parts, outs)], compose)
    return outs


@pytest.mark.parametrize("spans", [
    [(0, 40), (10, 24)],  # long sequences: slice-adds of the position table
    [(3, 2)] * 32,  # many short ones: one gather of all positions
])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
def test_embed_into_equals_reference_and_single_in_both_position_paths(
        tables: EmbeddingTables, spans: list[tuple[int, int]], dtype: torch.dtype) -> None:
    token_table, position_table = tiny_tables(0)
    n = sum(t for _, t in spans)
    ids = list(range(100, 100 + n))
    positions = positions_of(spans)
    second = spans[1][0] if spans[0][1] == 2 else spans[0][0] + 2
    assert positions[:3].tolist() == [spans[0][0], spans[0][0] + 1, second]
    # The sum is fp32, then cast once to the wire dtype.
    expected = (token_table[ids] + position_table[positions]).to(dtype)  # (N, C)
    (packed,) = embed(tables, [(ids, spans)], dtype)  # one part with many spans
    assert torch.equal(packed, expected)
    start, T = spans[-1]
    (alone,) = embed(tables, [(ids[n - T:], [(start, T)])], dtype)
    assert torch.equal(alone, packed[n - T:])


@pytest.mark.parametrize("T", [3, SHARED_GATHER_ROWS // 2 + 1])  # one shared gather, or not
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("compose", [COMPOSE_TOKEN_PLUS_POSITION, COMPOSE_TOKEN_ONLY])
def test_parts_of_a_batch_equal_each_part_alone(T: int, dtype: torch.dtype,
                                                compose: int) -> None:
    tables = EmbeddingTables(*tiny_tables(1, max_seq_len=SHARED_GATHER_ROWS),
                             torch.device("cpu"))
    g = torch.Generator().manual_seed(T)
    rows = tables.token_table.shape[0]
    parts = [(torch.randint(0, rows, (T,), generator=g).tolist(), [(start, T)])
             for start in (0, 5)]
    together = embed(tables, parts, dtype, compose)
    for part, out in zip(parts, together):
        (alone,) = embed(tables, [part], dtype, compose)
        assert torch.equal(out, alone)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
@pytest.mark.parametrize("compose", [COMPOSE_TOKEN_PLUS_POSITION, COMPOSE_TOKEN_ONLY,
                                     COMPOSE_POSITION_ONLY])
def test_device_batch_path_equals_cpu_path(tables: EmbeddingTables, dtype: torch.dtype,
                                           compose: int) -> None:
    # The CUDA path (one gather+add for the whole batch, one copy back, then a copy into
    # each response) is device-agnostic: run it on these CPU tables against the CPU path.
    parts = [([5, 6, 7], [(0, 3)]), (list(range(200, 240)), [(2, 30), (0, 10)]), ([9], [(63, 1)])]
    want = embed(tables, parts, dtype, compose)
    outs = [torch.full((len(ids), tables.dim), float("nan"), dtype=dtype) for ids, _ in parts]
    tables._embed_device([(torch.tensor(ids), spans, out)
                          for (ids, spans), out in zip(parts, outs)], compose)
    for got, expected in zip(outs, want):
        assert torch.equal(got, expected)


@pytest.mark.parametrize("table_dtype", [torch.float32, torch.bfloat16, torch.float16])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
@pytest.mark.parametrize("compose", [COMPOSE_TOKEN_PLUS_POSITION, COMPOSE_TOKEN_ONLY,
                                     COMPOSE_POSITION_ONLY])
def test_device_path_on_stored_dtypes_equals_cpu_path(table_dtype: torch.dtype,
                                                      dtype: torch.dtype, compose: int) -> None:
    # Tables kept in their stored dtype (bf16/fp16 checkpoints), on EMBED_TEST_DEVICE (cuda
    # under scripts/gpu.sh): the device path adds in the table dtype when the answer is in
    # it, in fp32 otherwise; the CPU path always widens to fp32 first. Same bits, every pair.
    token_table, position_table = (t.to(table_dtype) for t in tiny_tables(3))
    device = torch.device(os.environ.get("EMBED_TEST_DEVICE", "cpu"))
    on_device = EmbeddingTables(token_table, position_table, device, table_dtype=None)
    on_cpu = EmbeddingTables(token_table, position_table, torch.device("cpu"), table_dtype=None)
    parts = [([5, 6, 7], [(0, 3)]), (list(range(200, 240)), [(2, 30), (0, 10)]), ([9], [(63, 1)])]
    want = embed(on_cpu, parts, dtype, compose)
    for _ in range(2):  # the second batch reuses the index and answer buffers
        outs = [torch.full((len(ids), on_device.dim), float("nan"), dtype=dtype)
                for ids, _ in parts]
        on_device._embed_device([(torch.tensor(ids), spans, out)
                                 for (ids, spans), out in zip(parts, outs)], compose)
        for got, expected in zip(outs, want):
            assert torch.equal(got, expected)
    if table_dtype != torch.float32 and compose == COMPOSE_TOKEN_PLUS_POSITION:
        # Which rounding is asked for matters: an fp32 answer is the unrounded fp32 sum, an
        # answer in the table dtype that sum rounded once, and the two differ here.
        fp32_sum = token_table[5:8].float() + position_table[0:3].float()  # (3, C)
        expected = fp32_sum.to(dtype) if dtype != table_dtype else fp32_sum.to(table_dtype)
        assert torch.equal(want[0], expected)
        assert not torch.equal(fp32_sum, fp32_sum.to(table_dtype).float())

"""The dynamic batcher: coalescing, budgets, dropped work, bit-identical results."""

from __future__ import annotations

import asyncio
import time

import pytest
import torch

from service.batcher import Batcher, BatchStats, Job
from service.errors import DeadlineExceeded, ResourceExhausted
from service.tables import COMPOSE_TOKEN_PLUS_POSITION, EmbeddingTables, positions_of
from tests.tiny_model import tiny_tables


@pytest.fixture(scope="module")
def tables() -> EmbeddingTables:
    token_table, position_table = tiny_tables(0)
    return EmbeddingTables(token_table, position_table, torch.device("cpu"))


def job(tables: EmbeddingTables, ids: list[int], seen: list[BatchStats],
        deadline: float | None = None, dtype: torch.dtype = torch.float32) -> Job:
    def encode(rows: torch.Tensor, stats: BatchStats) -> bytes:
        seen.append(stats)
        return rows.contiguous().numpy().tobytes()
    return Job(tables, torch.tensor(ids), [(0, len(ids))], COMPOSE_TOKEN_PLUS_POSITION,
               dtype, encode, deadline)


def run(coro):  # type: ignore[no-untyped-def]
    return asyncio.run(coro)


def test_concurrent_jobs_share_one_batch_and_match_single(tables: EmbeddingTables) -> None:
    async def main() -> tuple[list[bytes], list[BatchStats]]:
        seen: list[BatchStats] = []
        batcher = Batcher(max_batch_tokens=64, max_batch_delay_us=20_000, max_queue_tokens=64)
        batcher.start()
        out = await asyncio.gather(*(batcher.submit(job(tables, [i, i + 1], seen))
                                     for i in range(8)))
        await batcher.close()
        return list(out), seen

    out, seen = run(main())
    assert [s.batch_requests for s in seen] == [8] * 8
    assert seen[0].batch_tokens == 16
    token_table, position_table = tiny_tables(0)
    for i, data in enumerate(out):
        assert data == (token_table[[i, i + 1]] + position_table[:2]).numpy().tobytes()


def test_token_budget_splits_batches(tables: EmbeddingTables) -> None:
    async def main() -> list[BatchStats]:
        seen: list[BatchStats] = []
        batcher = Batcher(max_batch_tokens=4, max_batch_delay_us=20_000, max_queue_tokens=64)
        batcher.start()
        await asyncio.gather(*(batcher.submit(job(tables, [1, 2, 3], seen)) for _ in range(3)))
        await batcher.close()
        return seen

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
    async def main() -> list[BatchStats]:
        seen: list[BatchStats] = []
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
        return seen

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


@pytest.mark.parametrize("spans", [
    [(0, 40), (10, 24)],  # long sequences: slice-adds of the position table
    [(3, 2)] * 32,  # many short ones: one gather of all positions
])
def test_lookup_equals_reference_and_single_in_both_position_paths(
        tables: EmbeddingTables, spans: list[tuple[int, int]]) -> None:
    token_table, position_table = tiny_tables(0)
    n = sum(t for _, t in spans)
    ids = torch.arange(100, 100 + n)
    positions = positions_of(spans)
    second = spans[1][0] if spans[0][1] == 2 else spans[0][0] + 2
    assert positions[:3].tolist() == [spans[0][0], spans[0][0] + 1, second]
    expected = token_table[ids] + position_table[positions]  # (N, C) fp32
    # On CPU lookup returns the fp32 sum whatever the wire dtype: the codec casts.
    batched = tables.lookup(ids, spans, COMPOSE_TOKEN_PLUS_POSITION, torch.bfloat16).clone()
    assert batched.dtype == torch.float32
    assert torch.equal(batched, expected)
    start, T = spans[-1]
    alone = tables.lookup(ids[n - T:], [(start, T)], COMPOSE_TOKEN_PLUS_POSITION, torch.float32)
    assert torch.equal(alone, batched[n - T:])

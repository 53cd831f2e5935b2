"""The soak's slow reader against a real in-process server with a small stream budget: it
holds a stream of large answers unread, the server paces it (never more than the budget
plus one answer held), every answer still arrives exact, and a client beside it loses
nothing. Plus the RSS-per-stretch arithmetic."""

from __future__ import annotations

import argparse
import asyncio
import random
import time

import pytest

from bench.harness.checkpoint import VOCAB_SIZE
from bench.soak.requests import RequestMaker
from bench.soak.slow import (
    SlowReader,
    SlowTally,
    rss_during,
    slow_summary,
)
from bench.soak.traffic import SoakClient, Tally
from client.retry import RetryPolicy
from tests.bench.soak.models import publish_soak_models
from tests.tiny_model import start

L, T, C = 32, 256, 64  # soak model positions; the wide model's T and C: 64 KiB answers
ANSWER = T * C * 4
PER_STREAM = 4 * ANSWER  # the budget holds 4 answers; the window would hold 64


@pytest.fixture(scope="module")
def servers(tmp_path_factory: pytest.TempPathFactory):  # type: ignore[no-untyped-def]
    root = tmp_path_factory.mktemp("slow")
    oracle, wide, tokenizer = publish_soak_models(root, L, T, C)
    handle = start(root / "models", default_model="soak", max_stream_buffer_bytes=PER_STREAM)
    yield handle, oracle, wide, tokenizer
    handle.stop()


def test_slow_reader_is_paced_exact_and_costs_the_others_nothing(servers) -> None:  # type: ignore[no-untyped-def]
    handle, oracle, wide, tokenizer = servers
    budgets = handle.server.fronts[0].stream_budgets
    args = argparse.Namespace(slow_tokens=T, slow_requests=80, slow_hold=1.0,
                              slow_trickle=0.002)
    slow, tally = SlowTally(), Tally()
    held: list[int] = []

    async def go() -> None:
        reader = SlowReader(0, handle.target, RetryPolicy(), wide, slow, args,
                            random.Random(1))
        other = SoakClient(1, handle.target, RetryPolicy(), oracle,
                           RequestMaker(random.Random(2), VOCAB_SIZE, L, tokenizer.encode),
                           tally, invalid_share=0.0)
        stretch = asyncio.ensure_future(reader.stretch())

        async def sample() -> None:  # the server's reserved bytes, read on its own thread
            while not stretch.done():
                held.append(budgets.held)
                await asyncio.sleep(0.005)

        sampler = asyncio.ensure_future(sample())
        await other.run(time.monotonic() + 0.9, random.Random(3))  # while it holds back
        await stretch
        await sampler
        await reader.run(time.monotonic())  # no time left: no stretch, returns at once
        await reader.close()
        await other.close()

    asyncio.run(go())
    assert slow.problems == []
    assert tally.problems == []
    assert (slow.requests, slow.answered, slow.lost, slow.corrupted) == (80, 80, 0, 0)
    assert len(slow.stretches) == 1
    assert slow.stretches[0]["hold_end"] > 0
    assert (tally.lost, tally.corrupted, sum(tally.failures.values())) == (0, 0, 0)
    assert tally.answered > 5
    # It filled its budget (it really held back) and no more: not its window of 64 answers.
    assert PER_STREAM - 2 * ANSWER < max(held) <= PER_STREAM
    assert budgets.held == 0  # everything given back once the stream ended


def test_rss_during_stretches_skips_events_and_bounds_growth() -> None:
    rss = [{"t": float(t), "total_mb": 500.0 + (30 if 10 <= t <= 14 else 0)
            + (200 if 40 <= t <= 44 else 0)} for t in range(60)]
    stretches = [{"start": 9.5, "end": 15.0}, {"start": 39.5, "end": 45.0},
                 {"start": 20.5, "end": 25.0}]
    events = [{"t": 41.0, "kind": "publish"}]
    got = rss_during(stretches, rss, events, settle_s=5.0)
    assert [(g["growth_mb"], g["clean"]) for g in got] == [(30.0, True), (200.0, False),
                                                           (0.0, True)]
    tally = SlowTally(requests=10, answered=10)
    s = slow_summary(tally, per_stream=16 << 20, total=256 << 20, readers=1,
                     answer_bytes=1 << 20, rss=got)
    assert s["max_growth_mb"] == 30.0
    assert s["bound_mb"] == 16 + 1 + 8 + 16
    assert s["within_bound"] is True
    assert s["clean_stretches"] == 2
    assert s["unpaced_mib"] == 64
    assert slow_summary(tally, 16 << 20, 0, 1, 1 << 20, [])["within_bound"] is None

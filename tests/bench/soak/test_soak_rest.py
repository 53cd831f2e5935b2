"""The soak's REST traffic against a real in-process server: the REST client's answers are
checked bit for bit by the soak's oracle (ids and text, every compose, dtype and
truncation), its invalid requests get 400, and the REST slow reader's answer, held unread
while the server keeps its in-flight slot and bytes, arrives exact."""

from __future__ import annotations

import asyncio
import random
import time

import pytest

from bench.harness.checkpoint import VOCAB_SIZE
from bench.soak.requests import RequestMaker
from bench.soak.rest import RestClient, RestSlowReader
from bench.soak.slow import SlowTally
from bench.soak.traffic import Tally
from tests.bench.soak.models import publish_soak_models
from tests.tiny_model import start

L, T, C, B = 32, 256, 64, 128  # the wide model's answers: B x T x C x 4 = 8 MiB, past what
# loopback buffers take (the answer is held by the server, not by the kernel)


@pytest.fixture(scope="module")
def rest_soak(tmp_path_factory: pytest.TempPathFactory):  # type: ignore[no-untyped-def]
    root = tmp_path_factory.mktemp("rest")
    oracle, wide, tokenizer = publish_soak_models(root, L, T, C)
    handle = start(root / "models", default_model="soak", max_tokens_per_request=B * T)
    yield handle, oracle, wide, tokenizer
    handle.stop()


def test_rest_client_and_slow_reader_are_exact(rest_soak) -> None:  # type: ignore[no-untyped-def]
    handle, oracle, wide, tokenizer = rest_soak
    http = handle.server.http
    tally, slow = Tally(), SlowTally()
    held: list[int] = []

    async def go() -> None:
        client = RestClient(0, handle.http_port, oracle,
                            RequestMaker(random.Random(2), VOCAB_SIZE, L, tokenizer.encode),
                            tally, invalid_share=0.2)
        reader = RestSlowReader(0, handle.http_port, wide, slow, B, T, 0.8, random.Random(1))
        stretch = asyncio.ensure_future(asyncio.to_thread(reader.stretch))

        async def sample() -> None:
            while not stretch.done():
                held.append(http.budgets.held)
                await asyncio.sleep(0.01)

        sampler = asyncio.ensure_future(sample())
        await client.run(time.monotonic() + 1.5)
        await stretch
        await sampler
        await client.close()

    asyncio.run(go())
    assert tally.problems == []
    assert slow.problems == []
    assert (tally.lost, tally.corrupted, tally.wrong_code, sum(tally.failures.values())) == \
        (0, 0, 0, 0)
    assert tally.answered > 10
    assert tally.codes[("REST infer", "INVALID_ARGUMENT", False)] > 0
    assert (slow.requests, slow.answered, slow.corrupted) == (1, 1, 0)
    assert slow.stretches[0]["hold_end"] > slow.stretches[0]["start"]
    # The unread answer's bytes were held (its bound: rows + lengths + header).
    assert max(held) >= B * T * C * 4
    assert http.budgets.held == 0
    assert http.slots.inflight == 0

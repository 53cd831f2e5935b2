"""Item 3: concurrency and memory are bounded in front of Python.

* RPCs in flight: past ``max_concurrent_rpcs`` gRPC core itself answers
  RESOURCE_EXHAUSTED; no handler runs (the frame's counters do not move).
* Answers waiting on a slow reader: a stream whose client never reads holds at most its
  budget of finished answers (``max_stream_buffer_bytes``), stops reading requests, and
  delivers every answer, in order and exact, once the client reads.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator

import grpc
import numpy as np
import pytest

from genproto.embedding.v1 import embedding_pb2 as pb
from genproto.embedding.v1 import embedding_pb2_grpc as pb_grpc
from service.local import ServerHandle
from tests.security.conftest import AUTH, LIMITS, WIDE_DIM, server_seconds, still_serves

Code = grpc.StatusCode
T = 64  # tokens per stream request: 64 x 128 x 4 B = 32 KiB per answer from "wide"
ANSWER = T * WIDE_DIM * 4


def _stream_budgets(handle: ServerHandle) -> object:
    return handle.server.fronts[0].stream_budgets  # type: ignore[attr-defined]


def _held_open(stub: pb_grpc.EmbeddingServiceStub, release: threading.Event,
               first: pb.EmbedRequest | None = None) -> Iterator[pb.EmbedResponse]:
    """A stream the client keeps open (sending nothing more) until ``release`` is set."""
    def requests() -> Iterator[pb.EmbedRequest]:
        if first is not None:
            yield first
        release.wait(30)

    return stub.EmbedStream(requests(), metadata=AUTH, timeout=30)  # type: ignore[no-any-return]


def test_rpcs_past_the_cap_are_refused_by_grpc_core(
        guarded: ServerHandle, native: pb_grpc.EmbeddingServiceStub) -> None:
    cap = LIMITS["max_concurrent_rpcs"]
    release = threading.Event()
    first = pb.EmbedRequest(text="hi")
    streams = [_held_open(native, release, first) for _ in range(cap)]
    try:
        for s in streams:  # every stream is in flight on the server (its answer arrived)
            assert list(next(s).token_ids) == [5303]
        before = server_seconds(guarded, "Embed")
        with pytest.raises(grpc.RpcError) as info:
            native.Embed(pb.EmbedRequest(text="x"), metadata=AUTH, timeout=10)
        assert info.value.code() == Code.RESOURCE_EXHAUSTED, info.value.details()
        assert server_seconds(guarded, "Embed") == before  # no Python handler ran
    finally:
        release.set()
        for s in streams:
            list(s)
    deadline = time.monotonic() + 10
    while True:  # the slots free as the streams end
        try:
            still_serves(native)
            break
        except grpc.RpcError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.05)


def test_a_stream_that_is_never_read_holds_at_most_its_budget(
        guarded: ServerHandle, native: pb_grpc.EmbeddingServiceStub) -> None:
    budget = LIMITS["max_stream_buffer_bytes"]
    # 400 answers of 32 KiB: 12.5 MiB, far past the stream's budget and what the client's
    # transport takes in without being read (its HTTP/2 window, up to ~4 MiB)
    n = 400
    rng = np.random.default_rng(0)
    requests = [pb.EmbedRequest(model="wide", request_id=f"r{i}", token_ids=pb.TokenIds(
        ids=rng.integers(0, 50257, T).tolist())) for i in range(n)]
    sent = threading.Event()
    done_sending: list[int] = []

    def feed() -> Iterator[pb.EmbedRequest]:
        for i, r in enumerate(requests):
            done_sending.append(i)
            yield r
        sent.set()

    budgets = _stream_budgets(guarded)
    stream = native.EmbedStream(feed(), metadata=AUTH, timeout=60)
    # Never read for a while: the server computes until the budget is spent, then waits.
    held = []
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and (len(held) < 20 or not max(held)):
        time.sleep(0.05)
        held.append(budgets.held)  # type: ignore[attr-defined]
    print(f"held by the server while the client did not read: max {max(held)} B "
          f"(budget {budget} B, one answer {ANSWER} B, all {n * ANSWER} B)")
    assert max(held) <= budget + ANSWER, held  # never the whole 2 MiB
    assert max(held) > 0  # it did work ahead, up to the budget
    answers = list(stream)  # now read: every answer, in order, exact
    assert [a.request_id for a in answers] == [r.request_id for r in requests]
    for a, r in zip(answers, requests):
        assert list(a.token_ids) == list(r.token_ids.ids)
        assert len(a.embeddings.data) == ANSWER
    assert budgets.held == 0  # type: ignore[attr-defined]
    still_serves(native)


def test_paced_answers_equal_unpaced_ones(guarded: ServerHandle,
                                          native: pb_grpc.EmbeddingServiceStub) -> None:
    """Pacing changes when answers are computed, never what they are."""
    reqs = [pb.EmbedRequest(model="wide", token_ids=pb.TokenIds(ids=[i, i + 1, 7] * 20),
                            dtype=pb.DTYPE_BFLOAT16) for i in range(20)]
    streamed = [a.embeddings.data for a in native.EmbedStream(iter(reqs), metadata=AUTH,
                                                              timeout=30)]
    unary = [native.Embed(r, metadata=AUTH, timeout=10).embeddings.data for r in reqs]
    assert streamed == unary


@pytest.mark.parametrize(("name", "value"), [
    ("max_inputs_per_request", 8), ("max_request_text_bytes", 100),
    ("max_concurrent_rpcs", 3), ("max_stream_buffer_bytes", 5), ("max_unsent_bytes", 0)])
def test_each_limit_is_a_flag_and_an_env_variable(name: str, value: int) -> None:
    from service.config import parse_config
    flag = "--" + name.replace("_", "-")
    assert getattr(parse_config([flag, str(value)], {}), name) == value
    assert getattr(parse_config([], {"EMBED_" + name.upper(): str(value)}), name) == value


def test_pacing_grants_in_request_order_and_skips_refused_answers() -> None:
    """Answer 2 may not reserve before answer 1 (which is sent first), a refused answer
    passes its turn on, and a stream holding nothing always takes one answer."""
    import asyncio

    from service.engine.budgets import StreamBudgets

    async def scenario() -> list[str]:
        budgets = StreamBudgets(per_stream=100, total=150)
        pacer, other = budgets.pacer(), budgets.pacer()
        order: list[str] = []

        async def answer(p: object, seq: int, n: int, tag: str) -> None:
            await p.reserve(seq, n)  # type: ignore[attr-defined]
            order.append(tag)

        late = asyncio.ensure_future(answer(pacer, 2, 10, "2"))
        await asyncio.sleep(0)
        assert order == []  # its turn has not come
        await answer(pacer, 0, 90, "0")  # holds 90 of 100
        pacer.skip(1)  # answer 1 was refused: answer 2's turn
        await asyncio.sleep(0)
        assert order == ["0", "2"]  # 90 + 10 fits the stream's 100
        big = asyncio.ensure_future(answer(pacer, 3, 60, "3"))
        await asyncio.sleep(0)
        assert "3" not in order  # 100 + 60 > 100: waits for the client
        await answer(other, 0, 500, "other")  # holds nothing: one answer always goes
        pacer.release(0)
        pacer.release(2)  # the client read 0 and 2
        await asyncio.wait_for(big, 1)
        await late
        pacer.close()
        other.close()
        assert budgets.held == 0
        return order

    assert asyncio.run(scenario()) == ["0", "2", "other", "3"]

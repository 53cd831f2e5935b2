"""The soak's parts against a real in-process server: requests, oracle, tally, windows."""

from __future__ import annotations

import asyncio
import random
import time

import grpc
import pytest

from bench.harness.checkpoint import VOCAB_SIZE
from bench.harness.load import percentile
from bench.soak.oracle import Oracle, Publisher
from bench.soak.report import latency_windows
from bench.soak.requests import RequestMaker
from bench.soak.traffic import AttemptCounter, SoakClient, Tally
from client.retry import RetryPolicy
from genproto.embedding.v1 import embedding_pb2 as pb
from genproto.embedding.v1 import embedding_pb2_grpc as pb_grpc
from service.format.tokenizer import default_ranks_path, gpt2_spec, load_tokenizer
from tests.tiny_model import start

L = 32  # max_seq_len of the soak model here


@pytest.fixture(scope="module")
def soak_setup(tmp_path_factory: pytest.TempPathFactory):  # type: ignore[no-untyped-def]
    root = tmp_path_factory.mktemp("soak")
    tokenizer = load_tokenizer(gpt2_spec(), default_ranks_path())
    oracle = Oracle(L, tokenizer.encode)
    publisher = Publisher(root, oracle, dim=8, max_seq_len=L)
    publisher.publish()
    handle = start(root / "models", default_model="soak")
    yield handle, oracle, tokenizer
    handle.stop()


def test_clients_see_only_exact_answers_and_expected_codes(soak_setup) -> None:  # type: ignore[no-untyped-def]
    handle, oracle, tokenizer = soak_setup
    tally = Tally()
    counter = AttemptCounter(handle.target)

    async def go() -> None:
        clients = [SoakClient(i, handle.target, RetryPolicy(), oracle,
                              RequestMaker(random.Random(i), VOCAB_SIZE, L, tokenizer.encode),
                              tally, invalid_share=0.3) for i in range(2)]
        until = time.monotonic() + 2.0
        await asyncio.gather(*(c.run(until, random.Random(10 + i))
                               for i, c in enumerate(clients)))
        counter.sample()
        for c in clients:
            await c.close()

    asyncio.run(go())
    assert tally.problems == []
    assert (tally.lost, tally.corrupted, tally.wrong_code) == (0, 0, 0)
    assert sum(tally.failures.values()) == 0
    assert set(tally.requests) == {"Embed", "EmbedBatch", "EmbedStream"}
    codes = {code for _, code, _ in tally.codes}
    assert {"OK", "INVALID_ARGUMENT", "NOT_FOUND"} <= codes
    assert tally.versions == {1: tally.answered}
    assert tally.answered > 20
    assert counter.calls > 0
    assert counter.retries == 0  # nothing was UNAVAILABLE


def test_oracle_flags_one_changed_byte_and_unknown_versions(soak_setup) -> None:  # type: ignore[no-untyped-def]
    handle, oracle, tokenizer = soak_setup
    maker = RequestMaker(random.Random(5), VOCAB_SIZE, L, tokenizer.encode)
    with grpc.insecure_channel(handle.target) as channel:
        stub = pb_grpc.EmbeddingServiceStub(channel)
        req, exp = maker.embed("r1")
        resp = stub.Embed(req)
        breq, bexp = maker.batch("r2")
        bresp = stub.EmbedBatch(breq)
    assert oracle.check_embed(resp, exp) is None
    assert oracle.check_batch(bresp, bexp) is None
    data = bytearray(resp.embeddings.data)
    data[-1] ^= 0x01
    bad = pb.EmbedResponse()
    bad.CopyFrom(resp)
    bad.embeddings.data = bytes(data)
    assert oracle.check_embed(bad, exp) == "rows differ from version 1's tables"
    bad.CopyFrom(resp)
    bad.version = 2
    assert "but checkpoint_id" in (oracle.check_embed(bad, exp) or "")
    bad.CopyFrom(resp)
    bad.checkpoint_id = "0" * 64
    assert oracle.check_embed(bad, exp) == "checkpoint_id 0000000000000000 was never published"


def test_latency_windows_and_percentile() -> None:
    lats = [(0.5, 0.001, "Embed"), (1.5, 0.002, "Embed"), (1.7, 0.004, "Embed"),
            (3.9, 0.010, "EmbedBatch")]
    assert latency_windows(lats, seconds=4.0, window_s=2.0) == [
        {"t": 1.0, "answers": 3, "p50_ms": 2.0, "p99_ms": 4.0},
        {"t": 3.0, "answers": 1, "p50_ms": 10.0, "p99_ms": 10.0},
    ]
    assert percentile([5.0, 1.0, 3.0], 0.5) == 3.0
    assert percentile([], 0.5) != percentile([], 0.5)  # nan


"""EmbeddingClient against a real server: exact arrays, every RPC, typed errors."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import grpc
import numpy as np
import pytest
import torch

from client import EmbeddingClient, EmbeddingError
from genproto.embedding.v1 import embedding_pb2 as pb
from service.format.checkpoint import Checkpoint
from service.local import ServerHandle
from tests.client.conftest import TOKEN
from tests.tiny_model import start

HELLO_WORLD = [31373, 995]


@pytest.fixture
def client(server: ServerHandle) -> EmbeddingClient:
    with EmbeddingClient(server.target, timeout=30) as c:
        yield c


def test_embed_text_is_token_plus_position_rows_exactly(
        client: EmbeddingClient, tiny_checkpoint: Checkpoint, reference) -> None:
    e = client.embed("hello world", request_id="req-1")
    assert e.token_ids == HELLO_WORLD
    assert e.array.shape == (2, 16)
    assert e.array.dtype == np.dtype("<f4")
    assert np.array_equal(e.array, reference(HELLO_WORLD))  # bit for bit
    assert not e.array.flags.writeable
    assert (e.model, e.version, e.wire_dtype) == ("tiny", 1, "float32")
    assert e.checkpoint_id == tiny_checkpoint.checkpoint_id
    assert (e.start_position, e.truncated_tokens) == (0, 0)
    # TRAINED_ROWS = 1000: " world" (995) was trained, "hello" (31373) never was.
    assert e.untrained_token_indices == [0]
    assert e.request_id == "req-1"
    assert e.timing.total_ns > 0


@pytest.mark.parametrize("compose", ["token+position", "token", "position"])
def test_embed_ids_with_start_position_and_compose(client: EmbeddingClient, reference,
                                                   compose: str) -> None:
    ids = [0, 50256, 1, 7]
    e = client.embed(ids=ids, start_position=60, compose=compose)
    assert e.token_ids == ids
    assert e.start_position == 60
    assert np.array_equal(e.array, reference(ids, 60, compose))


def test_compose_accepts_the_proto_enum(client: EmbeddingClient, reference) -> None:
    e = client.embed(ids=[3], compose=pb.COMPOSE_TOKEN_ONLY)
    assert np.array_equal(e.array, reference([3], 0, "token"))


def test_float16_is_the_rounded_fp32_sum(client: EmbeddingClient, reference) -> None:
    e = client.embed("hello world", dtype="float16")
    assert (e.wire_dtype, e.array.dtype) == ("float16", np.dtype("<f2"))
    assert np.array_equal(e.array, reference(HELLO_WORLD).astype(np.float16))


def test_bfloat16_widened_equals_torch_bf16_cast(server: ServerHandle, reference) -> None:
    fp32 = torch.from_numpy(reference(HELLO_WORLD))
    want = fp32.to(torch.bfloat16)  # (T, C): what the server computes and sends
    with EmbeddingClient(server.target, timeout=30) as c:
        e = c.embed("hello world", dtype="bfloat16")
    assert (e.wire_dtype, e.array.dtype, e.array.shape) == ("bfloat16", np.float32, (2, 16))
    assert np.array_equal(e.array, want.float().numpy())
    assert not np.array_equal(e.array, fp32.numpy())  # really rounded, not fp32 passed through
    with EmbeddingClient(server.target, timeout=30, raw_bfloat16=True) as c:
        raw = c.embed("hello world", dtype="bfloat16")
    assert raw.array.dtype == np.dtype("<u2")
    assert np.array_equal(raw.array, want.view(torch.int16).numpy().view(np.uint16))


def test_embed_batch_splits_by_offsets_into_views(client: EmbeddingClient, reference) -> None:
    inputs: list[str | list[int]] = ["hello world", [5, 6, 7], "a", [50256]]
    out = client.embed_batch(inputs, start_positions=[0, 3, 10, 63], request_id="b1")
    assert [e.token_ids for e in out] == [HELLO_WORLD, [5, 6, 7], [64], [50256]]
    assert [e.array.shape for e in out] == [(2, 16), (3, 16), (1, 16), (1, 16)]
    assert [e.start_position for e in out] == [0, 3, 10, 63]
    for e in out:
        assert np.array_equal(e.array, reference(e.token_ids, e.start_position))
    assert all(e.array.base is out[0].array.base for e in out)  # one buffer, no copies
    assert {(e.model, e.version, e.request_id) for e in out} == {("tiny", 1, "b1")}
    assert [e.untrained_token_indices for e in out] == [[0], [], [], [0]]


def test_embed_stream_answers_in_request_order(client: EmbeddingClient, reference) -> None:
    lengths = [5, 1, 12, 3, 8, 2]
    reqs = [[(17 * n + i) % 50257 for i in range(n)] for n in lengths]
    out = list(client.embed_stream(iter(reqs), dtype="float32"))
    assert [e.token_ids for e in out] == reqs
    for e, ids in zip(out, reqs):
        assert np.array_equal(e.array, reference(ids))


def test_embed_stream_mixes_text_and_ready_requests(client: EmbeddingClient) -> None:
    ready = pb.EmbedRequest(token_ids=pb.TokenIds(ids=[1, 2]), request_id="ready")
    out = list(client.embed_stream(["hello world", ready], request_id="text"))
    assert [(e.request_id, e.token_ids) for e in out] == [("text", HELLO_WORLD),
                                                            ("ready", [1, 2])]


def test_tokenize_and_detokenize(client: EmbeddingClient) -> None:
    ids, tokens = client.tokenize("hello world")
    assert (ids, tokens) == (HELLO_WORLD, [b"hello", b" world"])
    assert client.tokenize("<|endoftext|>")[0] == [27, 91, 437, 1659, 5239, 91, 29]
    assert client.tokenize("<|endoftext|>", allow_special_tokens=True)[0] == [50256]
    assert client.detokenize(HELLO_WORLD) == "hello world"


def test_models_and_model_info(client: EmbeddingClient, tiny_checkpoint: Checkpoint) -> None:
    models = {m.model: m for m in client.list_models()}
    assert sorted(models) == ["rope", "tiny"]
    info = client.model_info()
    assert models["tiny"] == info
    assert client.model_info("rope").position == "none"
    assert (info.model, info.version, info.checkpoint_id) == ("tiny", 1,
                                                              tiny_checkpoint.checkpoint_id)
    assert (info.vocab_size, info.table_rows, info.dim, info.max_seq_len) == (50257, 50304, 16,
                                                                              64)
    assert (info.position, info.is_default, info.has_row_updates) == ("learned", True, True)
    assert info.untrained_rows == 50257 - 1000


@pytest.mark.parametrize(("call", "code", "details"), [
    (lambda c: c.embed(ids=[1, 2, 99999]), grpc.StatusCode.INVALID_ARGUMENT, "99999"),
    (lambda c: c.embed("x", model="nope"), grpc.StatusCode.NOT_FOUND, "'nope'"),
    (lambda c: c.embed("x", version=9), grpc.StatusCode.NOT_FOUND, "version 9"),
    (lambda c: c.embed(ids=list(range(65))), grpc.StatusCode.INVALID_ARGUMENT, "64"),
    (lambda c: c.model_info("nope"), grpc.StatusCode.NOT_FOUND, "'nope'"),
    (lambda c: c.embed("x", model="rope", compose="position"),
     grpc.StatusCode.FAILED_PRECONDITION, "rope"),
])
def test_server_errors_are_typed(client: EmbeddingClient, call, code: grpc.StatusCode,
                                 details: str) -> None:
    with pytest.raises(EmbeddingError) as info:
        call(client)
    assert info.value.code == code
    assert details in info.value.details
    assert str(info.value) == f"{code.name}: {info.value.details}"
    assert not info.value.unreachable


def test_truncate_right_and_left(client: EmbeddingClient, reference) -> None:
    ids = list(range(100, 170))  # 70 > max_seq_len 64
    right = client.embed(ids=ids, truncate="right")
    assert (right.token_ids, right.truncated_tokens, right.start_position) == (ids[:64], 6, 0)
    assert np.array_equal(right.array, reference(ids[:64]))
    left = client.embed(ids=ids, truncate="left")
    assert (left.token_ids, left.truncated_tokens, left.start_position) == (ids[6:], 6, 0)
    assert np.array_equal(left.array, reference(ids[6:]))


def test_unreachable_server_is_unavailable() -> None:
    with EmbeddingClient("127.0.0.1:1", timeout=5) as c, pytest.raises(EmbeddingError) as info:
        c.embed("hello")
    assert info.value.code == grpc.StatusCode.UNAVAILABLE
    assert info.value.unreachable


def test_deadline_is_passed_to_the_server(tiny_repo: Path) -> None:
    # A 300 ms batch delay holds the request past its 50 ms deadline, on every machine.
    slow = start(tiny_repo, max_batch_delay_us=300_000)
    try:
        with EmbeddingClient(slow.target) as c, pytest.raises(EmbeddingError) as info:
            c.embed("hello world", timeout=0.05)
        assert info.value.code == grpc.StatusCode.DEADLINE_EXCEEDED
    finally:
        slow.stop(grace=0.5)


def test_bearer_token_is_sent(token_server: ServerHandle) -> None:
    with EmbeddingClient(token_server.target, timeout=30, token=TOKEN) as c:
        assert c.embed("hello world").token_ids == HELLO_WORLD
    for token in (None, "wrong"):
        with EmbeddingClient(token_server.target, timeout=30, token=token) as c, \
                pytest.raises(EmbeddingError) as info:
            c.embed("hello world")
        assert info.value.code == grpc.StatusCode.UNAUTHENTICATED


def test_stream_stopped_early_is_cancelled(client: EmbeddingClient) -> None:
    sent: list[int] = []

    def endless() -> Iterator[list[int]]:
        while True:
            sent.append(1)
            yield [len(sent) % 50257]

    stream = client.embed_stream(endless())
    assert next(stream).token_ids == [1]
    stream.close()  # must return, not hang on the open request iterator
    assert client.embed("hello world").token_ids == HELLO_WORLD  # the channel still works

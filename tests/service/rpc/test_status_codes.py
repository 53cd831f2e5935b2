"""Every row of the status-code table, each followed by a good request that still works."""

from __future__ import annotations

import logging
import time
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path

import grpc
import pytest

from genproto.embedding.v1 import embedding_pb2 as pb
from genproto.embedding.v1 import embedding_pb2_grpc as pb_grpc
from service.local import ServerHandle
from tests.service.rpc.embed_refusals import INVALID_ARGUMENT, ids
from tests.tiny_model import MakeCheckpoint, start

Code = grpc.StatusCode
GOOD = pb.EmbedRequest(text="hello world")


def expect(stub: pb_grpc.EmbeddingServiceStub, request: pb.EmbedRequest, code: Code,
           message: str, **kwargs: object) -> None:
    """The request fails with ``code`` and ``message``; a good request right after works."""
    with pytest.raises(grpc.RpcError) as info:
        stub.Embed(request, **kwargs)  # type: ignore[arg-type]
    assert info.value.code() == code, info.value.details()
    assert info.value.details() == message
    assert list(stub.Embed(GOOD, **kwargs).token_ids) == [31373, 995]  # type: ignore[arg-type]


@pytest.mark.parametrize(("request_", "message"), INVALID_ARGUMENT)
def test_invalid_argument(native: pb_grpc.EmbeddingServiceStub, request_: pb.EmbedRequest,
                          message: str) -> None:
    expect(native, request_, Code.INVALID_ARGUMENT, message)


def test_not_found(native: pb_grpc.EmbeddingServiceStub) -> None:
    expect(native, pb.EmbedRequest(model="nope", text="x"), Code.NOT_FOUND,
           "model 'nope' is not loaded (loaded: rope, tiny)")
    expect(native, pb.EmbedRequest(model="tiny", version=2, text="x"), Code.NOT_FOUND,
           "version 2 of model 'tiny' is not loaded (serving version 1)")


def test_position_only_without_table(native: pb_grpc.EmbeddingServiceStub) -> None:
    expect(native, pb.EmbedRequest(model="rope", text="x", compose=pb.COMPOSE_POSITION_ONLY),
           Code.FAILED_PRECONDITION, "compose=COMPOSE_POSITION_ONLY needs a position table; "
           "model 'rope' has position 'none'")


@pytest.fixture(scope="module")
def limited(limited_server: ServerHandle) -> Iterator[pb_grpc.EmbeddingServiceStub]:
    with grpc.insecure_channel(limited_server.target) as channel:
        yield pb_grpc.EmbeddingServiceStub(channel)


@pytest.fixture(scope="module")
def limited_metrics(limited_server: ServerHandle) -> int:
    return limited_server.metrics_port


AUTH = {"metadata": (("authorization", "Bearer t0ken"),)}


def test_unauthenticated(limited: pb_grpc.EmbeddingServiceStub) -> None:
    with pytest.raises(grpc.RpcError) as info:
        limited.Embed(GOOD)
    assert info.value.code() == Code.UNAUTHENTICATED
    assert info.value.details() == "missing or invalid 'authorization: Bearer <token>'"
    bad = {"metadata": (("authorization", "Bearer wrong"),)}
    with pytest.raises(grpc.RpcError) as info:
        limited.Embed(GOOD, **bad)  # type: ignore[arg-type]
    assert info.value.code() == Code.UNAUTHENTICATED
    assert list(limited.Embed(GOOD, **AUTH).token_ids) == [31373, 995]  # type: ignore[arg-type]


def test_text_over_byte_limit(limited: pb_grpc.EmbeddingServiceStub) -> None:
    expect(limited, pb.EmbedRequest(text="é" * 9), Code.INVALID_ARGUMENT,
           "input.text is 18 bytes; max_text_bytes is 16", **AUTH)


def test_response_over_message_size_names_largest_t(
        limited: pb_grpc.EmbeddingServiceStub) -> None:
    expect(limited, pb.EmbedRequest(token_ids=ids(*range(20))), Code.RESOURCE_EXHAUSTED,
           "response would be ~2624 bytes (20 tokens x 16 x 4 B) > max_message_bytes 2000; "
           "the largest T that fits is 12", **AUTH)


def test_queue_full(limited: pb_grpc.EmbeddingServiceStub, limited_metrics: int) -> None:
    first = limited.Embed.future(pb.EmbedRequest(token_ids=ids(*range(6))), **AUTH)  # type: ignore[arg-type]
    time.sleep(0.1)  # the first is queued, waiting out the batch delay
    url = f"http://127.0.0.1:{limited_metrics}/metrics"
    with urllib.request.urlopen(url, timeout=5) as response:
        assert "embed_queue_tokens 6.0" in response.read().decode()
    expect(limited, pb.EmbedRequest(token_ids=ids(*range(6))), Code.RESOURCE_EXHAUSTED,
           "queue holds 6 tokens; this request's 6 would exceed max_queue_tokens=8; "
           "retry later", **AUTH)
    assert list(first.result().token_ids) == list(range(6))


def test_deadline_passed_before_compute_does_no_work(
        limited: pb_grpc.EmbeddingServiceStub, limited_metrics: int) -> None:
    def tokens_served() -> str:
        url = f"http://127.0.0.1:{limited_metrics}/metrics"
        with urllib.request.urlopen(url, timeout=5) as response:
            return next((line for line in response.read().decode().splitlines()
                         if line.startswith("embed_tokens_total")), "")

    before = tokens_served()
    with pytest.raises(grpc.RpcError) as info:
        limited.Embed(pb.EmbedRequest(token_ids=ids(1, 2)), timeout=0.05, **AUTH)  # type: ignore[arg-type]
    assert info.value.code() == Code.DEADLINE_EXCEEDED
    time.sleep(1.3)  # past the 1 s batch delay: the job was dropped, not computed
    assert tokens_served() == before
    assert list(limited.Embed(GOOD, **AUTH).token_ids) == [31373, 995]  # type: ignore[arg-type]


def test_no_model_loaded_is_unavailable(tmp_path: Path,
                                        make_checkpoint: MakeCheckpoint) -> None:
    handle = start(tmp_path)
    try:
        with grpc.insecure_channel(handle.target) as channel:
            stub = pb_grpc.EmbeddingServiceStub(channel)
            with pytest.raises(grpc.RpcError) as info:
                stub.Embed(GOOD)
            assert info.value.code() == Code.UNAVAILABLE
            assert info.value.details() == "no model is loaded yet; retry shortly"
            make_checkpoint(tmp_path)
            handle.refresh()
            assert list(stub.Embed(GOOD).token_ids) == [31373, 995]
    finally:
        handle.stop()


def test_internal_error_hides_details_and_logs_request_id(
        server: ServerHandle, native: pb_grpc.EmbeddingServiceStub,
        monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    tokenizer = server.server.repo.get("tiny", 0).tokenizer
    boom: Callable[..., list[int]] = lambda *a: (_ for _ in ()).throw(RuntimeError("secret"))  # noqa: E731
    monkeypatch.setattr(tokenizer, "encode", boom)
    with (caplog.at_level(logging.ERROR, logger="service.frame"),
          pytest.raises(grpc.RpcError) as info):
        native.Embed(pb.EmbedRequest(text="x", request_id="r-42"))
    assert info.value.code() == Code.INTERNAL
    assert info.value.details() == "internal error (request_id='r-42'); see server logs"
    assert "secret" not in info.value.details()
    assert any("request_id='r-42'" in r.getMessage() for r in caplog.records)
    monkeypatch.undo()
    assert list(native.Embed(GOOD).token_ids) == [31373, 995]


@pytest.mark.parametrize(("dtype", "T", "largest"), [
    (pb.DTYPE_FLOAT32, 16, 15), (pb.DTYPE_BFLOAT16, 32, 31), (pb.DTYPE_FLOAT16, 32, 31)])
def test_output_bytes_limit_names_the_largest_T_for_the_dtype(tiny_repo: Path, dtype: int,
                                                             T: int, largest: int) -> None:
    handle = start(tiny_repo, max_output_bytes=1000)  # C=16: 64 B/row fp32, 32 B/row 16-bit
    try:
        with grpc.insecure_channel(handle.target) as channel:
            stub = pb_grpc.EmbeddingServiceStub(channel)
            with pytest.raises(grpc.RpcError) as info:
                stub.Embed(pb.EmbedRequest(token_ids=pb.TokenIds(ids=[1] * T), dtype=dtype))
            fits = stub.Embed(pb.EmbedRequest(token_ids=pb.TokenIds(ids=[1] * largest),
                                              dtype=dtype))
    finally:
        handle.stop()
    name = {pb.DTYPE_FLOAT32: "float32", pb.DTYPE_BFLOAT16: "bfloat16",
            pb.DTYPE_FLOAT16: "float16"}[dtype]
    itemsize = 4 if dtype == pb.DTYPE_FLOAT32 else 2
    assert info.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
    assert info.value.details() == (
        f"output would be {T * 16 * itemsize} bytes ({T} tokens x 16 x {itemsize} B {name}) > "
        f"max_output_bytes 1000; the largest T that fits in {name} is {largest}")
    assert list(fits.embeddings.shape) == [largest, 16]

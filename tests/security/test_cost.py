"""Item 1: a request's whole size is checked from what it declares, before any per-input
work, tokenization or allocation, and what a refusal costs does not grow with what the
request declares.

"Cost" is measured where the server measures it: the frame's request duration, i.e. the
seconds the handler spent in Python (parsing, in gRPC core's C, is not in it and is linear
in the bytes received). Every refusal names its limit and the limit's value.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator

import grpc
import numpy as np
import pytest

from genproto.embedding.v1 import embedding_pb2 as pb
from genproto.embedding.v1 import embedding_pb2_grpc as pb_grpc
from genproto.inference.v2 import grpc_service_pb2 as oip
from genproto.inference.v2 import grpc_service_pb2_grpc as oip_grpc
from service.local import ServerHandle
from tests.security.conftest import AUTH, LIMITS, server_seconds, still_serves

Code = grpc.StatusCode
MAX_INPUTS = LIMITS["max_inputs_per_request"]
MAX_TEXT = LIMITS["max_request_text_bytes"]
Tensor = oip.ModelInferRequest.InferInputTensor


def ids_request(shape: list[int], raw: bytes | None = None,
                typed: list[int] | None = None) -> oip.ModelInferRequest:
    """An OIP ``input_ids`` request declaring ``shape``, with raw or typed contents."""
    tensor = Tensor(name="input_ids", datatype="INT64", shape=shape)
    if typed is not None:
        tensor.contents.int64_contents.extend(typed)
    request = oip.ModelInferRequest(model_name="tiny", inputs=[tensor])
    if raw is not None:
        request.raw_input_contents.append(raw)
    return request


def refused(call: Callable[[], object], code: Code = Code.INVALID_ARGUMENT) -> str:
    with pytest.raises(grpc.RpcError) as info:
        call()
    assert info.value.code() == code, info.value.details()
    return str(info.value.details())


@pytest.fixture
def tokenized(guarded: ServerHandle, monkeypatch: pytest.MonkeyPatch) -> Iterator[list[int]]:
    """Counts the texts the server tokenizes while the test runs."""
    tokenizer = guarded.server.repo.get("tiny", 0).tokenizer
    calls: list[int] = []
    encode = tokenizer.encode

    def counting(text: str, *args: object) -> list[int]:
        calls.append(len(text))
        return encode(text, *args)  # type: ignore[no-any-return]

    monkeypatch.setattr(tokenizer, "encode", counting)
    return calls


# -- OIP shapes: refused from the shape and the contents' length, at once -------------------

@pytest.mark.parametrize(("shape", "raw", "words"), [
    ([1_000_000, 0], b"", "every dimension >= 1"),  # B sequences of nothing
    ([0, 4], b"", "every dimension >= 1"),
    ([-1, 4], b"\0" * 32, "every dimension >= 1"),
    ([4, -8], b"\0" * 32, "every dimension >= 1"),
    ([2**62, 2**62], b"\0" * 8, "needs 170141183460469231731687303715884105728 bytes"),
    ([2, 3], b"\0" * 40, "needs 48 bytes of raw_input_contents; got 40"),
    ([3], b"\0" * 24, "expected [B, T]"),
    ([1, 2, 3], b"\0" * 48, "expected [B, T]"),
])
def test_a_bad_input_ids_shape_is_invalid_argument(
        inference: oip_grpc.GRPCInferenceServiceStub, native: pb_grpc.EmbeddingServiceStub,
        shape: list[int], raw: bytes, words: str) -> None:
    message = refused(lambda: inference.ModelInfer(ids_request(shape, raw), metadata=AUTH))
    assert words in message
    still_serves(native)


def test_typed_contents_that_disagree_with_the_shape(
        inference: oip_grpc.GRPCInferenceServiceStub) -> None:
    message = refused(lambda: inference.ModelInfer(ids_request([1000, 1000], typed=[1, 2]),
                                                   metadata=AUTH))
    assert message == "input 'input_ids' [1000, 1000] needs 1000000 values in contents; got 2"


def test_text_shape_and_contents(inference: oip_grpc.GRPCInferenceServiceStub) -> None:
    text = Tensor(name="text", datatype="BYTES", shape=[10**9])
    text.contents.bytes_contents.append(b"hi")
    assert "needs 1000000000 strings; got 1" in refused(
        lambda: inference.ModelInfer(oip.ModelInferRequest(model_name="tiny", inputs=[text]),
                                     metadata=AUTH))
    raw = oip.ModelInferRequest(model_name="tiny", inputs=[
        Tensor(name="text", datatype="BYTES", shape=[10**6])], raw_input_contents=[b"\0" * 8])
    assert "fewer than their 4000000 length bytes" in refused(
        lambda: inference.ModelInfer(raw, metadata=AUTH))
    zero = oip.ModelInferRequest(model_name="tiny", inputs=[
        Tensor(name="text", datatype="BYTES", shape=[0])])
    assert "every dimension >= 1" in refused(lambda: inference.ModelInfer(zero, metadata=AUTH))


# -- counts and text bytes: refused before any input is looked at -----------------------------

def test_100k_inputs_are_refused_from_their_count(
        guarded: ServerHandle, native: pb_grpc.EmbeddingServiceStub,
        inference: oip_grpc.GRPCInferenceServiceStub) -> None:
    many = pb.EmbedBatchRequest(inputs=[pb.EmbedInput(text="x")] * 100_000)
    before = server_seconds(guarded, "EmbedBatch")
    message = refused(lambda: native.EmbedBatch(many, metadata=AUTH, timeout=30))
    assert message == f"inputs has 100000 sequences; max_inputs_per_request is {MAX_INPUTS}"
    after = server_seconds(guarded, "EmbedBatch")
    assert after[1] == before[1] + 1
    assert after[0] - before[0] < 0.05, after[0] - before[0]  # no per-input step: ~50 µs

    B = 100_000
    request = ids_request([B, 1], raw=np.ones(B, "<i8").tobytes())
    message = refused(lambda: inference.ModelInfer(request, metadata=AUTH, timeout=30))
    assert message == f"inputs has {B} sequences; max_inputs_per_request is {MAX_INPUTS}"
    still_serves(native)


def test_eight_big_texts_are_refused_before_tokenizing(
        guarded: ServerHandle, native: pb_grpc.EmbeddingServiceStub,
        inference: oip_grpc.GRPCInferenceServiceStub, tokenized: list[int]) -> None:
    """The sum of the texts is over the limit while each text is within its own."""
    each = LIMITS["max_text_bytes"]  # every text at its own cap
    texts = ["a" * each] * 8
    before = server_seconds(guarded, "EmbedBatch")
    message = refused(lambda: native.EmbedBatch(pb.EmbedBatchRequest(
        inputs=[pb.EmbedInput(text=t) for t in texts]), metadata=AUTH, timeout=30))
    assert message == (f"inputs hold {3 * each} bytes of text in all; "
                       f"max_request_text_bytes is {MAX_TEXT}")
    assert server_seconds(guarded, "EmbedBatch")[0] - before[0] < 0.05
    request = oip.ModelInferRequest(model_name="tiny", inputs=[
        Tensor(name="text", datatype="BYTES", shape=[8],
               contents=oip.InferTensorContents(bytes_contents=[t.encode() for t in texts]))])
    assert "max_request_text_bytes is" in refused(
        lambda: inference.ModelInfer(request, metadata=AUTH, timeout=30))
    assert tokenized == []  # not one text was tokenized
    still_serves(native)


def test_one_text_over_its_limit_stops_the_batch_before_any_is_tokenized(
        native: pb_grpc.EmbeddingServiceStub, tokenized: list[int]) -> None:
    """The per-text limit is checked for every input before the first is tokenized."""
    batch = pb.EmbedBatchRequest(inputs=[pb.EmbedInput(text="hello"),
                                         pb.EmbedInput(text="é" * LIMITS["max_text_bytes"])])
    message = refused(lambda: native.EmbedBatch(batch, metadata=AUTH))
    assert message == (f"inputs[1].text is {2 * LIMITS['max_text_bytes']} bytes; "
                       f"max_text_bytes is {LIMITS['max_text_bytes']}")
    assert tokenized == []


def test_declared_token_ids_over_the_cap_are_refused_before_each_is_checked(
        native: pb_grpc.EmbeddingServiceStub) -> None:
    """With TRUNCATE_NONE every id is kept or the request refused: the count decides."""
    ids = pb.TokenIds(ids=[1] * 9000 + [-1])  # a bad id too: the count is looked at first
    message = refused(lambda: native.Embed(pb.EmbedRequest(token_ids=ids), metadata=AUTH))
    assert message == ("input has T=9001 tokens; max_tokens_per_request is 8192 (or set "
                       "truncate)")
    batch = pb.EmbedBatchRequest(inputs=[pb.EmbedInput(token_ids=pb.TokenIds(ids=[1] * 5000))] * 2)
    assert refused(lambda: native.EmbedBatch(batch, metadata=AUTH)) == (
        "inputs have 10000 tokens in all; max_tokens_per_request is 8192")


# -- the measure: what a refusal costs does not grow with what it declares --------------------

def _median_server_seconds(handle: ServerHandle, rpc: str, call: Callable[[], object],
                           reps: int = 7) -> float:
    samples = []
    for _ in range(reps):
        before = server_seconds(handle, rpc)[0]
        with pytest.raises(grpc.RpcError):
            call()
        samples.append(server_seconds(handle, rpc)[0] - before)
    return sorted(samples)[reps // 2]


CASES = {
    # declared B sequences of T=0, nothing sent
    "input_ids [B, 0]": lambda B: ids_request([B, 0], b""),
    # declared [B, 8], 8 ids sent
    "input_ids [B, 8] short": lambda B: ids_request([B, 8], np.ones(8, "<i8").tobytes()),
    # B texts declared, one sent
    "text [B]": lambda B: oip.ModelInferRequest(model_name="tiny", inputs=[
        Tensor(name="text", datatype="BYTES", shape=[B],
               contents=oip.InferTensorContents(bytes_contents=[b"x"]))]),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_refusal_cost_does_not_grow_with_what_is_declared(
        guarded: ServerHandle, inference: oip_grpc.GRPCInferenceServiceStub,
        native: pb_grpc.EmbeddingServiceStub, case: str) -> None:
    """Server seconds for B=10 and B=1,000,000 declared stay within a small factor (and
    under a millisecond-scale bound: a per-B loop of even 1 µs would cost a second)."""
    build = CASES[case]
    small = _median_server_seconds(guarded, "ModelInfer", lambda: inference.ModelInfer(
        build(10), metadata=AUTH, timeout=10))
    large = _median_server_seconds(guarded, "ModelInfer", lambda: inference.ModelInfer(
        build(1_000_000), metadata=AUTH, timeout=10))
    print(f"{case}: B=10 {small * 1e6:.0f} µs, B=1e6 {large * 1e6:.0f} µs")
    assert large < 0.02, large  # 1e6 × anything per input would be far past this
    assert large <= 5 * small + 0.002, (small, large)
    still_serves(native)


def test_refusal_cost_of_many_inputs_is_flat(guarded: ServerHandle,
                                             native: pb_grpc.EmbeddingServiceStub) -> None:
    """EmbedBatch: 100 vs 100,000 inputs over the cap (each an empty EmbedInput: what the
    client sends grows, the handler's time must not)."""
    def batch(n: int) -> Callable[[], object]:
        request = pb.EmbedBatchRequest(inputs=[pb.EmbedInput()] * n)
        return lambda: native.EmbedBatch(request, metadata=AUTH, timeout=30)

    small = _median_server_seconds(guarded, "EmbedBatch", batch(100), reps=5)
    t0 = time.perf_counter()
    large = _median_server_seconds(guarded, "EmbedBatch", batch(100_000), reps=5)
    wall = time.perf_counter() - t0
    print(f"EmbedBatch: 100 inputs {small * 1e6:.0f} µs, 100k {large * 1e6:.0f} µs "
          f"(client wall for 5: {wall:.2f} s)")
    assert large < 0.02, (small, large)
    assert large <= 5 * small + 0.002, (small, large)

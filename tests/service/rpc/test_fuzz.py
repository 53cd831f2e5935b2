"""Fuzz the embedding RPCs against a real server, checked by an independent oracle.

Every example is sent to one real server (port 0, the tiny models, small limits so every
limit is reachable) and must get exactly the oracle's status (``fuzz_oracle``); an OK
answer must match the oracle's rows byte for byte, with its shape, dtype, ids, positions
and truncation. After every example a known-good request must still get the right bytes.
Streams and concurrent requests share batches (the server waits 1 ms to batch), so the
mixed-batch paths are fuzzed too; raw bytes probe what protobuf and gRPC do before the
service runs. The regressions at the end are bugs this fuzzing found, kept as plain tests.

``HYPOTHESIS_PROFILE`` picks the budget: ``ci`` (default; derandomized, so CI runs the
same examples every time) or ``long`` (``make fuzz``).
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import grpc
import pytest
from google.protobuf.message import DecodeError, Message
from hypothesis import event, example, given
from hypothesis import strategies as st

from client import EmbeddingClient
from client.shm import SharedMemoryRegion
from genproto.embedding.v1 import embedding_pb2 as pb
from genproto.embedding.v1 import embedding_pb2_grpc as pb_grpc
from genproto.inference.v2 import grpc_service_pb2 as oip
from service.local import ServerHandle
from tests.service.rpc.fuzz_oracle import (
    GOOD,
    MAX_MESSAGE_BYTES,
    SERVICE,
    VERSION,
    Code,
    Oracle,
    Outcome,
    answered,
    raw_rpc,
    refused,
    still_serves,
    wire_bytes,
)
from tests.service.rpc.fuzz_strategies import (
    BAD_UTF8,
    FUZZ,
    IDS,
    batch,
    batch_requests,
    embed_requests,
    ids,
    span,
    tagged,
    wire_field,
)
from tests.tiny_model import DIM, TABLE_ROWS, VOCAB_SIZE

# -- fixtures ----------------------------------------------------------------------------


@pytest.fixture(scope="module")
def grpc_server(fuzz_server: ServerHandle) -> ServerHandle:
    """The server tests/conftest.py's ``channel`` and ``stub`` speak to here."""
    return fuzz_server


@pytest.fixture(scope="module")
def oracle(gpt2_ranks: Path, tiny_repo: Path) -> Oracle:
    return Oracle(gpt2_ranks, tiny_repo)


# -- the fuzz tests -----------------------------------------------------------------------


@FUZZ
@given(req=embed_requests())
# The edges, every run: ids at and past the vocabulary (padding rows, int64 ends), the
# special token both ways, the last position, text bytes and message bytes at their caps.
@example(req=ids(VOCAB_SIZE - 1, 0, 999, 1000, dtype=pb.DTYPE_BFLOAT16))
@example(req=ids(VOCAB_SIZE))
@example(req=ids(5, TABLE_ROWS - 1))
@example(req=ids(2**63 - 1, -(2**63)))
@example(req=pb.EmbedRequest(text="<|endoftext|>", allow_special_tokens=True))
@example(req=pb.EmbedRequest(text="<|endoftext|>"))
@example(req=ids(7, start_position=63, dtype=pb.DTYPE_FLOAT16))
@example(req=ids(7, start_position=64, truncate=pb.TRUNCATE_RIGHT))
@example(req=ids(*range(70), start_position=20, truncate=pb.TRUNCATE_LEFT))
@example(req=ids(*range(49), truncate=pb.TRUNCATE_RIGHT))
@example(req=ids(*range(49)))
@example(req=pb.EmbedRequest(text="é" * 128))  # 256 bytes: at max_text_bytes
@example(req=pb.EmbedRequest(text="é" * 129))
@example(req=pb.EmbedRequest(text="a" * 8189))  # an 8192-byte message: at the cap
@example(req=pb.EmbedRequest(text="a" * 8190))
@example(req=ids(1, model="rope", compose=pb.COMPOSE_POSITION_ONLY))
@example(req=ids(1, model="rope", start_position=63, dtype=pb.DTYPE_BFLOAT16))
@example(req=ids(1, compose=3, dtype=-1, truncate=2**31 - 1))
@example(req=ids(1, model="nope", compose=3))
@example(req=ids(1, version=2))
def test_embed(stub: pb_grpc.EmbeddingServiceStub, oracle: Oracle, req: pb.EmbedRequest) -> None:
    """Embed answers every request with the oracle's status, or its exact rows."""
    outcome = oracle.embed(req)
    event(outcome.code.name)  # --hypothesis-show-statistics: how the examples split
    try:
        answered(stub.Embed(req, timeout=10), req, outcome, oracle)
    except grpc.RpcError as err:
        refused(err, outcome)
    still_serves(stub, oracle)


@FUZZ
@given(req=batch_requests())
@example(req=batch(span(24), span(24, 40), dtype=pb.DTYPE_BFLOAT16))  # 48 tokens: the cap
@example(req=batch(span(24), span(25, 39)))  # 49 in all
@example(req=batch(span(30), span(30, 20), truncate=pb.TRUNCATE_LEFT))  # 30 + 30 after fitting
@example(req=batch(span(3), pb.EmbedInput(text="<|endoftext|> hi", start_position=61),
                   compose=pb.COMPOSE_POSITION_ONLY, allow_special_tokens=True))
@example(req=batch(span(2), pb.EmbedInput(), span(1)))
@example(req=batch())
@example(req=batch(model="rope", compose=pb.COMPOSE_POSITION_ONLY))
def test_embed_batch(stub: pb_grpc.EmbeddingServiceStub, oracle: Oracle,
                     req: pb.EmbedBatchRequest) -> None:
    """EmbedBatch is all or nothing: the oracle's status, or every item's exact rows."""
    outcome = oracle.batch(req)
    event(outcome.code.name)
    try:
        resp = stub.EmbedBatch(req, timeout=10)
    except grpc.RpcError as err:
        refused(err, outcome)
    else:
        assert outcome.code == Code.OK, outcome
        lengths = [len(s.ids) for s in outcome.seqs]
        assert list(resp.offsets) == [sum(lengths[:i]) for i in range(len(lengths) + 1)]
        assert [(list(it.token_ids), it.start_position, it.truncated_tokens,
                 list(it.untrained_token_indices)) for it in resp.items] == [
            (list(s.ids), s.start, s.truncated, s.untrained) for s in outcome.seqs]
        assert (resp.model, resp.version, resp.checkpoint_id, resp.request_id) == (
            outcome.model, VERSION, oracle.checkpoint_ids[outcome.model], req.request_id)
        assert list(resp.embeddings.shape) == [sum(lengths), DIM]
        assert resp.embeddings.dtype == req.dtype
        assert resp.embeddings.data == b"".join(
            wire_bytes(oracle.rows(outcome.model, s, req.compose), req.dtype)
            for s in outcome.seqs)
    still_serves(stub, oracle)


# Requests over the receive cap are refused by gRPC core, which ends the whole stream at
# once (answers before it may be lost): streams here stay under the cap.
@FUZZ
@given(reqs=st.lists(embed_requests(clean=30, huge=500).filter(
    lambda r: r.ByteSize() <= MAX_MESSAGE_BYTES), max_size=6))
@example(reqs=[])
@example(reqs=[ids(1, request_id="a"), ids(2, 3, start_position=62, dtype=pb.DTYPE_FLOAT16),
               ids(4, VOCAB_SIZE), ids(5)])
@example(reqs=[ids(1, model="rope"), ids(1, model="rope", compose=pb.COMPOSE_POSITION_ONLY),
               ids(2)])
def test_embed_stream(stub: pb_grpc.EmbeddingServiceStub, oracle: Oracle,
                      reqs: list[pb.EmbedRequest]) -> None:
    """EmbedStream answers in order up to the first bad request, then ends with its status."""
    want, end = oracle.stream(reqs)
    event(f"{len(want)} answered, then {end.code.name}")
    got: list[pb.EmbedResponse] = []
    try:
        for resp in stub.EmbedStream(iter(reqs), timeout=10):
            got.append(resp)
    except grpc.RpcError as err:
        refused(err, end)
    else:
        assert end.code == Code.OK, end
    assert len(got) == len(want)  # in order: each answer checked against its own request
    for resp, req, outcome in zip(got, reqs, want):
        answered(resp, req, outcome, oracle)
    still_serves(stub, oracle)


@FUZZ
@given(reqs=st.lists(embed_requests(huge=100), min_size=2, max_size=8))
def test_embed_concurrent(stub: pb_grpc.EmbeddingServiceStub, oracle: Oracle,
                          reqs: list[pb.EmbedRequest]) -> None:
    """Requests in flight together share batches (mixed models, dtypes, composes, lengths):
    each still gets exactly its own answer."""
    futures = [stub.Embed.future(req, timeout=10) for req in reqs]
    for future, req in zip(futures, reqs):
        outcome = oracle.embed(req)
        try:
            answered(future.result(), req, outcome, oracle)
        except grpc.RpcError as err:
            refused(err, outcome)
    still_serves(stub, oracle)


DECODE_ERROR = "Error parsing message with type 'embedding.v1.{}': {}"


@FUZZ
@given(raw=st.builds(lambda base, fields: base + b"".join(fields),  # concatenation merges
                     st.just(b"") | embed_requests(huge=100).map(pb.EmbedRequest.SerializeToString),
                     st.lists(wire_field(), max_size=4)))
def test_embed_raw_bytes(channel: grpc.Channel, stub: pb_grpc.EmbeddingServiceStub,
                         oracle: Oracle, raw: bytes) -> None:
    """Whatever protobuf makes of the bytes (the same upb parser as the server's) is what
    the server must answer; bytes it cannot parse are INVALID_ARGUMENT with the parser's
    message (see the UTF-8 test)."""
    req: pb.EmbedRequest | None = None
    try:
        req = pb.EmbedRequest.FromString(raw)
    except DecodeError as e:
        outcome = Outcome(Code.INVALID_ARGUMENT, (str(e),))
    else:
        outcome = oracle.embed(req, wire_size=len(raw))
    event(outcome.code.name)
    try:
        resp = raw_rpc(channel, "Embed")(raw, timeout=10)
    except grpc.RpcError as err:
        refused(err, outcome)
    else:
        assert req is not None, outcome
        answered(pb.EmbedResponse.FromString(resp), req, outcome, oracle)
    still_serves(stub, oracle)


@pytest.mark.parametrize("bad", BAD_UTF8)
@pytest.mark.parametrize(("method", "message", "build"), [
    ("Embed", "EmbedRequest", lambda s: tagged(1, s)),  # model
    ("Embed", "EmbedRequest", lambda s: tagged(3, s)),  # text
    ("Embed", "EmbedRequest", lambda s: tagged(10, s)),  # request_id
    ("EmbedBatch", "EmbedBatchRequest", lambda s: tagged(3, tagged(1, s))),  # inputs[0].text
])
def test_invalid_utf8_in_a_string_field_is_invalid_argument(
        channel: grpc.Channel, stub: pb_grpc.EmbeddingServiceStub, oracle: Oracle, bad: bytes,
        method: str, message: str, build: Callable[[bytes], bytes]) -> None:
    """proto3 strings must be UTF-8: upb refuses the request while parsing it. The
    server's request parser turns that into INVALID_ARGUMENT with the parser's message
    (grpc.aio alone would answer UNKNOWN, or hang a stream). The server keeps serving."""
    with pytest.raises(grpc.RpcError) as info:
        raw_rpc(channel, method)(build(bad), timeout=10)
    assert info.value.code() == Code.INVALID_ARGUMENT
    assert info.value.details() == DECODE_ERROR.format(message, "String field had bad UTF-8")
    still_serves(stub, oracle)


def test_a_lone_surrogate_cannot_leave_the_python_client() -> None:
    """Why the UTF-8 tests hand-build their bytes: protobuf will not encode a surrogate."""
    with pytest.raises(UnicodeEncodeError):
        pb.EmbedRequest(text="\ud800").SerializeToString()


# -- cost: server time per request byte stays bounded, whatever the request declares -------

SECONDS_FLOOR = 0.05  # any request: scheduling noise on a loaded CI machine, GC
SECONDS_PER_BYTE = 2e-6  # ~3x tokenizing; a per-declared-item loop is 1000s of times more
_DIMS = st.integers(-(2**40), 2**40) | st.sampled_from([0, 1, 2, 10**6, 2**31, 2**62, -1])


@st.composite
def declared_requests(draw: st.DrawFn) -> tuple[str, Message]:
    """A request whose declared size (shapes, counts) has nothing to do with what it
    carries: OIP ``input_ids`` / ``text`` with wild shapes and a few bytes of contents, or
    an EmbedBatch of many empty inputs."""
    kind = draw(st.sampled_from(["input_ids", "text", "batch"]))
    if kind == "batch":
        n = draw(st.integers(0, 3000) | st.sampled_from([0, 1, 4, 5, 3000]))
        return "EmbedBatch", pb.EmbedBatchRequest(inputs=[pb.EmbedInput()] * n)
    tensor = oip.ModelInferRequest.InferInputTensor(
        name=kind, datatype=draw(st.sampled_from(["INT64", "INT32", "BYTES"])),
        shape=draw(st.lists(_DIMS, min_size=0, max_size=3)))
    request = oip.ModelInferRequest(model_name="tiny", inputs=[tensor])
    if draw(st.booleans()):
        request.raw_input_contents.append(draw(st.binary(max_size=64)))
    elif kind == "input_ids":
        tensor.contents.int64_contents.extend(draw(st.lists(IDS, max_size=8)))
    else:
        tensor.contents.bytes_contents.extend(draw(st.lists(st.binary(max_size=8),
                                                            max_size=4)))
    return "ModelInfer", request


def _server_seconds(handle: ServerHandle, rpc: str) -> float:
    return sum(child.sum for labels, child  # type: ignore[attr-defined]
               in handle.server.metrics.request_duration._children.items() if labels[0] == rpc)


@FUZZ
@given(case=declared_requests())
@example(case=("ModelInfer", oip.ModelInferRequest(model_name="tiny", inputs=[
    oip.ModelInferRequest.InferInputTensor(name="input_ids", datatype="INT64",
                                           shape=[10**9, 0])])))
@example(case=("EmbedBatch", pb.EmbedBatchRequest(inputs=[pb.EmbedInput()] * 4000)))
def test_cost_per_request_byte_is_bounded(fuzz_server: ServerHandle, channel: grpc.Channel,
                                          stub: pb_grpc.EmbeddingServiceStub, oracle: Oracle,
                                          case: tuple[str, Message]) -> None:
    """What the server spends in Python on a request is bounded by the bytes it was sent,
    not by the sizes it declares (B = 10**9 sequences of nothing costs what B = 1 does)."""
    rpc, request = case
    path = ("/inference.GRPCInferenceService/" if rpc == "ModelInfer" else SERVICE) + rpc
    call = channel.unary_unary(path, request_serializer=lambda m: m.SerializeToString(),
                               response_deserializer=lambda b: b)
    size = request.ByteSize()
    bound = SECONDS_FLOOR + size * SECONDS_PER_BYTE
    spent = []
    for _ in range(3):  # a real cost repeats; a stall of this loaded machine does not
        before = _server_seconds(fuzz_server, rpc)
        code, details = Code.OK, ""
        try:
            call(request, timeout=10)
        except grpc.RpcError as err:
            code, details = err.code(), err.details()
        assert code not in (Code.INTERNAL, Code.UNKNOWN), details
        spent.append(_server_seconds(fuzz_server, rpc) - before)
        if spent[-1] <= bound:
            break
    event(f"{rpc}: {'under' if min(spent) < 1e-3 else 'over'} 1 ms")
    assert min(spent) <= bound, (spent, size)
    still_serves(stub, oracle)


# -- regressions the fuzzing found ----------------------------------------------------------


def test_stream_with_an_undecodable_request_ends_with_its_status(
        channel: grpc.Channel, stub: pb_grpc.EmbeddingServiceStub, oracle: Oracle) -> None:
    """A request the server cannot parse must end the stream like any bad request: the
    answers before it, then its own status (what Embed answers for the same bytes).

    Found by fuzzing: EmbedStream's reader task dies with the DecodeError raised by the
    request iterator and the writer waits on its window forever; the stream hangs until the
    client's deadline (forever without one), holding the RPC open on the server.
    """
    bad = tagged(3, b"\xff")
    with pytest.raises(grpc.RpcError) as alone:
        raw_rpc(channel, "Embed")(bad, timeout=10)
    good = [pb.EmbedRequest(token_ids=pb.TokenIds(ids=[i, 7]), request_id=f"r{i}")
            for i in range(2)]
    stream = channel.stream_stream(SERVICE + "EmbedStream", request_serializer=lambda b: b,
                                   response_deserializer=pb.EmbedResponse.FromString)
    got: list[pb.EmbedResponse] = []

    def read_all() -> None:
        sent = [r.SerializeToString() for r in good] + [bad, GOOD.SerializeToString()]
        got.extend(stream(iter(sent), timeout=3))

    with pytest.raises(grpc.RpcError) as info:
        read_all()
    assert [r.request_id for r in got] == ["r0", "r1"]
    for resp, req in zip(got, good):
        answered(resp, req, oracle.embed(req), oracle)
    assert (info.value.code(), info.value.details()) == (alone.value.code(),
                                                         alone.value.details())
    still_serves(stub, oracle)


def test_batch_position_errors_name_the_input(stub: pb_grpc.EmbeddingServiceStub) -> None:
    """Status messages name the field: in a batch, which input's start_position is wrong.

    Found by fuzzing: the code is right (INVALID_ARGUMENT) but the message says only
    "start_position=64 ..." or "start_position (62) + T (3) ...", not inputs[1].
    """
    for bad in (pb.EmbedInput(token_ids=pb.TokenIds(ids=[1]), start_position=64),
                pb.EmbedInput(token_ids=pb.TokenIds(ids=[1, 2, 3]), start_position=62)):
        req = pb.EmbedBatchRequest(inputs=[pb.EmbedInput(text="ok"), bad])
        with pytest.raises(grpc.RpcError) as info:
            stub.EmbedBatch(req, timeout=10)
        assert info.value.code() == Code.INVALID_ARGUMENT
        assert "inputs[1]" in info.value.details(), info.value.details()


def test_an_output_without_a_region_name_is_invalid(
        fuzz_server: ServerHandle, stub: pb_grpc.EmbeddingServiceStub, oracle: Oracle) -> None:
    """``output {}`` (set, with an empty region name) is INVALID_ARGUMENT naming the field,
    whatever regions are registered, and writes nowhere.

    Found while fuzzing the new ``output`` field: the registry's ``regions("")`` means "every
    region" and ``rows()`` unpacks that as one, so with no region registered the request is
    INTERNAL (a ValueError), and with exactly one its rows silently go into that region.
    """
    requests = [(stub.Embed, ids(1, 2, output=pb.SharedMemoryOutput())),
                (stub.EmbedBatch, batch(span(2), output=pb.SharedMemoryOutput()))]

    def refused_everywhere() -> None:
        for rpc, req in requests:
            with pytest.raises(grpc.RpcError) as info:
                rpc(req, timeout=10)
            assert info.value.code() == Code.INVALID_ARGUMENT, info.value.details()
            assert "output.region" in info.value.details()

    refused_everywhere()  # no region registered
    with (SharedMemoryRegion("fuzz-only", 4096) as region,
          EmbeddingClient(fuzz_server.target) as client):
        client.register_shared_memory(region)
        try:
            before = bytes(region.mapping)
            refused_everywhere()  # one region registered: it must not be the target
            assert bytes(region.mapping) == before
        finally:
            client.unregister_shared_memory(region.name)
    still_serves(stub, oracle)

"""Responses laid out in place (``MessageBuffer``) parse as the ordinary protobuf message."""

from __future__ import annotations

import pytest
import torch
from google.protobuf.message import Message

from genproto.embedding.v1 import embedding_pb2 as pb
from service.dtypes import BY_WIRE
from service.engine.batcher import Timing
from service.engine.message import (
    TIMING_BYTES,
    MessageBuffer,
    message_head,
    timing_field,
    timing_tag,
)


def fill(fields: Message, shape: tuple[int, int], dtype: int, rows: torch.Tensor,
         timing: tuple[int, int, int, int]) -> bytes:
    """The response the native reply lays out: head, rows, the other fields, timing."""
    buffer = MessageBuffer(message_head(*shape, dtype), shape, BY_WIRE[dtype].torch,
                           fields.SerializeToString(), timing_tag(fields.DESCRIPTOR))
    buffer.rows.copy_(rows)
    return buffer.finish(Timing(*timing))


@pytest.mark.parametrize("dtype", [pb.DTYPE_FLOAT32, pb.DTYPE_FLOAT16, pb.DTYPE_BFLOAT16])
@pytest.mark.parametrize("T", [1, 3, 300])  # 300 x 7 x 4 B: a multi-byte length varint
def test_reply_equals_generic_serialisation(dtype: int, T: int) -> None:
    rows = torch.randn(T, 7, generator=torch.Generator().manual_seed(T))  # fp32 sum
    fields = pb.EmbedResponse(token_ids=list(range(T)), model="m", version=3, request_id="r")
    timing = (5, 0, 2**40 + 3, 2**64 - 1)  # every size of varint, up to the largest
    wire = rows.to(BY_WIRE[dtype].torch)  # what the client must see: the cast of the sum
    data = wire.view(torch.int16 if wire.dtype != torch.float32 else torch.float32)
    generic = pb.EmbedResponse()
    generic.CopyFrom(fields)
    generic.embeddings.shape.extend([T, 7])
    generic.embeddings.dtype = dtype  # type: ignore[assignment]
    generic.embeddings.data = data.numpy().tobytes()
    generic.timing.queue_ns, generic.timing.tokenize_ns = timing[0], timing[1]
    generic.timing.compute_ns, generic.timing.total_ns = timing[2], timing[3]
    encoded = fill(fields, (T, 7), dtype, wire, timing)
    assert pb.EmbedResponse.FromString(encoded) == generic
    # Every timing varint is padded to 10 bytes (tokenize_ns=0 is written too).
    canonical_timing = len(generic.timing.SerializeToString()) + 2
    assert len(encoded) == (len(generic.SerializeToString()) - canonical_timing
                            + TIMING_BYTES)


def test_timing_field_pads_each_varint_to_ten_bytes() -> None:
    assert timing_field(0x22, 0, 300, 2**64 - 1, 1) == (
        b"\x22\x2c"  # tag, length 44
        + b"\x08" + b"\x80" * 9 + b"\x00"  # 0
        + b"\x10" + b"\xac\x82" + b"\x80" * 7 + b"\x00"  # 300
        + b"\x18" + b"\xff" * 9 + b"\x01"  # 2**64 - 1
        + b"\x20" + b"\x81" + b"\x80" * 8 + b"\x00")  # 1


def test_batch_reply_round_trip() -> None:
    rows = torch.arange(12, dtype=torch.float32).view(4, 3)
    fields = pb.EmbedBatchResponse(offsets=[0, 1, 4], model="m")
    parsed = pb.EmbedBatchResponse.FromString(
        fill(fields, (4, 3), pb.DTYPE_FLOAT32, rows, (1, 2, 3, 4)))
    assert list(parsed.offsets) == [0, 1, 4]
    assert list(parsed.embeddings.shape) == [4, 3]
    assert parsed.embeddings.data == rows.numpy().tobytes()
    assert (parsed.timing.queue_ns, parsed.timing.total_ns) == (1, 4)


@pytest.mark.parametrize("dtype", [pb.DTYPE_FLOAT32, pb.DTYPE_FLOAT16, pb.DTYPE_BFLOAT16])
@pytest.mark.parametrize("spans", [[(0, 5)], [(3, 4)], [(0, 2), (1, 3)]])
def test_rows_written_by_address_equal_the_rows_written_through_the_tensor(
        dtype: int, spans: list[tuple[int, int]]) -> None:
    """``MessageBuffer.lookup`` (the kernel straight into the response bytes) lays out the
    same answer as the lookup into its ``rows`` tensor on torch's path; once the bytes are
    handed over, neither way can write them."""
    from service.engine.tables import COMPOSE_TOKEN_PLUS_POSITION, EmbeddingTables

    g = torch.Generator().manual_seed(len(spans))
    token, position = torch.randn(50, 7, generator=g) * 40, torch.randn(9, 7, generator=g)
    fast = EmbeddingTables(token, position, torch.device("cpu"))
    slow = EmbeddingTables(token, position, torch.device("cpu"))
    slow._kernel = None
    assert fast._kernel is not None, "the kernel must build here (gcc is on this machine)"
    N = sum(t for _, t in spans)
    ids = torch.randint(0, 50, (N,), generator=g).numpy()  # the engine's ids
    fields = pb.EmbedResponse(model="m", request_id="r")
    answers = []
    for tables in (fast, slow):
        buffer = MessageBuffer(message_head(N, 7, dtype), (N, 7), BY_WIRE[dtype].torch,
                               fields.SerializeToString(), timing_tag(fields.DESCRIPTOR))
        if not buffer.lookup(tables, ids, spans, COMPOSE_TOKEN_PLUS_POSITION):
            assert tables is slow  # torch's path: no kernel, the rows tensor instead
            tables.embed_into([(ids, spans, buffer.rows)], COMPOSE_TOKEN_PLUS_POSITION)
        answers.append(buffer.finish(Timing(1, 2, 3, 4)))
        assert not buffer.lookup(fast, ids, spans, COMPOSE_TOKEN_PLUS_POSITION)
        with pytest.raises(RuntimeError):
            buffer.rows
    assert answers[0] == answers[1]
    parsed = pb.EmbedResponse.FromString(answers[0])
    expected = fast.token_table[ids] + torch.cat([position[s: s + t] for s, t in spans])
    wire = torch.frombuffer(bytearray(parsed.embeddings.data), dtype=BY_WIRE[dtype].torch)
    assert torch.equal(wire.view(N, 7), expected.to(BY_WIRE[dtype].torch))

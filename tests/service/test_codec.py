"""The spliced response encoding parses as the ordinary protobuf message, byte for byte."""

from __future__ import annotations

import pytest
import torch

from client._gen.embedding.v1 import embedding_pb2 as pb
from service import codec


@pytest.mark.parametrize("dtype", [pb.DTYPE_FLOAT32, pb.DTYPE_FLOAT16, pb.DTYPE_BFLOAT16])
@pytest.mark.parametrize("T", [1, 3, 300])  # 300 x 7 x 4 B: a multi-byte length varint
def test_spliced_response_equals_generic_serialisation(dtype: int, T: int) -> None:
    rows = torch.randn(T, 7, generator=torch.Generator().manual_seed(T))  # fp32 sum
    fields = pb.EmbedResponse(token_ids=list(range(T)), model="m", version=3, request_id="r",
                              timing=pb.Timing(total_ns=123456789))
    wire = rows.to(codec.DTYPES[dtype])  # what the client must see: the cast of the sum
    data = wire.view(torch.int16 if wire.dtype != torch.float32 else torch.float32)
    generic = pb.EmbedResponse()
    generic.CopyFrom(fields)
    generic.embeddings.shape.extend([T, 7])
    generic.embeddings.dtype = dtype  # type: ignore[assignment]
    generic.embeddings.data = data.numpy().tobytes()
    spliced = codec.encode_embed_response(rows, dtype, fields)
    assert pb.EmbedResponse.FromString(spliced) == generic
    assert len(spliced) == len(generic.SerializeToString())


def test_batch_response_round_trip() -> None:
    rows = torch.arange(12, dtype=torch.float32).view(4, 3)
    fields = pb.EmbedBatchResponse(offsets=[0, 1, 4], model="m")
    parsed = pb.EmbedBatchResponse.FromString(
        codec.encode_batch_response(rows, pb.DTYPE_FLOAT32, fields))
    assert list(parsed.offsets) == [0, 1, 4]
    assert list(parsed.embeddings.shape) == [4, 3]
    assert parsed.embeddings.data == rows.numpy().tobytes()

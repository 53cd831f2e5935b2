"""Item 6 (range): float16 output of a value past its range is refused, never a silent inf.

At load the server records each table's largest |value|; a request whose output dtype
cannot hold max |token| + max |position| (per compose) is FAILED_PRECONDITION naming the
model and the dtype, before any work. Model "big" has a token row at 60000 (within
float16's 65504) and position rows at 10000: the sum, 70000, is not.
"""

from __future__ import annotations

import grpc
import numpy as np
import pytest

from genproto.embedding.v1 import embedding_pb2 as pb
from genproto.embedding.v1 import embedding_pb2_grpc as pb_grpc
from genproto.inference.v2 import grpc_service_pb2 as oip
from genproto.inference.v2 import grpc_service_pb2_grpc as oip_grpc
from tests.security.conftest import AUTH, BIG_POSITION, BIG_TOKEN, still_serves

Code = grpc.StatusCode
HOT = [5, 7]  # id 5 carries the 60000


def embed(stub: pb_grpc.EmbeddingServiceStub, **fields: object) -> pb.EmbedResponse:
    request = pb.EmbedRequest(model="big", token_ids=pb.TokenIds(ids=HOT), **fields)  # type: ignore[arg-type]
    return stub.Embed(request, metadata=AUTH, timeout=10)  # type: ignore[no-any-return]


def test_float16_past_its_range_is_refused(native: pb_grpc.EmbeddingServiceStub) -> None:
    with pytest.raises(grpc.RpcError) as info:
        embed(native, dtype=pb.DTYPE_FLOAT16)
    assert info.value.code() == Code.FAILED_PRECONDITION
    assert info.value.details() == (
        "dtype=DTYPE_FLOAT16 cannot hold the rows of model 'big': with "
        "compose=COMPOSE_TOKEN_PLUS_POSITION values reach |70000| > 65504, the largest "
        "float16; ask for float32 (or bfloat16)")
    still_serves(native)


@pytest.mark.parametrize(("compose", "dtype"), [
    (pb.COMPOSE_TOKEN_PLUS_POSITION, pb.DTYPE_FLOAT32),
    (pb.COMPOSE_TOKEN_PLUS_POSITION, pb.DTYPE_BFLOAT16),
    (pb.COMPOSE_TOKEN_ONLY, pb.DTYPE_FLOAT16),  # 60000 alone fits
    (pb.COMPOSE_POSITION_ONLY, pb.DTYPE_FLOAT16),
])
def test_what_fits_is_served_finite(native: pb_grpc.EmbeddingServiceStub, compose: int,
                                    dtype: int) -> None:
    resp = embed(native, compose=compose, dtype=dtype)
    wire = {pb.DTYPE_FLOAT32: "<f4", pb.DTYPE_FLOAT16: "<f2", pb.DTYPE_BFLOAT16: "<u2"}[dtype]
    rows = np.frombuffer(resp.embeddings.data, wire)
    if dtype == pb.DTYPE_BFLOAT16:  # widen the bit pattern to fp32
        rows = (rows.astype(np.uint32) << 16).view(np.float32)
    assert np.isfinite(rows).all()
    first = float(rows.reshape(len(HOT), -1)[0, 0])
    expected = {pb.COMPOSE_TOKEN_PLUS_POSITION: BIG_TOKEN + BIG_POSITION,
                pb.COMPOSE_TOKEN_ONLY: BIG_TOKEN, pb.COMPOSE_POSITION_ONLY: BIG_POSITION}
    assert first == pytest.approx(expected[compose], rel=1e-2)


def test_the_oip_face_refuses_fp16_the_same_way(
        inference: oip_grpc.GRPCInferenceServiceStub) -> None:
    request = oip.ModelInferRequest(model_name="big", inputs=[
        oip.ModelInferRequest.InferInputTensor(
            name="input_ids", datatype="INT64", shape=[1, 2],
            contents=oip.InferTensorContents(int64_contents=HOT))])
    request.parameters["datatype"].string_param = "FP16"
    with pytest.raises(grpc.RpcError) as info:
        inference.ModelInfer(request, metadata=AUTH, timeout=10)
    assert info.value.code() == Code.FAILED_PRECONDITION
    assert "'big'" in info.value.details()
    assert "DTYPE_FLOAT16" in info.value.details()


def test_ordinary_models_still_serve_float16(native: pb_grpc.EmbeddingServiceStub) -> None:
    resp = native.Embed(pb.EmbedRequest(text="hello world", dtype=pb.DTYPE_FLOAT16),
                        metadata=AUTH, timeout=10)
    assert np.isfinite(np.frombuffer(resp.embeddings.data, "<f2")).all()

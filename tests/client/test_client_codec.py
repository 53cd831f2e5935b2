"""Request building and tensor decoding, without a server."""

from __future__ import annotations

import grpc
import numpy as np
import pytest
import torch

from client import EmbeddingError, decode_tensor, embed_request
from client.codec import batch_request, decode_batch, stream_request
from genproto.embedding.v1 import embedding_pb2 as pb


def _tensor(array: np.ndarray, dtype: int) -> pb.Tensor:
    return pb.Tensor(shape=list(array.shape), dtype=dtype, data=array.tobytes())


def test_float32_is_a_zero_copy_read_only_view() -> None:
    src = np.arange(6, dtype="<f4").reshape(2, 3) - 2.5
    t = _tensor(src, pb.DTYPE_FLOAT32)
    out = decode_tensor(t)
    assert out.shape == (2, 3)
    assert out.dtype == np.dtype("<f4")
    assert out.tolist() == [[-2.5, -1.5, -0.5], [0.5, 1.5, 2.5]]
    assert not out.flags.writeable
    assert not out.flags.owndata  # a view of the message bytes, not a copy
    with pytest.raises(ValueError):
        out[0, 0] = 1.0


def test_float16_decodes_little_endian_halves() -> None:
    # 0x3C00 = 1.0, 0xC000 = -2.0, 0x7BFF = 65504 (largest half), 0x0001 = 2**-24.
    data = np.array([0x3C00, 0xC000, 0x7BFF, 0x0001], dtype="<u2").tobytes()
    out = decode_tensor(pb.Tensor(shape=[1, 4], dtype=pb.DTYPE_FLOAT16, data=data))
    assert out.dtype == np.dtype("<f2")
    assert out.tolist() == [[1.0, -2.0, 65504.0, 2.0**-24]]


def test_bfloat16_widens_every_bit_pattern_exactly_like_torch() -> None:
    bits = np.arange(1 << 16, dtype="<u2").reshape(256, 256)
    out = decode_tensor(_tensor(bits, pb.DTYPE_BFLOAT16))
    assert out.dtype == np.dtype("<f4")
    assert not out.flags.writeable
    want = torch.from_numpy(bits.astype(np.int16)).view(torch.bfloat16).float().numpy()
    finite = ~np.isnan(want)
    assert finite.sum() == 65536 - 2 * 127  # NaNs: exponent all ones, mantissa != 0
    assert np.array_equal(out.view("<u4")[finite], want.view("<u4")[finite])
    assert np.isnan(out[~finite]).all()
    assert np.array_equal(out.view("<u4"), bits.astype("<u4") << 16)  # payloads kept too


def test_bfloat16_raw_bits_on_request() -> None:
    bits = np.array([[0x3F80, 0xC000]], dtype="<u2")  # 1.0, -2.0
    raw = decode_tensor(_tensor(bits, pb.DTYPE_BFLOAT16), raw_bfloat16=True)
    assert raw.dtype == np.dtype("<u2")
    assert raw.tolist() == [[0x3F80, 0xC000]]
    widened = decode_tensor(_tensor(bits, pb.DTYPE_BFLOAT16))
    assert widened.tolist() == [[1.0, -2.0]]


def test_wrong_byte_count_is_an_internal_error() -> None:
    t = pb.Tensor(shape=[2, 3], dtype=pb.DTYPE_FLOAT32, data=b"\0" * 20)
    with pytest.raises(EmbeddingError) as info:
        decode_tensor(t)
    assert info.value.code == grpc.StatusCode.INTERNAL
    assert str(info.value) == "INTERNAL: tensor of shape (2, 3) float32 needs 24 bytes, got 20"


def test_embed_request_maps_names_to_enums() -> None:
    req = embed_request("hi", model="m", version=3, start_position=7, compose="token",
                        dtype="bfloat16", truncate="left", allow_special_tokens=True,
                        request_id="r1")
    assert req.WhichOneof("input") == "text"
    assert (req.text, req.model, req.version, req.start_position) == ("hi", "m", 3, 7)
    assert req.compose == pb.COMPOSE_TOKEN_ONLY
    assert req.dtype == pb.DTYPE_BFLOAT16
    assert req.truncate == pb.TRUNCATE_LEFT
    assert req.allow_special_tokens
    assert req.request_id == "r1"
    ids = embed_request(ids=np.array([5, 6]), compose=pb.COMPOSE_POSITION_ONLY)
    assert ids.WhichOneof("input") == "token_ids"
    assert list(ids.token_ids.ids) == [5, 6]
    assert ids.compose == pb.COMPOSE_POSITION_ONLY
    assert embed_request(ids=[]).WhichOneof("input") == "token_ids"  # empty is the server's call


def test_embed_request_rejects_bad_arguments() -> None:
    with pytest.raises(ValueError, match="exactly one of text or ids"):
        embed_request()
    with pytest.raises(ValueError, match="exactly one of text or ids"):
        embed_request("a", [1])
    with pytest.raises(ValueError) as info:
        embed_request("a", compose="sum")
    assert str(info.value) == (
        "compose 'sum': expected one of token+position, token_plus_position, "
        "COMPOSE_TOKEN_PLUS_POSITION, token, token_only, COMPOSE_TOKEN_ONLY, position, "
        "position_only, COMPOSE_POSITION_ONLY")
    with pytest.raises(ValueError, match="dtype 'fp8'"):
        embed_request("a", dtype="fp8")
    with pytest.raises(ValueError, match="truncate 'middle'"):
        embed_request("a", truncate="middle")
    with pytest.raises(TypeError) as type_info:
        embed_request("a", dtyp="float16")  # type: ignore[call-arg]
    assert str(type_info.value) == (
        "unknown option 'dtyp'; known options: add_special_tokens, allow_special_tokens, "
        "compose, dtype, model, request_id, start_position, truncate, version")
    with pytest.raises(TypeError, match=r"unknown option 'start_position';"):
        batch_request(["a"], 0, start_position=3)  # type: ignore[call-arg]


def test_batch_request_and_stream_items() -> None:
    req = batch_request(["a", [1, 2]], [0, 5], dtype="float16", request_id="b")
    assert [i.WhichOneof("input") for i in req.inputs] == ["text", "token_ids"]
    assert [i.start_position for i in req.inputs] == [0, 5]
    assert (req.dtype, req.request_id) == (pb.DTYPE_FLOAT16, "b")
    assert [i.start_position for i in batch_request(["a", "b"], 3).inputs] == [3, 3]
    with pytest.raises(ValueError, match="1 start_positions for 2 inputs"):
        batch_request(["a", "b"], [0])
    ready = pb.EmbedRequest(text="x", dtype=pb.DTYPE_FLOAT16)
    assert stream_request(ready, dtype="bfloat16") is ready
    assert stream_request("y", dtype="bfloat16").dtype == pb.DTYPE_BFLOAT16
    assert list(stream_request([9]).token_ids.ids) == [9]


def test_decode_batch_splits_into_views_of_one_array() -> None:
    packed = np.arange(12, dtype="<f4").reshape(6, 2)
    resp = pb.EmbedBatchResponse(embeddings=_tensor(packed, pb.DTYPE_FLOAT32),
                                 offsets=[0, 1, 1, 6], model="m", version=2,
                                 items=[pb.BatchItem(token_ids=[7]), pb.BatchItem(),
                                        pb.BatchItem(token_ids=[1, 2, 3, 4, 5],
                                                     start_position=4)])
    out = decode_batch(resp)
    assert [e.array.shape for e in out] == [(1, 2), (0, 2), (5, 2)]
    assert out[2].array.tolist() == packed[1:].tolist()
    assert out[0].array.base is out[2].array.base  # one buffer, no copies
    assert [e.token_ids for e in out] == [[7], [], [1, 2, 3, 4, 5]]
    assert out[2].start_position == 4
    assert {(e.model, e.version, e.wire_dtype) for e in out} == {("m", 2, "float32")}
    bad = pb.EmbedBatchResponse(embeddings=resp.embeddings, offsets=[0, 6], items=[])
    with pytest.raises(EmbeddingError, match=r"offsets \[0, 6\] do not split 6 rows into 0"):
        decode_batch(bad)


def test_error_wraps_code_and_details() -> None:
    err = EmbeddingError(grpc.StatusCode.NOT_FOUND, "model 'x' is not loaded")
    assert str(err) == "NOT_FOUND: model 'x' is not loaded"
    assert not err.unreachable
    refused = EmbeddingError(grpc.StatusCode.UNAVAILABLE,
                             "failed to connect to all addresses; last error: UNKNOWN: "
                             "ipv4:127.0.0.1:1: Failed to connect to remote host: "
                             "Connection refused")
    assert refused.unreachable
    draining = EmbeddingError(grpc.StatusCode.UNAVAILABLE, "server is draining")
    assert not draining.unreachable

"""Wire encoding of embedding responses: the tensor bytes are copied exactly once.

The generic path (set ``Tensor.data``, then ``SerializeToString``) copies a [T, C] payload
three times in Python before gRPC copies it again into its own slice. Protobuf messages
are a concatenation of fields in any order, so we serialise the small fields with the
generated code and splice the tensor in ourselves:

    EmbedResponse = 0x0a len(Tensor) [Tensor header: shape, dtype] 0x1a len(data) DATA
                    [every other field, serialised normally]

``b"".join`` takes the table output through the buffer protocol, so DATA is written into
the response bytes by one memcpy. Copies per response, end to end in the server:
  1. gather+add (+cast) writes the batch output into a reused scratch buffer;
  2. ``join`` copies this response's rows into the bytes object handed to gRPC;
  3. gRPC core copies those bytes into its send slice (outside our control).
The transport ceiling (a precomputed message) pays 2 and 3 as well.
"""

from __future__ import annotations

import numpy as np
import torch

from client._gen.embedding.v1 import embedding_pb2 as pb

__all__ = ["DTYPES", "DTYPE_NAMES", "encode_batch_response", "encode_embed_response",
           "identity", "tensor_bytes"]

# Output dtype per proto enum value. bfloat16 travels as its raw 2-byte bit pattern.
DTYPES: dict[int, torch.dtype] = {
    pb.DTYPE_FLOAT32: torch.float32,
    pb.DTYPE_FLOAT16: torch.float16,
    pb.DTYPE_BFLOAT16: torch.bfloat16,
}
DTYPE_NAMES: dict[int, str] = {pb.DTYPE_FLOAT32: "float32", pb.DTYPE_FLOAT16: "float16",
                               pb.DTYPE_BFLOAT16: "bfloat16"}
_TAG_EMBEDDINGS = b"\x0a"  # field 1, wire type 2 (length-delimited), in both responses
_TAG_DATA = b"\x1a"  # Tensor.data: field 3, wire type 2


def _varint(n: int) -> bytes:
    out = bytearray()
    while True:
        byte = n & 0x7F
        n >>= 7
        if n:
            out.append(byte | 0x80)
        else:
            out.append(byte)
            return bytes(out)


def tensor_bytes(rows: torch.Tensor) -> memoryview:
    """A zero-copy little-endian byte view of contiguous CPU rows (bf16 as raw bits)."""
    if rows.dtype == torch.bfloat16:
        rows = rows.view(torch.int16)  # numpy has no bfloat16; the bits are what we send
    arr = rows.numpy()
    if arr.dtype.byteorder == ">":  # never on x86/ARM; keeps the wire little-endian anyway
        arr = arr.astype(arr.dtype.newbyteorder("<"))
    return memoryview(np.ascontiguousarray(arr)).cast("B")  # type: ignore[arg-type]


def _splice(rows: torch.Tensor, dtype: int, rest: bytes) -> bytes:
    data = tensor_bytes(rows)
    header = pb.Tensor(shape=list(rows.shape), dtype=dtype).SerializeToString()  # type: ignore[arg-type]
    data_len = _varint(data.nbytes)
    tensor_len = len(header) + 1 + len(data_len) + data.nbytes
    return b"".join((_TAG_EMBEDDINGS, _varint(tensor_len), header, _TAG_DATA, data_len,
                     data, rest))


def encode_embed_response(rows: torch.Tensor, dtype: int, response: pb.EmbedResponse) -> bytes:
    """Serialised EmbedResponse: ``response`` (embeddings unset) plus ``rows`` as [T, C]."""
    return _splice(rows, dtype, response.SerializeToString())


def encode_batch_response(rows: torch.Tensor, dtype: int,
                          response: pb.EmbedBatchResponse) -> bytes:
    """Serialised EmbedBatchResponse: ``response`` plus the packed [ΣT, C] rows."""
    return _splice(rows, dtype, response.SerializeToString())


def identity(data: bytes) -> bytes:
    """Response serializer for handlers that return already-encoded bytes."""
    return data

"""Wire encoding of embedding responses: the tensor is copied once, without the GIL.

The generic path (set ``Tensor.data``, then ``SerializeToString``) copies a [T, C] payload
three times in Python before gRPC copies it again into its own slice. Protobuf messages
are a concatenation of fields in any order, so we serialise the small fields with the
generated code and write the tensor in ourselves:

    EmbedResponse = 0x0a len(Tensor) [Tensor header: shape, dtype] 0x1a len(data) DATA
                    [every other field, serialised normally]

The response ``bytes`` object is allocated at its final size, uninitialised, through
CPython's ``PyBytes_FromStringAndSize(NULL, n)`` (the documented way for C code to build
a bytes object in place), and filled before anything else can see it. DATA is written by
one torch ``copy_``, which casts fp32 rows to the wire dtype in the same pass and releases
the GIL, so the event loop keeps serving while a multi-MB response is filled.

Copies of the tensor per response, end to end in the server:
  1. gather (+ add) writes the batch's fp32 rows into a reused scratch buffer;
  2. ``copy_`` writes one response's rows (cast to the wire dtype) into its bytes object;
  3. gRPC core copies those bytes into its send slice (outside our control).
The transport ceiling (a precomputed message) pays 3 as well.
"""

from __future__ import annotations

import ctypes
import sys

import torch

from client._gen.embedding.v1 import embedding_pb2 as pb

__all__ = ["DTYPES", "DTYPE_NAMES", "encode_batch_response", "encode_embed_response",
           "identity"]

if sys.byteorder != "little":  # torch writes native order; the wire is little-endian
    raise ImportError("service.codec supports little-endian hosts only")

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

_new_bytes = ctypes.pythonapi.PyBytes_FromStringAndSize
_new_bytes.restype = ctypes.py_object
_new_bytes.argtypes = (ctypes.c_void_p, ctypes.c_ssize_t)
_bytes_address = ctypes.pythonapi.PyBytes_AsString
_bytes_address.restype = ctypes.c_void_p
_bytes_address.argtypes = (ctypes.py_object,)


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


def _splice(rows: torch.Tensor, dtype: int, rest: bytes) -> bytes:
    wire_dtype = DTYPES[dtype]
    T, C = rows.shape
    nbytes = T * C * wire_dtype.itemsize
    header = pb.Tensor(shape=[T, C], dtype=dtype).SerializeToString()  # type: ignore[arg-type]
    data_len = _varint(nbytes)
    tensor_len = len(header) + 1 + len(data_len) + nbytes
    head = b"".join((_TAG_EMBEDDINGS, _varint(tensor_len), header, _TAG_DATA, data_len))
    total = len(head) + nbytes + len(rest)  # always > 1: never CPython's shared 1-byte objects
    out = _new_bytes(None, total)  # fresh and uninitialised: ours alone until returned
    address = _bytes_address(out)
    ctypes.memmove(address, head, len(head))
    buffer = (ctypes.c_char * total).from_address(address)
    wire = torch.frombuffer(buffer, dtype=wire_dtype, count=T * C, offset=len(head))
    wire.view(T, C).copy_(rows)  # the one copy, with the cast; releases the GIL
    ctypes.memmove(address + len(head) + nbytes, rest, len(rest))
    return out


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

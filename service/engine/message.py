"""A response allocated once at its final size, the rows written into it in place.

The generic path (set ``Tensor.data``, then ``SerializeToString``) copies a [T, C] payload
three times in Python before gRPC copies it again into its own slice. A protobuf message
is a concatenation of fields in any order, so the small fields are serialised by the
generated code and the response is laid out here:

    head (the rows' tag and length) | ROWS | tail (the other fields) [| timing (46 B)]

Everything but ROWS and the timing is known once a request is admitted, so a
``MessageBuffer`` creates the response ``bytes`` then, at its final size, uninitialised,
through CPython's ``PyBytes_FromStringAndSize(NULL, n)`` (the documented way for C code to
build a bytes object in place), and exposes ROWS as a writable tensor: the lookup writes
the rows straight into it. The timing is known only after the lookup, so it is written
last, at a fixed size: each uint64 as a 10-byte varint (over-long varints are valid
protobuf; every conforming parser reads them). That costs 30 bytes per response and is
what lets the rows be written before the timing. The REST form uses the same buffer with
its JSON header as the head.

Copies of the rows per response, end to end in the server (see ``tables.embed_into``):
  1. the one-pass lookup (``lookup.c``) writes each row into the response bytes once,
     already summed and cast to the wire dtype (fp32, fp16 or bf16 alike); without it,
     torch's gather writes fp32 rows into the response (fp32 output) or into a reused
     scratch that a cast-copy turns into the response bytes (fp16/bf16 output, many small
     requests sharing one gather, or the device→host copy on CUDA);
  2. the transport copies those bytes into its send buffers (outside our control).
The transport ceiling (a precomputed message) pays 2 as well.
"""

from __future__ import annotations

import ctypes
import functools
import sys
from typing import Any

import numpy as np
import torch

from genproto.embedding.v1 import embedding_pb2 as pb
from service.dtypes import BY_WIRE
from service.engine.batcher import Timing

__all__ = ["TIMING_BYTES", "MessageBuffer", "bytes_field_prefix", "message_head",
           "timing_field", "timing_tag"]

if sys.byteorder != "little":  # torch writes native order; the wire is little-endian
    raise ImportError("service.engine.message supports little-endian hosts only")

_TAG_EMBEDDINGS = b"\x0a"  # field 1, wire type 2 (length-delimited), in both responses
_TAG_DATA = b"\x1a"  # Tensor.data: field 3, wire type 2
_VARINT_MAX = 10  # bytes of the longest uint64 varint
_TIMING_FIELDS = 4  # queue_ns, tokenize_ns, compute_ns, total_ns: fields 1..4, varints
_TIMING_BODY = _TIMING_FIELDS * (1 + _VARINT_MAX)
TIMING_BYTES = 2 + _TIMING_BODY  # tag, length (one byte: 44), body

_new_bytes = ctypes.pythonapi.PyBytes_FromStringAndSize
_new_bytes.restype = ctypes.py_object
_new_bytes.argtypes = (ctypes.c_void_p, ctypes.c_ssize_t)
_bytes_address = ctypes.pythonapi.PyBytes_AsString
_bytes_address.restype = ctypes.c_void_p
_bytes_address.argtypes = (ctypes.py_object,)
# A writable memoryview over raw memory: no ctypes array type built per response.
_memory_view = ctypes.pythonapi.PyMemoryView_FromMemory
_memory_view.restype = ctypes.py_object
_memory_view.argtypes = (ctypes.c_void_p, ctypes.c_ssize_t, ctypes.c_int)
_PyBUF_WRITE = 0x200
_NUMPY = {torch.float32: np.float32, torch.float16: np.float16, torch.bfloat16: np.int16}


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


def timing_field(tag: int, queue_ns: int, tokenize_ns: int, compute_ns: int,
                 total_ns: int) -> bytes:
    """The ``timing`` field (tag ``tag``): its four varints (fields 1..4, tags 0x08, 0x10,
    0x18, 0x20), each padded to 10 bytes (same value, fixed size: the buffer is laid out
    before the times are known). One flat list: this runs once per response."""
    out = [tag, _TIMING_BODY]
    for field, n in zip((0x08, 0x10, 0x18, 0x20), (queue_ns, tokenize_ns, compute_ns, total_ns)):
        out += (field, n & 127 | 128, n >> 7 & 127 | 128, n >> 14 & 127 | 128,
                n >> 21 & 127 | 128, n >> 28 & 127 | 128, n >> 35 & 127 | 128,
                n >> 42 & 127 | 128, n >> 49 & 127 | 128, n >> 56 & 127 | 128, n >> 63)
    return bytes(out)


@functools.lru_cache(maxsize=4096)
def message_head(T: int, C: int, dtype: int) -> bytes:
    """Everything of a native response before the rows: the ``embeddings`` Tensor's tag,
    length, shape and dtype, and its data's tag and length (cached: requests repeat a few
    shapes)."""
    nbytes = T * C * BY_WIRE[dtype].itemsize
    header = pb.Tensor(shape=[T, C], dtype=dtype).SerializeToString()  # type: ignore[arg-type]
    data_len = _varint(nbytes)
    tensor_len = len(header) + 1 + len(data_len) + nbytes
    return b"".join((_TAG_EMBEDDINGS, _varint(tensor_len), header, _TAG_DATA, data_len))


@functools.lru_cache(maxsize=8)
def timing_tag(descriptor: Any) -> int:
    """The tag of a message type's ``timing`` field (length-delimited)."""
    number = descriptor.fields_by_name["timing"].number
    return int((number << 3) | 2)  # one byte for field numbers < 16


@functools.lru_cache(maxsize=4096)
def bytes_field_prefix(field_number: int, nbytes: int) -> bytes:
    """The tag and length of a length-delimited field holding ``nbytes`` bytes."""
    return _varint(field_number << 3 | 2) + _varint(nbytes)


class MessageBuffer:
    """One response being built: ``head | rows | tail [| timing]``, allocated at its final
    size; the lookup writes the rows, then ``finish`` writes the timing (when the message
    has a timing field) and hands over the bytes. A ``batcher.Destination``: ``lookup``
    writes the rows by address where the tables' kernel serves (no tensor over the bytes
    is built), else ``rows`` is that tensor, made when first asked for."""

    __slots__ = ("_at", "_rows", "_shape", "_timing_at", "_timing_tag", "data", "dtype",
                 "nbytes")

    def __init__(self, head: bytes, shape: tuple[int, int], dtype: torch.dtype,
                 tail: bytes, timing_tag: int | None = None) -> None:
        N, C = self._shape = shape
        self.dtype = dtype
        nbytes = self.nbytes = N * C * dtype.itemsize
        timing = TIMING_BYTES if timing_tag is not None else 0
        total = len(head) + nbytes + len(tail) + timing  # > 1: never a shared object
        self.data: bytes = _new_bytes(None, total)  # fresh, uninitialised, ours alone
        address = _bytes_address(self.data)
        ctypes.memmove(address, head, len(head))
        if tail:  # a REST answer of the rows alone has none
            ctypes.memmove(address + len(head) + nbytes, tail, len(tail))
        self._at = address + len(head)  # the rows' first byte
        self._timing_at = address + total - timing
        self._timing_tag = timing_tag
        self._rows: torch.Tensor | None = None

    def lookup(self, tables: Any, ids: np.ndarray, spans: list[tuple[int, int]],
               compose: int) -> bool:
        """The rows straight into the bytes, where the tables' kernel serves
        (``EmbeddingTables.write_at``); False: the batcher writes ``rows`` instead."""
        if not self.nbytes or self._at == 0:
            return False
        written: bool = tables.write_at(ids, spans, compose, self._at, self.nbytes, self.dtype)
        return written

    @property
    def rows(self) -> torch.Tensor:
        """The rows as a writable (N, C) tensor over the response bytes."""
        if self._rows is None:
            if self._at == 0:
                raise RuntimeError("the response was handed over: its rows are not writable")
            N, C = self._shape
            if self.nbytes == 0:  # numpy refuses no memory at an address
                self._rows = torch.empty(N, C, dtype=self.dtype)
            else:
                view = _memory_view(self._at, self.nbytes, _PyBUF_WRITE)
                # Through numpy: torch.frombuffer costs more than both steps together.
                # bfloat16 has no numpy dtype: its bits are made int16, then viewed as bf16.
                rows = torch.from_numpy(np.ndarray((N, C), _NUMPY[self.dtype], view))  # (N, C)
                self._rows = (rows.view(torch.bfloat16) if self.dtype == torch.bfloat16
                              else rows)
        return self._rows

    def finish(self, timing: Timing) -> bytes:
        """Write the timing fields (when the message has them); hand over the bytes."""
        if self._timing_tag is not None:
            ctypes.memmove(self._timing_at, timing_field(self._timing_tag, *timing), TIMING_BYTES)
        # No view, and no address, may outlive the buffer's ownership of the bytes.
        self._rows, self._at = None, 0
        return self.data

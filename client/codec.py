"""Wire format of the client: building requests, decoding tensors, typed results and errors.

Tensors arrive as raw little-endian bytes and are decoded with ``np.frombuffer``: float32
and float16 arrays are zero-copy, read-only views of the response bytes. numpy has no
bfloat16, so by default bfloat16 responses are widened to float32 exactly (the bf16 bits
shifted left by 16 are the float32 bits of the same value: no rounding happens);
``raw_bfloat16=True`` returns the raw bits as a read-only uint16 array instead.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, TypedDict, Unpack

import grpc
import numpy as np

from client.grammar import (
    MAX_ID,
    SPELLINGS,
    UINT32_MAX,
    check_bool,
    check_int,
    check_option_names,
    check_str,
    enum_value,
    token_id,
)
from genproto.embedding.v1 import embedding_pb2 as pb

__all__ = [
    "COMPOSE",
    "DTYPES",
    "TRUNCATE",
    "BatchOptions",
    "EmbedOptions",
    "Embedding",
    "EmbeddingError",
    "Timing",
    "batch_request",
    "decode_batch",
    "decode_embedding",
    "decode_tensor",
    "embed_request",
    "stream_request",
]

# Short name -> enum value, the names embedctl shows; client.grammar accepts more spellings.
COMPOSE = {short[0]: pb.Compose.Value(name) for name, short in SPELLINGS["compose"].items()}
DTYPES = {short[0]: pb.DType.Value(name) for name, short in SPELLINGS["dtype"].items()}
TRUNCATE = {short[0]: pb.Truncate.Value(name) for name, short in SPELLINGS["truncate"].items()}
_DTYPE_NAMES = {v: k for k, v in DTYPES.items()}
_WIRE: dict[int, np.dtype[Any]] = {pb.DTYPE_FLOAT32: np.dtype("<f4"),
                                    pb.DTYPE_FLOAT16: np.dtype("<f2"),
                                    pb.DTYPE_BFLOAT16: np.dtype("<u2")}
# grpc's wording when no connection could be made (refused, no route, name not resolved).
_UNREACHABLE_HINTS = ("failed to connect", "connection refused", "errors resolving",
                      "dns resolution failed", "no route to host", "connect failed")


class BatchOptions(TypedDict, total=False):
    """Options shared by every input of one request (all optional)."""

    model: str  # "" = the server's default model
    version: int  # 0 = newest loaded version
    compose: str | int  # token+position | token | position, or a pb.Compose value
    dtype: str | int  # float32 | float16 | bfloat16, or a pb.DType value
    truncate: str | int  # none | right | left, or a pb.Truncate value
    allow_special_tokens: bool  # False: "<|endoftext|>" in text is plain text
    add_special_tokens: bool  # absent: the model's default (e.g. Llama's BOS)
    request_id: str  # echoed back


class EmbedOptions(BatchOptions, total=False):
    """Options of one sequence: BatchOptions plus where its first token sits."""

    start_position: int


class EmbeddingError(Exception):
    """A failed RPC: ``code`` is the grpc.StatusCode, ``details`` the server's message."""

    def __init__(self, code: grpc.StatusCode, details: str) -> None:
        super().__init__(f"{code.name}: {details}")
        self.code = code
        self.details = details

    @property
    def unreachable(self) -> bool:
        """True when no connection to the server could be made at all."""
        low = self.details.lower()
        return (self.code == grpc.StatusCode.UNAVAILABLE
                and any(hint in low for hint in _UNREACHABLE_HINTS))

    @classmethod
    def from_rpc(cls, err: grpc.RpcError) -> EmbeddingError:
        """Wrap a grpc.RpcError (sync or aio) without losing its code or details."""
        code = err.code() if hasattr(err, "code") else None
        details = err.details() if hasattr(err, "details") else None
        return cls(code or grpc.StatusCode.UNKNOWN, details or str(err))


@dataclass(frozen=True)
class Timing:
    """Server-side time spent on one request, in nanoseconds."""

    queue_ns: int
    tokenize_ns: int
    compute_ns: int
    total_ns: int


@dataclass(frozen=True)
class Embedding:
    """One sequence's input embeddings and what the server says about them."""

    array: np.ndarray  # (T, C), read-only
    token_ids: list[int]  # after truncation
    start_position: int  # position of token_ids[0]
    model: str
    version: int
    checkpoint_id: str  # sha256 of the version's manifest.json
    truncated_tokens: int
    untrained_token_indices: list[int]  # indices i < T whose token row was never trained
    timing: Timing
    request_id: str
    wire_dtype: str  # float32 | float16 | bfloat16: what the server sent


def _token_ids(ids: Sequence[int]) -> pb.TokenIds:
    return pb.TokenIds(ids=[token_id(i, x) for i, x in enumerate(ids)])


def embed_request(text: str | None = None, ids: Sequence[int] | None = None,
                  **options: Unpack[EmbedOptions]) -> pb.EmbedRequest:
    """An EmbedRequest for exactly one of ``text`` or ``ids``.

    A misspelt option name is a TypeError; a bad value (unknown spelling, wrong type, out
    of range) a ValueError naming it (client.grammar: the rules every tool shares).
    """
    check_option_names(options, EmbedOptions.__optional_keys__)
    if (text is None) == (ids is None):
        raise ValueError("give exactly one of text or ids")
    req = pb.EmbedRequest(
        model=check_str("model", options.get("model", "")),
        version=check_int("version", options.get("version", 0), 0, MAX_ID),
        start_position=check_int("start_position", options.get("start_position", 0), 0,
                                 UINT32_MAX),
        compose=enum_value("compose", options.get("compose", "token+position")),
        dtype=enum_value("dtype", options.get("dtype", "float32")),
        truncate=enum_value("truncate", options.get("truncate", "none")),
        allow_special_tokens=check_bool("allow_special_tokens",
                                        options.get("allow_special_tokens", False)),
        request_id=check_str("request_id", options.get("request_id", "")))
    if "add_special_tokens" in options:
        req.add_special_tokens = check_bool("add_special_tokens", options["add_special_tokens"])
    if text is not None:
        req.text = check_str("text", text)
    elif ids is not None:
        req.token_ids.CopyFrom(_token_ids(ids))
    return req


def batch_request(inputs: Sequence[str | Sequence[int]], start_positions: int | Sequence[int],
                  **options: Unpack[BatchOptions]) -> pb.EmbedBatchRequest:
    """An EmbedBatchRequest: one EmbedInput per text or id sequence, shared options."""
    check_option_names(options, BatchOptions.__optional_keys__)
    starts = ([start_positions] * len(inputs) if isinstance(start_positions, int)
              else list(start_positions))
    if len(starts) != len(inputs):
        raise ValueError(f"{len(starts)} start_positions for {len(inputs)} inputs")
    items = [pb.EmbedInput(text=x, start_position=check_int("start_position", s, 0,
                                                             UINT32_MAX))
             if isinstance(x, str)
             else pb.EmbedInput(token_ids=_token_ids(x),
                                start_position=check_int("start_position", s, 0, UINT32_MAX))
             for x, s in zip(inputs, starts)]
    shared = embed_request(ids=(), **options)  # one place validates the shared options
    batch = pb.EmbedBatchRequest(
        model=shared.model, version=shared.version, inputs=items, compose=shared.compose,
        dtype=shared.dtype, truncate=shared.truncate,
        allow_special_tokens=shared.allow_special_tokens, request_id=shared.request_id)
    if shared.HasField("add_special_tokens"):
        batch.add_special_tokens = shared.add_special_tokens
    return batch


def stream_request(item: Any, **options: Unpack[EmbedOptions]) -> pb.EmbedRequest:
    """A stream item (str, id sequence, or a ready EmbedRequest) as an EmbedRequest."""
    if isinstance(item, pb.EmbedRequest):
        return item
    if isinstance(item, str):
        return embed_request(item, **options)
    return embed_request(ids=item, **options)


def decode_tensor(tensor: pb.Tensor, raw_bfloat16: bool = False) -> np.ndarray:
    """Decode a Tensor to a read-only array of its shape.

    float32/float16: zero-copy view of the bytes. bfloat16: widened exactly to float32
    (bits << 16), or the raw bits as uint16 with ``raw_bfloat16=True``.
    """
    shape = tuple(int(d) for d in tensor.shape)
    return tensor_view(tensor.data, tensor.dtype, shape, len(tensor.data), raw_bfloat16)


def tensor_view(buffer: Any, dtype: int, shape: tuple[int, ...], nbytes: int,
                raw_bfloat16: bool = False, offset: int = 0) -> np.ndarray:
    """``nbytes`` of ``buffer`` at ``offset`` as a read-only array of ``shape`` (a view, no
    copy; bf16 widened to float32 unless ``raw_bfloat16``); INTERNAL if the sizes disagree."""
    wire = _WIRE.get(dtype)
    if wire is None:
        raise EmbeddingError(grpc.StatusCode.INTERNAL, f"unknown tensor dtype {dtype}")
    count = int(np.prod(shape, dtype=np.int64))
    want = count * wire.itemsize
    if nbytes != want:
        raise EmbeddingError(grpc.StatusCode.INTERNAL,
                             f"tensor of shape {shape} {_DTYPE_NAMES[dtype]} needs "
                             f"{want} bytes, got {nbytes}")
    array = np.frombuffer(buffer, dtype=wire, count=count, offset=offset).reshape(shape)
    array.flags.writeable = False
    if dtype == pb.DTYPE_BFLOAT16 and not raw_bfloat16:
        # bf16 is the top half of a float32, so widening by a shift is exact.
        array = (array.astype("<u4") << 16).view("<f4")  # (T, C) float32
        array.flags.writeable = False
    return array


def _timing(t: pb.Timing) -> Timing:
    return Timing(t.queue_ns, t.tokenize_ns, t.compute_ns, t.total_ns)


def decode_embedding(resp: pb.EmbedResponse, raw_bfloat16: bool = False) -> Embedding:
    """An EmbedResponse as an Embedding."""
    return Embedding(decode_tensor(resp.embeddings, raw_bfloat16), list(resp.token_ids),
                     resp.start_position, resp.model, resp.version, resp.checkpoint_id,
                     resp.truncated_tokens, list(resp.untrained_token_indices),
                     _timing(resp.timing), resp.request_id,
                     _DTYPE_NAMES.get(resp.embeddings.dtype, "?"))


def decode_batch(resp: pb.EmbedBatchResponse, raw_bfloat16: bool = False) -> list[Embedding]:
    """An EmbedBatchResponse split by its offsets; each array is a view of the packed one."""
    packed = decode_tensor(resp.embeddings, raw_bfloat16)  # (ΣT, C)
    offsets = [int(o) for o in resp.offsets]
    if (len(offsets) != len(resp.items) + 1 or offsets[0] != 0
            or offsets[-1] != packed.shape[0] or offsets != sorted(offsets)):
        raise EmbeddingError(grpc.StatusCode.INTERNAL,
                             f"batch offsets {offsets} do not split {packed.shape[0]} rows "
                             f"into {len(resp.items)} items")
    timing, wire = _timing(resp.timing), _DTYPE_NAMES.get(resp.embeddings.dtype, "?")
    return [Embedding(packed[offsets[i]:offsets[i + 1]],  # (T_i, C) view, no copy
                      list(item.token_ids), item.start_position, resp.model, resp.version,
                      resp.checkpoint_id, item.truncated_tokens,
                      list(item.untrained_token_indices), timing, resp.request_id, wire)
            for i, item in enumerate(resp.items)]

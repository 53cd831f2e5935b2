"""Request validation: pure functions from request fields to checked inputs or typed errors.

Every message names the field and the limit, so a client can fix the request without
reading server logs.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from genproto.embedding.v1 import embedding_pb2 as pb
from service.dtypes import BY_WIRE
from service.engine.loading import LoadedModel
from service.errors import FailedPrecondition, InvalidArgument, ResourceExhausted

__all__ = [
    "Limits",
    "TokenSequence",
    "check_compose",
    "check_dtype_range",
    "check_enum",
    "check_ids",
    "check_input_count",
    "check_output_bytes",
    "check_response_size",
    "check_text",
    "check_text_total",
    "fit_length",
    "max_abs_output",
    "text_bytes",
]

_RESPONSE_OVERHEAD = 1024  # bytes: identity fields, timing, framing
_SMALL_IDS = 64  # up to this many ids, Python's min/max beat numpy's
_PER_TOKEN_OVERHEAD = 16  # bytes: the echoed token id and an untrained index, worst case


@dataclass(frozen=True)
class Limits:
    """Per-request limits from the server config."""

    max_tokens_per_request: int
    max_text_bytes: int
    max_message_bytes: int
    max_output_bytes: int = 0  # 0 = no cap beyond the message (or region) size
    max_inputs_per_request: int = 1024  # sequences in one request (EmbedBatch, OIP [B, T])
    max_request_text_bytes: int = 1 << 20  # UTF-8 bytes of text summed over the inputs


class TokenSequence:
    """One input's token ids as admitted: after truncation, with the position of the first."""

    __slots__ = ("ids", "start_position", "truncated_tokens")

    def __init__(self, ids: np.ndarray, start_position: int, truncated_tokens: int) -> None:
        self.ids = ids  # (T,) int64, at positions start_position .. start_position+T-1
        self.start_position = start_position
        self.truncated_tokens = truncated_tokens


_LARGEST = {wire: float(torch.finfo(d.torch).max) for wire, d in BY_WIRE.items()}
_ENUMS = ((pb.Compose, "compose"), (pb.DType, "dtype"), (pb.Truncate, "truncate"))
_VALID = tuple(frozenset(e.DESCRIPTOR.values_by_number) for e, _ in _ENUMS)


def check_options(compose: int, dtype: int, truncate: int) -> None:
    """``check_enum`` of a request's compose, dtype and truncate (one set lookup each)."""
    if compose in _VALID[0] and dtype in _VALID[1] and truncate in _VALID[2]:
        return
    for value, valid, (enum, field) in zip((compose, dtype, truncate), _VALID, _ENUMS):
        if value not in valid:
            check_enum(value, enum, field)


def check_enum(value: int, enum: type, field: str) -> int:
    """Proto3 enums are open: an unknown number arrives as an int and must be refused."""
    descriptor = enum.DESCRIPTOR  # type: ignore[attr-defined]
    if value not in descriptor.values_by_number:  # a dict: no list built per request
        names = ", ".join(v.name for v in descriptor.values)
        raise InvalidArgument(f"{field}={value} is not a valid {descriptor.name} ({names})")
    return value


def check_text(text: str, limits: Limits, field: str) -> None:
    """Refuse text over the byte limit before spending time tokenizing it."""
    # len(str) <= UTF-8 bytes <= 4 * len(str): skip the encode when the answer is certain.
    if 4 * len(text) > limits.max_text_bytes:
        n = text_bytes(text)
        if n > limits.max_text_bytes:
            raise InvalidArgument(f"{field} is {n} bytes; max_text_bytes is "
                                  f"{limits.max_text_bytes}")


def check_input_count(count: int, limits: Limits, field: str = "inputs") -> None:
    """Refuse too many sequences from the count alone (``len()`` of the repeated field or
    the declared B), before anything is done per input."""
    if count > limits.max_inputs_per_request:
        raise InvalidArgument(f"{field} has {count} sequences; max_inputs_per_request is "
                              f"{limits.max_inputs_per_request}")


def check_text_total(nbytes: int, limits: Limits, field: str = "inputs") -> None:
    """Refuse a request whose texts sum to more than the per-request byte limit, before
    any of them is tokenized."""
    if nbytes > limits.max_request_text_bytes:
        raise InvalidArgument(f"{field} hold {nbytes} bytes of text in all; "
                              f"max_request_text_bytes is {limits.max_request_text_bytes}")


def text_bytes(text: str) -> int:
    """UTF-8 bytes of ``text``; no encode when every character is ASCII-sized."""
    return len(text) if text.isascii() else len(text.encode("utf-8", errors="surrogatepass"))


def check_ids(ids: np.ndarray, model: LoadedModel, field: str) -> None:
    """Every id must index a real vocabulary row (padding rows are never served)."""
    vocab_size = model.checkpoint.manifest.vocab_size
    if ids.size <= _SMALL_IDS:  # a numpy reduction costs ~5 µs of call overhead
        values = ids.tolist()
        bad = bool(values) and (min(values) < 0 or max(values) >= vocab_size)
    else:
        bad = bool(ids.min() < 0 or ids.max() >= vocab_size)  # two reductions, no mask
    if bad:
        i = int(((ids < 0) | (ids >= vocab_size)).argmax())
        raise InvalidArgument(f"{field}[{i}]={int(ids[i])} is out of range [0, {vocab_size}) "
                              f"for model {model.name!r}")


def fit_length(ids: np.ndarray, start_position: int, truncate: int, model: LoadedModel,
               limits: Limits, field: str) -> TokenSequence:
    """Apply max_seq_len and max_tokens_per_request: refuse or truncate."""
    T = int(ids.shape[0])
    if T == 0:
        raise InvalidArgument(f"{field} is empty: give text or token_ids with at least 1 token")
    max_seq_len = model.checkpoint.manifest.max_seq_len
    if start_position >= max_seq_len:
        raise InvalidArgument(f"{field}: start_position={start_position} must be < max_seq_len "
                              f"{max_seq_len} of model {model.name!r}")
    room = max_seq_len - start_position
    keep = min(room, limits.max_tokens_per_request)
    if keep < T:
        if truncate == pb.TRUNCATE_NONE:
            if limits.max_tokens_per_request < T:
                raise InvalidArgument(f"{field} has T={T} tokens; max_tokens_per_request is "
                                      f"{limits.max_tokens_per_request} (or set truncate)")
            raise InvalidArgument(f"{field}: start_position ({start_position}) + T ({T}) = "
                                  f"{start_position + T} exceeds max_seq_len {max_seq_len} "
                                  f"of model {model.name!r} (or set truncate)")
        # TRUNCATE_LEFT keeps the tail; either way the kept tokens start at start_position.
        ids = ids[:keep] if truncate == pb.TRUNCATE_RIGHT else ids[T - keep:]
        ids = np.ascontiguousarray(ids)  # a slice of a row, made whole
    # Kept a numpy array up to the tables: a torch tensor built and freed per request shows
    # at T=16, and the kernel takes the ids' bytes (``tables`` wraps them for torch's paths).
    return TokenSequence(ids, start_position, T - int(ids.shape[0]))


def check_compose(compose: int, model: LoadedModel) -> None:
    """POSITION_ONLY needs a position table (RoPE and ALiBi models have none: their
    positions act inside attention, so there are no position rows to return)."""
    if compose == pb.COMPOSE_POSITION_ONLY and model.tables.position_table is None:
        family = model.checkpoint.manifest.family
        why = (f" (family {family!r}: its positions act inside attention, rotary or ALiBi; "
               f"there are no position rows)" if family else "")
        raise FailedPrecondition(f"compose=COMPOSE_POSITION_ONLY needs a position table; "
                                 f"model {model.name!r} has position "
                                 f"{model.checkpoint.manifest.position!r}{why}")


def check_response_size(tokens: int, model: LoadedModel, itemsize: int,
                        limits: Limits, dim: int | None = None) -> None:
    """Refuse before compute a response gRPC would refuse to send (``dim``: the row width
    of the requested compose; default the token rows')."""
    dim = model.tables.dim if dim is None else dim
    per_token = dim * itemsize + _PER_TOKEN_OVERHEAD
    size = _RESPONSE_OVERHEAD + tokens * per_token
    if size > limits.max_message_bytes:
        fits = max(0, (limits.max_message_bytes - _RESPONSE_OVERHEAD) // per_token)
        raise ResourceExhausted(f"response would be ~{size} bytes ({tokens} tokens x "
                                f"{dim} x {itemsize} B) > max_message_bytes "
                                f"{limits.max_message_bytes}; the largest T that fits is {fits}")


def check_output_bytes(tokens: int, model: LoadedModel, itemsize: int, dtype_name: str,
                       limits: Limits, dim: int | None = None) -> None:
    """Refuse before compute an output over ``max_output_bytes`` in the requested dtype."""
    if not limits.max_output_bytes:
        return
    dim = model.tables.dim if dim is None else dim
    per_token = dim * itemsize
    size = tokens * per_token
    if size > limits.max_output_bytes:
        raise ResourceExhausted(f"output would be {size} bytes ({tokens} tokens x "
                                f"{dim} x {itemsize} B {dtype_name}) > "
                                f"max_output_bytes {limits.max_output_bytes}; the largest T "
                                f"that fits in {dtype_name} is "
                                f"{limits.max_output_bytes // per_token}")


def max_abs_output(model: LoadedModel, compose: int) -> float:
    """An upper bound on |value| of any row ``compose`` can return for this model: the
    tables' largest |value| (recorded at load), through the family's rules."""
    return model.tables.max_abs(compose)


def check_dtype_range(compose: int, dtype: int, model: LoadedModel) -> None:
    """Refuse, before any work, an output dtype that cannot hold every row this model can
    return: a value past float16's 65504 would silently become inf. Decided from the
    bound alone (no per-request scan), so it is all or nothing per (model, compose, dtype)."""
    d = BY_WIRE[dtype]
    largest = _LARGEST[dtype]
    bound = max_abs_output(model, compose)
    if bound > largest:
        compose_name = pb.Compose.Name(compose)
        raise FailedPrecondition(
            f"dtype={pb.DType.Name(d.wire)} cannot hold the rows of model {model.name!r}: "
            f"with compose={compose_name} values reach |{bound:.6g}| > {largest:.6g}, the "
            f"largest {d.name}; ask for float32 (or bfloat16)")

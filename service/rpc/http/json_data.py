"""JSON tensor data as the REST infer body carries it: ids (flat or nested lists of
integers, each checked to fit its datatype) and texts (strings, encoded when read)."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Any, overload

import numpy as np

from service.errors import InvalidArgument
from service.rpc.oip_tensors import ID_DTYPES

__all__ = ["INT", "WALK_IDS", "JsonTexts", "ints"]

WALK_IDS = 64  # ids walked for booleans without first asking numpy for a 0 or 1
INT = frozenset({int})  # the type of a JSON integer as parsed (bool is its own type)
_INT64 = ID_DTYPES["INT64"]


class JsonTexts(Sequence[bytes]):
    """A BYTES tensor's JSON strings, as UTF-8: ``len`` is the data's top-level count (B in
    every layout of a ``[B]`` or ``[B, 1]`` tensor), known without visiting a string, so the
    declared shape and ``max_inputs_per_request`` are checked first, as on gRPC; each string
    is encoded only when admission builds the inputs."""

    def __init__(self, name: str, data: list[Any]) -> None:
        self.name = name
        self.data = data

    def __len__(self) -> int:
        return len(self.data)

    def __iter__(self) -> Iterator[bytes]:
        for s in _flat(self.data):
            if not isinstance(s, str):
                raise InvalidArgument(f"input {self.name!r}: BYTES data must be strings")
            yield s.encode("utf-8", "surrogatepass")  # a lone surrogate: refused as UTF-8

    @overload
    def __getitem__(self, index: int) -> bytes: ...
    @overload
    def __getitem__(self, index: slice) -> Sequence[bytes]: ...
    def __getitem__(self, index: int | slice) -> bytes | Sequence[bytes]:
        return list(self)[index]


def ints(name: str, datatype: str, data: Any) -> np.ndarray:
    """JSON ``data`` (flat or nested, row-major) as the tensor's values, flat, each checked
    to fit its datatype; the reader checks their count against the shape."""
    dt = ID_DTYPES.get(datatype)
    if dt is None:  # the reader names the expected input names and datatypes, unwalked
        return np.empty(0, np.int64)
    if not isinstance(data, list):
        raise InvalidArgument("tensor 'data' must be a JSON list")
    if dt is _INT64 and 0 < len(data) <= WALK_IDS and INT.issuperset(map(type, data)):
        # A short flat list of JSON integers (a chat turn's ids): copied as they are,
        # without numpy first finding their type. One past int64 is read below.
        try:
            return np.fromiter(data, np.int64, len(data))  # (B*T,)
        except OverflowError:
            pass
    try:  # numpy reads the (nested, row-major) list in C: T=1024 in ~50 µs, not ~1 ms
        values = np.asarray(data)
    except (ValueError, OverflowError):  # ragged nesting
        values = np.asarray([None])
    integers = values.dtype.kind in "iu" and not (values.size and _has_bool(data, values))
    if not integers and not (values.size == 0 and values.ndim == 1):
        raise InvalidArgument(f"input {name!r}: {datatype} data must be "
                              f"integers (a flat list, or nested lists of one shape)")
    # An int64 array read from Python ints already holds INT64's range (numpy refuses or
    # widens to uint64 past it): only a narrower datatype or a uint64 array needs the pass.
    if values.dtype != np.int64 or dt != np.int64:
        info = np.iinfo(dt)
        if values.size and (values.min() < info.min or values.max() > info.max):
            raise InvalidArgument(f"input {name!r}: a value is outside {datatype}")
    return values.reshape(-1)  # (B*T,)


def _has_bool(data: list[Any], values: np.ndarray) -> bool:
    """Whether a JSON ``true`` or ``false`` sits among the integers (numpy reads them with
    ints as 1 and 0). Only a 1 or a 0 can be one, so a long list is walked only when it
    holds one."""
    if values.size > WALK_IDS and not (values <= 1).any():
        return False
    return bool in map(type, _flat(data))


def _flat(data: Any) -> list[Any]:
    """Nested lists in row-major order, walked with a stack, not recursion: a body may
    nest as deep as the JSON parser allows."""
    if not isinstance(data, list):
        raise InvalidArgument("tensor 'data' must be a JSON list")
    if list not in map(type, data):  # in C: a flat list is the common case
        return data
    out: list[Any] = []
    stack = [iter(data)]
    while stack:
        for v in stack[-1]:
            if isinstance(v, list):
                stack.append(iter(v))
                break
            out.append(v)
        else:
            stack.pop()
    return out

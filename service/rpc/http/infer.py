"""The REST form of OIP ``infer``, read: JSON (and binary) tensors in, the engine's request out.

Request body: a JSON object, optionally followed by binary tensor data (Triton's binary
tensor data extension): the ``Inference-Header-Content-Length`` header gives the JSON's
length; each input whose ``parameters`` carry ``binary_data_size`` takes that many bytes
after it, in input order. Parameters, output names and input checks are the gRPC form's
own (``oip_tensors``), so both forms answer a request with the same values and messages.

Response: the outputs asked for, in the order asked (default: ``embeddings``, then
``sequence_lengths``). An output is binary when its ``binary_data`` parameter says so, else
when the request's ``binary_data_output`` does; the engine lays the answer out
(``RestReply``: binary outputs after the JSON, in output order, the rows written once
straight into the body). FP16/BF16 travel only as binary: JSON has no such numbers, and
asking for them in JSON is refused here, before any work, as Triton refuses it.
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any, overload

import numpy as np
import orjson

from genproto.embedding.v1 import embedding_pb2 as pb
from service.engine import Inputs, Options
from service.errors import InvalidArgument
from service.rpc.oip_tensors import (
    DATATYPES,
    ID_DTYPES,
    ONE_INPUT,
    datatype,
    output_names,
    parameters,
    read_tensor,
)

__all__ = ["EXTENSIONS", "InferRequest", "parse_infer"]

EXTENSIONS = ["parameters", "binary_tensor_data"]  # what GET /v2 advertises
_TRANSPORT = ("binary_data_output",)  # request parameters of the REST form only
_DEFAULT_ORDER = ("embeddings", "sequence_lengths")
_DIGITS = bytes(49 if 48 <= c <= 57 else 48 for c in range(256))  # digit -> "1", else "0"
_LONG_NUMBER = b"1" * 19  # a number past int64's range has 19 digits or more
_ORJSON_MAX = 1 << 18
_WALK_IDS = 64  # ids walked for booleans without first asking numpy for a 0 or 1
_INT = frozenset({int})  # the type of a JSON integer as parsed (bool is its own type)
_INT64 = ID_DTYPES["INT64"]


class _JsonTexts(Sequence[bytes]):
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


@dataclass
class InferRequest:
    """A parsed infer request: what admission takes, and how to answer."""

    request_id: str
    options: Options
    inputs: Inputs
    outputs: list[tuple[str, bool]]  # (name, binary), in response order


def parse_infer(body: bytes, header_length: int | None, model: str,
                version: int) -> InferRequest:
    """The request body (JSON, then binary data when ``header_length`` is given)."""
    size = len(body) if header_length is None else header_length
    if not 0 <= size <= len(body):
        raise InvalidArgument(f"Inference-Header-Content-Length={size} is outside the body "
                              f"of {len(body)} bytes")
    header = _json_object(body[:size])
    binary = memoryview(body)[size:]
    request_id = header.get("id", "")
    if not isinstance(request_id, str):
        raise InvalidArgument(f"id={request_id!r} must be a string")
    try:  # JSON's \\uD800 escape reads as a lone surrogate, which no UTF-8 can carry
        request_id.encode("utf-8")
    except UnicodeEncodeError as e:
        raise InvalidArgument(f"id is not valid Unicode text (a lone surrogate at character "
                              f"{e.start}); it is echoed in the response") from None
    raw_params = header.get("parameters", {})
    if not isinstance(raw_params, dict):
        raise InvalidArgument("parameters must be a JSON object")
    binary_default = raw_params.get("binary_data_output", False)
    if not isinstance(binary_default, bool):
        raise InvalidArgument(f"parameters['binary_data_output']={binary_default!r} must be a "
                              f"bool")
    params = parameters({k: v for k, v in raw_params.items() if k not in _TRANSPORT})
    outputs, output_dtype = _outputs(header.get("outputs"), binary_default)
    dtype = datatype(params["datatype"] if output_dtype is None else output_dtype)
    if not dict(outputs)["embeddings"] and dtype != pb.DTYPE_FLOAT32:
        name = DATATYPES[dtype]
        raise InvalidArgument(f"sending {name} data via JSON is not supported: ask for output "
                              f"'embeddings' with parameters {{\"binary_data\": true}} (the "
                              f"binary tensor data extension)")
    inputs = _inputs(header.get("inputs"), binary, params["start_position"])
    options = Options(model, version, params["compose"], dtype, params["truncate"],
                      params["allow_special_tokens"], params["add_special_tokens"])
    return InferRequest(request_id, options, inputs, outputs)


def _json_object(data: bytes | memoryview) -> dict[str, Any]:
    data = bytes(data)
    # orjson (~4x faster on a request's ids) where it reads exactly what json reads: a
    # body with no run of 19 digits (orjson turns integers past 64 bits into floats);
    # json otherwise, wherever orjson refuses (NaN, lone surrogates, other encodings), so
    # that values and messages are json's, and for bodies of many strings (json is the
    # faster there).
    if len(data) <= _ORJSON_MAX and _LONG_NUMBER not in data.translate(_DIGITS):
        try:
            value = orjson.loads(data)
        except orjson.JSONDecodeError:
            pass
        else:
            if not isinstance(value, dict):
                raise InvalidArgument("request body must be a JSON object")
            return value
    try:
        value = json.loads(data)
    except (ValueError, UnicodeDecodeError) as e:
        raise InvalidArgument(f"request body is not valid JSON: {e}") from None
    except RecursionError:  # the parser's own guard, raised at the interpreter's limit
        raise InvalidArgument("request body is not valid JSON: nested deeper than the "
                              "parser allows") from None
    if not isinstance(value, dict):
        raise InvalidArgument("request body must be a JSON object")
    return value


def _outputs(raw: Any, binary_default: bool) -> tuple[list[tuple[str, bool]], Any]:
    """(name, binary) per output in response order, and the embeddings' own datatype."""
    if raw is None or raw == []:  # none named = all, as on gRPC
        return [(name, binary_default) for name in _DEFAULT_ORDER], None
    if not isinstance(raw, list) or not all(isinstance(o, dict) for o in raw):
        raise InvalidArgument("outputs must be a list of objects with a 'name'")
    names = [o.get("name") for o in raw]
    if not all(isinstance(n, str) for n in names):
        raise InvalidArgument("outputs must be a list of objects with a 'name'")
    output_names(names)
    result: list[tuple[str, bool]] = []
    embeddings_dtype = None
    for o in raw:
        p = o.get("parameters", {})
        if not isinstance(p, dict):
            raise InvalidArgument(f"outputs[{o['name']!r}].parameters must be an object")
        if "shared_memory_region" in p:
            raise InvalidArgument("shared-memory outputs are served over gRPC only "
                                  "(inference.GRPCInferenceService on the gRPC port)")
        binary = p.get("binary_data", binary_default)
        if not isinstance(binary, bool):
            raise InvalidArgument(f"outputs[{o['name']!r}].parameters['binary_data']="
                                  f"{binary!r} must be a bool")
        if o["name"] == "embeddings" and "datatype" in p:
            embeddings_dtype = p["datatype"]
        result.append((o["name"], binary))
    return result, embeddings_dtype


def _inputs(raw: Any, binary: memoryview, start_position: int) -> Inputs:
    if not isinstance(raw, list) or len(raw) != 1 or not isinstance(raw[0], dict):
        names = [t.get("name") for t in raw if isinstance(t, dict)] \
            if isinstance(raw, list) else raw
        raise InvalidArgument(f"inputs {names}: {ONE_INPUT}")
    t = raw[0]
    name, dt, shape = t.get("name"), t.get("datatype"), t.get("shape")
    if not isinstance(name, str) or not isinstance(dt, str) or not isinstance(shape, list) \
            or not _INT.issuperset(map(type, shape)):  # JSON integers (a bool is not one)
        raise InvalidArgument("inputs[0] needs 'name' (string), 'datatype' (string) and "
                              "'shape' (list of integers)")
    p = t.get("parameters", {})
    size = p.get("binary_data_size") if isinstance(p, dict) else None
    if size is not None:
        if "data" in t:
            raise InvalidArgument(f"input {name!r}: give 'data' or parameters "
                                  f"'binary_data_size', not both")
        if not isinstance(size, int) or isinstance(size, bool) or not 0 <= size <= len(binary):
            raise InvalidArgument(f"input {name!r}: binary_data_size={size!r} but "
                                  f"{len(binary)} bytes of binary data follow the JSON")
        if size != len(binary):
            raise InvalidArgument(f"{len(binary) - size} bytes after input {name!r}'s binary "
                                  f"data belong to no input")
        return read_tensor(name, dt, shape, start_position, raw=bytes(binary[:size]),
                           raw_field="binary data")
    if len(binary):
        raise InvalidArgument(f"{len(binary)} bytes of binary data follow the JSON but no "
                              f"input has parameters 'binary_data_size'")
    if "data" not in t:
        raise InvalidArgument(f"input {name!r} has no 'data' (or parameters "
                              f"'binary_data_size')")
    data = t["data"]
    if dt == "BYTES" and name == "text":
        if not isinstance(data, list):
            raise InvalidArgument("tensor 'data' must be a JSON list")
        return read_tensor(name, dt, shape, start_position, texts=_JsonTexts(name, data))
    return read_tensor(name, dt, shape, start_position, ints=_ints(name, dt, data),
                       ints_field="data")


def _ints(name: str, datatype: str, data: Any) -> np.ndarray:
    """JSON ``data`` (flat or nested, row-major) as the tensor's values, flat, each checked
    to fit its datatype; the reader checks their count against the shape."""
    dt = ID_DTYPES.get(datatype)
    if dt is None:  # the reader names the expected input names and datatypes, unwalked
        return np.empty(0, np.int64)
    if not isinstance(data, list):
        raise InvalidArgument("tensor 'data' must be a JSON list")
    if dt is _INT64 and 0 < len(data) <= _WALK_IDS and _INT.issuperset(map(type, data)):
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
    if values.size > _WALK_IDS and not (values <= 1).any():
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

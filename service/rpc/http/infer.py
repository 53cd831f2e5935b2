"""The REST form of OIP ``infer``, read: JSON (and binary) tensors in, the engine's request out.

Request body: a JSON object, optionally followed by binary tensor data (Triton's binary
tensor data extension): the ``Inference-Header-Content-Length`` header gives the JSON's
length; each input whose ``parameters`` carry ``binary_data_size`` takes that many bytes
after it, in input order. Parameters, output names and input checks are the gRPC form's
own (``oip_tensors``), so both forms answer a request with the same values and messages.
The usual small request (one short sequence of JSON ids, as a chat turn sends it) is read in
a few steps (``_usual``); any other, or anything in it out of the ordinary, by ``_read``,
which checks every field and words each refusal: the two agree on what both read.

Response: the outputs asked for, in the order asked (default: ``embeddings``, then
``sequence_lengths``). An output is binary when its ``binary_data`` parameter says so, else
when the request's ``binary_data_output`` does; the engine lays the answer out
(``RestReply``: binary outputs after the JSON, in output order, the rows written once
straight into the body). FP16/BF16 travel only as binary: JSON has no such numbers, and
asking for them in JSON is refused here, before any work, as Triton refuses it.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import orjson

from genproto.embedding.v1 import embedding_pb2 as pb
from service.engine import Input, Inputs, Options
from service.errors import InvalidArgument
from service.rpc.http.json_data import INT, WALK_IDS, JsonTexts, ints
from service.rpc.oip_tensors import (
    DATATYPES,
    DTYPE_OF,
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
# The usual request's fields (``_usual``); anything else is read by ``_read``.
_USUAL_KEYS = frozenset({"id", "inputs", "parameters", "outputs"})
_USUAL_INPUT = {"name", "datatype", "shape", "data"}
_USUAL_PARAMETERS = frozenset({"datatype", "binary_data_output"})
_OUTPUT_KEYS = frozenset({"name", "parameters"})
_OUTPUT_PARAMETERS = frozenset({"binary_data"})
_NONE: dict[str, Any] = {}  # an absent object, read only


@dataclass(slots=True)
class InferRequest:
    """A parsed infer request: what admission takes, and how to answer."""

    request_id: str
    options: Options
    inputs: Sequence[Input]
    outputs: list[tuple[str, bool]]  # (name, binary), in response order


def parse_infer(body: bytes, header_length: int | None, model: str,
                version: int) -> InferRequest:
    """The request body (JSON, then binary data when ``header_length`` is given)."""
    size = len(body) if header_length is None else header_length
    if not 0 <= size <= len(body):
        raise InvalidArgument(f"Inference-Header-Content-Length={size} is outside the body "
                              f"of {len(body)} bytes")
    header = _json_object(body[:size])
    if size == len(body):
        usual = _usual(header, model, version)
        if usual is not None:
            return usual
    return _read(header, memoryview(body)[size:], model, version)


def _usual(header: dict[str, Any], model: str, version: int) -> InferRequest | None:
    """The usual small request, read in a few steps: one sequence of at most ``WALK_IDS``
    JSON integer ids, ``input_ids`` INT64 [1, T], no binary data, parameters no more than
    the output ``datatype`` (by its name) and ``binary_data_output``, outputs as ``_read``
    reads them (``_usual_outputs``) without a datatype of their own. None for anything else:
    ``_read`` then decides, and words its refusals. What this accepts, ``_read`` reads the
    same (tests/service/rpc/http/test_infer_parse.py compares the two over many bodies)."""
    inputs = header.get("inputs")
    if not _USUAL_KEYS.issuperset(header) or type(inputs) is not list or len(inputs) != 1:
        return None
    t = inputs[0]
    if type(t) is not dict or t.keys() != _USUAL_INPUT or t["name"] != "input_ids" \
            or t["datatype"] != "INT64":
        return None
    shape, data = t["shape"], t["data"]
    if type(shape) is not list or len(shape) != 2 or not INT.issuperset(map(type, shape)) \
            or type(data) is not list or shape != [1, len(data)] \
            or not 0 < len(data) <= WALK_IDS or not INT.issuperset(map(type, data)):
        return None
    request_id = header.get("id", "")
    params = header.get("parameters", _NONE)
    if type(request_id) is not str or not request_id.isascii() or type(params) is not dict \
            or not _USUAL_PARAMETERS.issuperset(params):
        return None
    binary_default = params.get("binary_data_output", False)
    name = params.get("datatype", "FP32")
    dtype = DTYPE_OF.get(name) if type(name) is str else None
    if type(binary_default) is not bool or dtype is None:
        return None
    outputs = _usual_outputs(header.get("outputs"), binary_default)
    if outputs is None:
        return None
    if dtype != pb.DTYPE_FLOAT32 and not dict(outputs)["embeddings"]:
        return None  # refused by _read: FP16/BF16 travel only as binary
    try:
        ids = np.fromiter(data, np.int64, len(data))  # (T,)
    except OverflowError:  # past int64: _read words it
        return None
    return InferRequest(request_id, Options(model, version, dtype=dtype),
                        [Input("input_ids[0]", ids=ids, value_field="input_ids[0]")], outputs)


def _usual_outputs(raw: Any, binary_default: bool) -> list[tuple[str, bool]] | None:
    """The usual request's outputs, (name, binary) in response order: ``embeddings`` alone
    with at most its ``binary_data`` read here in a few steps, any other as ``_outputs``
    reads them; None where it refuses them or one names its own datatype (``_read`` then
    words it)."""
    if type(raw) is list and len(raw) == 1:
        o = raw[0]
        if type(o) is dict and o.get("name") == "embeddings" and _OUTPUT_KEYS.issuperset(o):
            p = o.get("parameters", _NONE)
            binary = p.get("binary_data", binary_default) if type(p) is dict else None
            if type(binary) is bool and _OUTPUT_PARAMETERS.issuperset(p):
                return [("embeddings", binary)]
    try:  # the general reading: any order, any output; a datatype of its own is not usual
        outputs, output_dtype = _outputs(raw, binary_default)
    except InvalidArgument:
        return None
    return outputs if output_dtype is None else None


def _read(header: dict[str, Any], binary: memoryview, model: str,
          version: int) -> InferRequest:
    """Any infer request: its JSON header read and checked field by field, and the binary
    data after it."""
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
            or not INT.issuperset(map(type, shape)):  # JSON integers (a bool is not one)
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
        return read_tensor(name, dt, shape, start_position, texts=JsonTexts(name, data))
    return read_tensor(name, dt, shape, start_position, ints=ints(name, dt, data),
                       ints_field="data")



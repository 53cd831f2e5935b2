"""Reading an OIP ``ModelInferRequest``: its parameters, outputs and input tensors.

Pure functions from the message to admission's vocabulary (``Input``, proto enum numbers)
or an ``InvalidArgument`` naming the tensor, parameter and limit.
"""

from __future__ import annotations

import struct
from typing import Any

import numpy as np

from genproto.embedding.v1 import embedding_pb2 as pb
from genproto.inference.v2 import grpc_service_pb2 as oip
from service.dtypes import BY_OIP, BY_WIRE
from service.engine.admission import Input
from service.errors import InvalidArgument

__all__ = ["DATATYPES", "output_dtype", "read_input", "request_parameters",
           "requested_outputs"]

DATATYPES: dict[int, str] = {wire: d.oip for wire, d in BY_WIRE.items()}  # the OIP names
_DTYPE_OF = {name: d.wire for name, d in BY_OIP.items()}
_COMPOSE: dict[str, int] = {"token_plus_position": pb.COMPOSE_TOKEN_PLUS_POSITION,
            "token_only": pb.COMPOSE_TOKEN_ONLY, "position_only": pb.COMPOSE_POSITION_ONLY}
_TRUNCATE: dict[str, int] = {"none": pb.TRUNCATE_NONE, "right": pb.TRUNCATE_RIGHT,
                             "left": pb.TRUNCATE_LEFT}
_OUTPUTS = ("embeddings", "sequence_lengths")
_ID_TYPES: dict[str, np.dtype[Any]] = {"INT64": np.dtype("<i8"), "INT32": np.dtype("<i4")}
# Set by Triton clients for scheduling; meaningless for a lookup, so accepted and ignored.
_IGNORED = {"priority", "timeout"}
_MAX_START = 2**32 - 1  # start_position is a uint32 in the native contract


def _value(p: oip.InferParameter) -> Any:
    kind = p.WhichOneof("parameter_choice")
    return None if kind is None else getattr(p, kind)


def request_parameters(request: oip.ModelInferRequest) -> dict[str, Any]:
    """``start_position``, ``compose``, ``truncate``, ``allow_special_tokens`` (and the
    raw ``datatype``), with defaults; unknown names are refused, not silently ignored."""
    known = {"start_position", "compose", "truncate", "allow_special_tokens", "datatype"}
    raw = {k: _value(v) for k, v in request.parameters.items() if k not in _IGNORED}
    unknown = sorted(set(raw) - known)
    if unknown:
        raise InvalidArgument(f"parameters {unknown} are not known; this model takes "
                              f"{sorted(known)}")
    start = raw.get("start_position", 0)
    if isinstance(start, bool) or not isinstance(start, int) or not 0 <= start <= _MAX_START:
        raise InvalidArgument(f"parameters['start_position']={start!r} must be an integer "
                              f"in [0, {_MAX_START}]")
    return {"start_position": start,
            "compose": _choice(raw, "compose", _COMPOSE, "token_plus_position"),
            "truncate": _choice(raw, "truncate", _TRUNCATE, "none"),
            "allow_special_tokens": _flag(raw, "allow_special_tokens"),
            "datatype": raw.get("datatype")}


def _choice(raw: dict[str, Any], name: str, choices: dict[str, int], default: str) -> int:
    value = raw.get(name, default)
    if not isinstance(value, str) or value.lower() not in choices:
        raise InvalidArgument(f"parameters[{name!r}]={value!r} must be one of "
                              f"{sorted(choices)}")
    return choices[value.lower()]


def _flag(raw: dict[str, Any], name: str) -> bool:
    value = raw.get(name, False)
    if not isinstance(value, bool):
        raise InvalidArgument(f"parameters[{name!r}]={value!r} must be a bool")
    return value


def requested_outputs(request: oip.ModelInferRequest
                      ) -> tuple[set[str], tuple[str, int, int | None] | None]:
    """The outputs to return (none requested = all) and the embeddings' shared-memory
    (region, offset, byte_size bound or None) if it names one."""
    names = [o.name for o in request.outputs]
    for name in names:
        if name not in _OUTPUTS:
            raise InvalidArgument(f"output {name!r} is not an output of this model "
                                  f"(outputs: {', '.join(_OUTPUTS)})")
    wanted = set(names) if names else set(_OUTPUTS)
    if "embeddings" not in wanted:
        raise InvalidArgument("outputs must include 'embeddings'")
    for o in request.outputs:
        if o.name == "embeddings" and "shared_memory_region" in o.parameters:
            region = _value(o.parameters["shared_memory_region"])
            offset = _value(o.parameters["shared_memory_offset"]) \
                if "shared_memory_offset" in o.parameters else 0
            limit = _value(o.parameters["shared_memory_byte_size"]) \
                if "shared_memory_byte_size" in o.parameters else None
            if (not isinstance(region, str) or not isinstance(offset, int) or offset < 0
                    or isinstance(offset, bool) or isinstance(limit, bool)
                    or not (limit is None or (isinstance(limit, int) and limit >= 0))):
                raise InvalidArgument("outputs['embeddings']: shared_memory_region must be a "
                                      "string, shared_memory_offset and "
                                      "shared_memory_byte_size non-negative ints")
            return wanted, (region, offset, limit)
    return wanted, None


def output_dtype(request: oip.ModelInferRequest, params: dict[str, Any]) -> int:
    """The embeddings' datatype: the output's ``datatype`` parameter, else the request's,
    else FP32."""
    value = params["datatype"]
    for o in request.outputs:
        if o.name == "embeddings" and "datatype" in o.parameters:
            value = _value(o.parameters["datatype"])
    if value is None:
        return pb.DTYPE_FLOAT32
    if not isinstance(value, str) or value.upper() not in _DTYPE_OF:
        raise InvalidArgument(f"datatype={value!r} of output 'embeddings' must be one of "
                              f"{sorted(_DTYPE_OF)}")
    return _DTYPE_OF[value.upper()]


def read_input(request: oip.ModelInferRequest, start_position: int) -> list[Input]:
    """The sequences of the one input tensor, ``input_ids`` [B, T] or ``text`` [B]."""
    if len(request.inputs) != 1:
        names = [t.name for t in request.inputs]
        raise InvalidArgument(f"inputs {names}: give exactly one of 'input_ids' [B, T] "
                              f"(INT64/INT32) or 'text' [B] (BYTES)")
    tensor = request.inputs[0]
    raw = request.raw_input_contents[0] if request.raw_input_contents else None
    if tensor.name == "input_ids":
        return _ids(tensor, raw, start_position)
    if tensor.name == "text":
        return _texts(tensor, raw, start_position)
    raise InvalidArgument(f"input {tensor.name!r} is not an input of this model "
                          f"(inputs: input_ids, text)")


def _ids(tensor: Any, raw: bytes | None, start_position: int) -> list[Input]:
    dt = _ID_TYPES.get(tensor.datatype)
    if dt is None:
        raise InvalidArgument(f"input 'input_ids' has datatype {tensor.datatype!r}; "
                              f"expected INT64 or INT32")
    shape = list(tensor.shape)
    if len(shape) != 2 or min(shape) < 0:
        raise InvalidArgument(f"input 'input_ids' has shape {shape}; expected [B, T]")
    B, T = shape
    if B == 0:
        raise InvalidArgument("input 'input_ids' has B=0 sequences; give at least one")
    if raw is not None:
        if len(raw) != B * T * dt.itemsize:
            raise InvalidArgument(f"input 'input_ids' {tensor.datatype} {shape} needs "
                                  f"{B * T * dt.itemsize} bytes of raw_input_contents; got "
                                  f"{len(raw)}")
        ids = np.frombuffer(raw, dtype=dt).astype(np.int64).reshape(B, T)
    else:
        typed = (tensor.contents.int64_contents if dt.itemsize == 8
                 else tensor.contents.int_contents)
        if len(typed) != B * T:
            raise InvalidArgument(f"input 'input_ids' {shape} needs {B * T} values in "
                                  f"contents; got {len(typed)}")
        ids = np.array(typed, dtype=np.int64).reshape(B, T)
    return [Input(f"input_ids[{b}]", ids=ids[b], start_position=start_position,
                  value_field=f"input_ids[{b}]") for b in range(B)]


def _texts(tensor: Any, raw: bytes | None, start_position: int) -> list[Input]:
    if tensor.datatype != "BYTES":
        raise InvalidArgument(f"input 'text' has datatype {tensor.datatype!r}; expected BYTES")
    shape = list(tensor.shape)
    if len(shape) not in (1, 2) or (len(shape) == 2 and shape[1] != 1) or shape[0] <= 0:
        raise InvalidArgument(f"input 'text' has shape {shape}; expected [B] (or [B, 1])")
    B = shape[0]
    items = _split_bytes(raw, B) if raw is not None else list(tensor.contents.bytes_contents)
    if len(items) != B:
        raise InvalidArgument(f"input 'text' {shape} needs {B} strings; got {len(items)}")
    inputs = []
    for b, item in enumerate(items):
        try:
            text = item.decode("utf-8")
        except UnicodeDecodeError as e:
            raise InvalidArgument(f"input 'text'[{b}] is not valid UTF-8 (byte {e.start})") \
                from None
        inputs.append(Input(f"text[{b}]", text=text, start_position=start_position,
                            value_field=f"text[{b}]"))
    return inputs


def _split_bytes(raw: bytes, count: int) -> list[bytes]:
    """Triton's raw BYTES layout: each element a 4-byte little-endian length, then data."""
    items: list[bytes] = []
    at = 0
    while at < len(raw):
        if at + 4 > len(raw):
            raise InvalidArgument("input 'text': raw_input_contents ends inside a length")
        (n,) = struct.unpack_from("<I", raw, at)
        if at + 4 + n > len(raw):
            raise InvalidArgument(f"input 'text'[{len(items)}]: length {n} runs past the end "
                                  f"of raw_input_contents")
        items.append(raw[at + 4: at + 4 + n])
        at += 4 + n
        if len(items) > count:
            break
    return items

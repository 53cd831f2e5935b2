"""What the Open Inference Protocol's two wires share: reading a request's parameters,
outputs and input tensor, and describing a model (``ModelMetadata``).

The gRPC front (``oip.py``) and the REST front (``http/``) both read their tensors here, so
both answer a request with the same values and messages; pure functions from the request
to the engine's vocabulary (``Input``, proto enum numbers) or an ``InvalidArgument`` naming
the tensor, parameter and limit.
"""

from __future__ import annotations

import struct
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from genproto.embedding.v1 import embedding_pb2 as pb
from genproto.inference.v2 import grpc_service_pb2 as oip
from service.dtypes import BY_OIP, BY_WIRE
from service.engine import Input, Inputs, LoadedModel
from service.errors import InvalidArgument, quote

__all__ = ["DATATYPES", "DTYPE_OF", "ID_DTYPES", "ONE_INPUT", "datatype", "model_metadata",
           "model_version", "output_dtype", "output_names", "parameters", "read_input",
           "read_tensor", "request_parameters", "requested_outputs"]

DATATYPES: dict[int, str] = {wire: d.oip for wire, d in BY_WIRE.items()}  # the OIP names
# The wire dtype of each OIP name, as written exactly ("FP32"; ``datatype`` also reads "fp32").
DTYPE_OF: dict[str, int] = {name: d.wire for name, d in BY_OIP.items()}
_COMPOSE: dict[str, int] = {"token_plus_position": pb.COMPOSE_TOKEN_PLUS_POSITION,
            "token_only": pb.COMPOSE_TOKEN_ONLY, "position_only": pb.COMPOSE_POSITION_ONLY}
_TRUNCATE: dict[str, int] = {"none": pb.TRUNCATE_NONE, "right": pb.TRUNCATE_RIGHT,
                             "left": pb.TRUNCATE_LEFT}
_OUTPUTS = ("embeddings", "sequence_lengths")
# input_ids datatypes, as both wires read them
ID_DTYPES: dict[str, np.dtype[Any]] = {"INT64": np.dtype("<i8"), "INT32": np.dtype("<i4")}
# Set by Triton clients for scheduling; meaningless for a lookup, so accepted and ignored.
_IGNORED = {"priority", "timeout"}
_KNOWN = frozenset({"start_position", "compose", "truncate", "allow_special_tokens",
                    "datatype", "add_special_tokens"})
_MAX_START = 2**32 - 1  # start_position is a uint32 in the native contract
ONE_INPUT = "give exactly one of 'input_ids' [B, T] (INT64/INT32) or 'text' [B] (BYTES)"


_MAX_VERSION = 2**63 - 1  # versions are int64 in the native contract


def model_version(text: str) -> int:
    """OIP versions are strings: "" = newest; otherwise a positive integer in ASCII digits
    (``str.isdigit`` also accepts "²" and other digits ``int`` refuses) within int64."""
    if not text:
        return 0
    if not (text.isascii() and text.isdigit() and len(text) <= 19
            and 0 < int(text) <= _MAX_VERSION):
        raise InvalidArgument(f"model_version={quote(text, 32)} must be empty or a positive "
                              f"integer")
    return int(text)


def _value(p: oip.InferParameter) -> Any:
    kind = p.WhichOneof("parameter_choice")
    return None if kind is None else getattr(p, kind)


def request_parameters(request: oip.ModelInferRequest) -> dict[str, Any]:
    """The request's parameters, read by ``parameters``."""
    return parameters({k: _value(v) for k, v in request.parameters.items()})


def parameters(values: Mapping[str, Any]) -> dict[str, Any]:
    """``start_position``, ``compose``, ``truncate``, ``allow_special_tokens``,
    ``add_special_tokens`` (and the raw ``datatype``), with defaults; unknown names are
    refused, not silently ignored. ``values`` are plain Python values: the gRPC form's
    ``InferParameter``s, or the REST form's JSON ``parameters`` (its transport parameters
    already taken out)."""
    known = _KNOWN
    raw = {k: v for k, v in values.items() if k not in _IGNORED}
    if not raw.keys() <= known:
        unknown = sorted(set(raw) - known)
        shown = ", ".join(quote(name, 32) for name in unknown[:4])
        more = f" and {len(unknown) - 4} more" if len(unknown) > 4 else ""
        raise InvalidArgument(f"parameters [{shown}]{more} are not known; this model takes "
                              f"{sorted(known)}")
    start = raw.get("start_position", 0)
    if isinstance(start, bool) or not isinstance(start, int) or not 0 <= start <= _MAX_START:
        raise InvalidArgument(f"parameters['start_position']={quote(start, 32)} must be an "
                              f"integer "
                              f"in [0, {_MAX_START}]")
    # An absent parameter takes its default without the checks a given one needs.
    return {"start_position": start,
            "compose": (_choice(raw, "compose", _COMPOSE) if "compose" in raw
                        else pb.COMPOSE_TOKEN_PLUS_POSITION),
            "truncate": (_choice(raw, "truncate", _TRUNCATE) if "truncate" in raw
                         else pb.TRUNCATE_NONE),
            "allow_special_tokens": ("allow_special_tokens" in raw
                                     and _flag(raw, "allow_special_tokens")),
            # None (absent): the model's default, as AutoTokenizer applies it
            "add_special_tokens": (None if "add_special_tokens" not in raw
                                   else _flag(raw, "add_special_tokens")),
            "datatype": raw.get("datatype")}


def _choice(raw: dict[str, Any], name: str, choices: dict[str, int]) -> int:
    value = raw[name]
    if not isinstance(value, str) or value.lower() not in choices:
        raise InvalidArgument(f"parameters[{name!r}]={quote(value, 32)} must be one of "
                              f"{sorted(choices)}")
    return choices[value.lower()]


def _flag(raw: dict[str, Any], name: str) -> bool:
    value = raw.get(name, False)
    if not isinstance(value, bool):
        raise InvalidArgument(f"parameters[{name!r}]={quote(value, 32)} must be a bool")
    return value


def requested_outputs(request: oip.ModelInferRequest
                      ) -> tuple[set[str], tuple[str, int, int | None] | None]:
    """The outputs to return (none requested = all) and the embeddings' shared-memory
    (region, offset, byte_size bound or None) if it names one."""
    wanted = output_names([o.name for o in request.outputs])
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


def output_names(names: list[str]) -> set[str]:
    """The outputs to return, by name (none named = all), each checked; ``embeddings``
    must be among them."""
    for name in names:
        if name not in _OUTPUTS:
            raise InvalidArgument(f"output {quote(name)} is not an output of this model "
                                  f"(outputs: {', '.join(_OUTPUTS)})")
    wanted = set(names) if names else set(_OUTPUTS)
    if "embeddings" not in wanted:
        raise InvalidArgument("outputs must include 'embeddings'")
    return wanted


def output_dtype(request: oip.ModelInferRequest, params: dict[str, Any]) -> int:
    """The embeddings' datatype: the output's ``datatype`` parameter, else the request's,
    else FP32."""
    value = params["datatype"]
    for o in request.outputs:
        if o.name == "embeddings" and "datatype" in o.parameters:
            value = _value(o.parameters["datatype"])
    return datatype(value)


def datatype(value: Any) -> int:
    """A ``datatype`` parameter's value (None = FP32) as the wire dtype enum."""
    if value is None:
        return pb.DTYPE_FLOAT32
    if not isinstance(value, str) or value.upper() not in DTYPE_OF:
        raise InvalidArgument(f"datatype={quote(value, 32)} of output 'embeddings' must be "
                              f"one of "
                              f"{sorted(DTYPE_OF)}")
    return DTYPE_OF[value.upper()]


def read_input(request: oip.ModelInferRequest, start_position: int) -> Inputs:
    """The sequences of the one input tensor, ``input_ids`` [B, T] or ``text`` [B]."""
    if len(request.inputs) != 1:
        names = ", ".join(quote(t.name, 32) for t in request.inputs[:4])
        raise InvalidArgument(f"{len(request.inputs)} input tensors [{names}]: {ONE_INPUT}")
    tensor = request.inputs[0]
    raw = request.raw_input_contents[0] if request.raw_input_contents else None
    contents = tensor.contents
    ints = contents.int64_contents if tensor.datatype == "INT64" else contents.int_contents
    return read_tensor(tensor.name, tensor.datatype, tensor.shape, start_position, raw=raw,
                       ints=ints, texts=contents.bytes_contents)


def read_tensor(name: str, datatype: str, shape: Sequence[int], start_position: int, *,
                raw: bytes | None = None, ints: Sequence[int] | np.ndarray = (),
                texts: Sequence[bytes] = (), raw_field: str = "raw_input_contents",
                ints_field: str = "contents") -> Inputs:
    """The sequences of one input tensor, from its binary form (``raw``) or else its typed
    values (``ints`` for ids, flat; ``texts`` for UTF-8 strings). Messages name ``raw`` and
    ``ints`` as the client's wire does (gRPC's ``raw_input_contents`` and ``contents`` by
    default).

    The declared shape is checked against the values here, in O(1); the sequences are
    built only when admission reads them, after it has checked B against its limit.
    """
    if name == "input_ids":
        return _ids(datatype, shape, raw, ints, start_position, raw_field, ints_field)
    if name == "text":
        return _texts(datatype, shape, raw, texts, start_position, raw_field)
    raise InvalidArgument(f"input {quote(name)} is not an input of this model "
                          f"(inputs: input_ids, text)")


def _shape(declared: Sequence[int], name: str, expected: str,
           ranks: tuple[int, ...]) -> list[int]:
    """The declared shape: the right rank and every dimension >= 1 (a zero dimension
    would declare B sequences of nothing, each costing work before being refused)."""
    shape = list(declared)
    if len(shape) not in ranks or any(d < 1 for d in shape):
        shown = shape if len(shape) <= 4 else [*shape[:4], "..."]
        raise InvalidArgument(f"input {name!r} has shape {shown}; expected {expected} with "
                              f"every dimension >= 1")
    return shape


def _ids(datatype: str, shape: Sequence[int], raw: bytes | None,
         ints: Sequence[int] | np.ndarray, start_position: int, raw_field: str,
         ints_field: str) -> Inputs:
    dt = ID_DTYPES.get(datatype)
    if dt is None:
        raise InvalidArgument(f"input 'input_ids' has datatype {quote(datatype, 16)}; "
                              f"expected INT64 or INT32")
    B, T = _shape(shape, "input_ids", "[B, T]", (2,))
    count = B * T  # Python ints: no overflow; compared with what was sent before any use
    if raw is not None:
        if len(raw) != count * dt.itemsize:
            raise InvalidArgument(f"input 'input_ids' {datatype} [{B}, {T}] needs "
                                  f"{count * dt.itemsize} bytes of {raw_field}; got "
                                  f"{len(raw)}")
    elif len(ints) != count:
        raise InvalidArgument(f"input 'input_ids' [{B}, {T}] needs {count} values in "
                              f"{ints_field}; got {len(ints)}")

    def build() -> list[Input]:
        if raw is not None:
            ids = np.frombuffer(raw, dtype=dt).astype(np.int64).reshape(B, T)
        else:
            ids = np.asarray(ints, dtype=np.int64).reshape(B, T)  # REST's array: no copy
        return [Input(f"input_ids[{b}]", ids=ids[b], start_position=start_position,
                      value_field=f"input_ids[{b}]") for b in range(B)]

    return Inputs(B, build)


def _texts(datatype: str, declared: Sequence[int], raw: bytes | None,
           texts: Sequence[bytes], start_position: int, raw_field: str) -> Inputs:
    if datatype != "BYTES":
        raise InvalidArgument(f"input 'text' has datatype {quote(datatype, 16)}; "
                              f"expected BYTES")
    shape = _shape(declared, "text", "[B] (or [B, 1])", (1, 2))
    if len(shape) == 2 and shape[1] != 1:
        raise InvalidArgument(f"input 'text' has shape {shape}; expected [B] (or [B, 1])")
    B = shape[0]
    if raw is None and len(texts) != B:
        raise InvalidArgument(f"input 'text' {shape} needs {B} strings; got {len(texts)}")
    if raw is not None and len(raw) < 4 * B:  # each element has a 4-byte length
        raise InvalidArgument(f"input 'text' {shape} needs {B} strings; {raw_field} "
                              f"has {len(raw)} bytes, fewer than their {4 * B} length bytes")

    def build() -> list[Input]:
        items = _split_bytes(raw, B, raw_field) if raw is not None else list(texts)
        if len(items) != B:
            raise InvalidArgument(f"input 'text' {shape} needs {B} strings; got {len(items)}")
        inputs = []
        for b, item in enumerate(items):
            try:
                text = item.decode("utf-8")
            except UnicodeDecodeError as e:
                raise InvalidArgument(f"input 'text'[{b}] is not valid UTF-8 (byte "
                                      f"{e.start})") from None
            inputs.append(Input(f"text[{b}]", text=text, start_position=start_position,
                                value_field=f"text[{b}]"))
        return inputs

    return Inputs(B, build)


def _split_bytes(raw: bytes, count: int, field: str) -> list[bytes]:
    """Triton's raw BYTES layout: each element a 4-byte little-endian length, then data."""
    items: list[bytes] = []
    at = 0
    while at < len(raw):
        if at + 4 > len(raw):
            raise InvalidArgument(f"input 'text': {field} ends inside a length")
        (n,) = struct.unpack_from("<I", raw, at)
        if at + 4 + n > len(raw):
            raise InvalidArgument(f"input 'text'[{len(items)}]: length {n} runs past the end "
                                  f"of {field}")
        items.append(raw[at + 4: at + 4 + n])
        at += 4 + n
        if len(items) > count:
            break
    return items


def model_metadata(model: LoadedModel) -> dict[str, Any]:
    """``ModelMetadata`` as both wires state it: the tensors ModelInfer takes and returns
    (``embeddings`` at the width the default compose serves) and the model's family,
    rules, tokenizer and width as ``parameters`` (an extension field)."""
    m = model.checkpoint.manifest
    tok = m.tokenizer
    return {
        "name": model.name, "versions": [str(model.version)], "platform": "embedding",
        "inputs": [{"name": "input_ids", "datatype": "INT64", "shape": [-1, -1]},
                   {"name": "text", "datatype": "BYTES", "shape": [-1]}],
        "outputs": [{"name": "embeddings", "datatype": "FP32",
                     "shape": [-1, -1, model.tables.width]},
                    {"name": "sequence_lengths", "datatype": "INT64", "shape": [-1]}],
        "parameters": {"family": m.family, "rules": m.rules.describe(),
                       "tokenizer": ("none (ids-only)" if tok is None
                                     else f"{tok.kind}:{tok.file}"),
                       "hidden_size": m.width}}

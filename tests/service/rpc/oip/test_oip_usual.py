"""ModelInfer's two readers agree: what the usual small request's reader (``usual_infer``)
accepts, the general reader (``read_infer``) reads the same, for requests built from every
field's valid and invalid forms; and the usual request does take the short one."""

from __future__ import annotations

import itertools
from typing import Any

import numpy as np
import pytest

from genproto.embedding.v1 import embedding_pb2 as pb
from genproto.inference.v2 import grpc_service_pb2 as oip
from service.errors import InvalidArgument
from service.rpc.oip import Read, read_infer, usual_infer

IDS = [50256, 0, 31373, 7]
Tensor = oip.ModelInferRequest.InferInputTensor
Output = oip.ModelInferRequest.InferRequestedOutputTensor

# Each field's forms: valid ones, and ones the usual reader must leave to the general one.
# An ids form: (ids, how they travel, the shape declared: "T" is their count).
IDS_FORMS: list[tuple[list[int], str, list[Any]]] = [
    (IDS, "raw", [1, "T"]), ([1], "raw", [1, "T"]), (list(range(300)), "raw", [1, "T"]),
    (IDS, "raw", ["T"]), (IDS, "raw", [1, 1, "T"]), (IDS, "raw", [2, 2]),
    (IDS, "raw", [1, "T+1"]), (IDS, "raw", [1, 0]), (IDS, "raw", [-1, "T"]),
    (IDS, "raw-short", [1, "T"]), (IDS, "raw+contents", [1, "T"]), (IDS, "contents", [1, "T"]),
    (IDS, "two-raw", [1, "T"]), ([], "raw", [1, 0]), ([2**40, -1], "raw", [1, "T"]),
]
TENSOR: list[dict[str, Any]] = [{}, {"name": "text"}, {"datatype": "INT32"},
                                {"datatype": "int64"}, {"parameters": {"x": 1}}]
PARAMETERS: list[dict[str, Any]] = [{}, {"datatype": "BF16"}, {"datatype": "fp16"},
                                    {"datatype": 1}, {"datatype": "INT8"},
                                    {"start_position": 3}, {"compose": "token_only"},
                                    {"priority": 1}, {"unknown": 1},
                                    {"datatype": "FP16", "start_position": 0}]
OUTPUTS: list[list[tuple[str, dict[str, Any]]]] = [
    [], [("embeddings", {})], [("sequence_lengths", {})],
    [("embeddings", {}), ("sequence_lengths", {})], [("embeddings", {"datatype": "BF16"})],
    [("embeddings", {"binary_data": True})], [("embeddings", {"shared_memory_region": "r"})],
    [("x", {})], [("embeddings", {}), ("embeddings", {})]]
VERSION = ["", "2", "0"]
ID = ["", "r-é"]
EXTRA_INPUT = [False, True]


def _set(parameters: Any, values: dict[str, Any]) -> None:
    for key, value in values.items():
        if isinstance(value, bool):
            parameters[key].bool_param = value
        elif isinstance(value, int):
            parameters[key].int64_param = value
        else:
            parameters[key].string_param = value


def request(form: tuple[list[int], str, list[Any]], tensor: dict[str, Any],
            parameters: dict[str, Any], outputs: list[tuple[str, dict[str, Any]]],
            version: str, request_id: str, extra_input: bool) -> oip.ModelInferRequest:
    """A ModelInferRequest from one form of each field."""
    ids, travel, shape = form
    T = len(ids)
    dims = {"T": T, "T+1": T + 1}
    t = Tensor(name=tensor.get("name", "input_ids"), datatype=tensor.get("datatype", "INT64"),
               shape=[dims.get(d, d) for d in shape])
    _set(t.parameters, tensor.get("parameters", {}))
    r = oip.ModelInferRequest(model_name="m", model_version=version, id=request_id,
                              inputs=[t])
    raw = np.asarray(ids, dtype="<i8").tobytes()
    if "raw" in travel:
        r.raw_input_contents.append(raw[:-1] if travel == "raw-short" else raw)
    if travel == "two-raw":  # a second buffer, for an input that is not there
        r.raw_input_contents.append(raw)
    if "contents" in travel:
        r.inputs[0].contents.int64_contents.extend(ids)
    if extra_input:
        r.inputs.append(Tensor(name="text", datatype="BYTES", shape=[1]))
    _set(r.parameters, parameters)
    for name, params in outputs:
        o = Output(name=name)
        _set(o.parameters, params)
        r.outputs.append(o)
    return r


def read(r: Read) -> tuple[Any, ...]:
    """What admission and the answer take from a read request."""
    options, inputs, reply = r
    return ([getattr(options, k) for k in type(options).__slots__],
            [(i.field, i.value_field, i.start_position, i.text, np.asarray(i.ids).dtype,
              np.asarray(i.ids).tolist()) for i in inputs],
            reply._id, reply._lengths, reply.region)


def outcome(fn: Any, r: oip.ModelInferRequest) -> Any:
    try:
        return fn(r)
    except InvalidArgument as e:
        return e


def test_the_usual_reader_reads_what_the_general_one_reads() -> None:
    usual = n = 0
    forms = itertools.product(IDS_FORMS, TENSOR, PARAMETERS, OUTPUTS, VERSION, ID,
                              EXTRA_INPUT)
    for fields in forms:
        n += 1
        r = request(*fields)
        short, general = outcome(usual_infer, r), outcome(read_infer, r)
        if short is None:
            continue
        if isinstance(short, InvalidArgument):  # a bad version: the general one refuses it so
            assert isinstance(general, InvalidArgument), fields
            assert str(general) == str(short), fields
            continue
        usual += 1
        assert not isinstance(general, InvalidArgument), (fields, general)
        assert read(short) == read(general), fields
    assert n == 81_000
    # raw [1, T] of four ids forms (and one with typed contents too, which the raw bytes
    # override), no tensor parameters, no request parameters or the datatype alone by its
    # name, outputs none or embeddings, two readable versions, every id, one input
    assert usual == 5 * 2 * 2 * 2 * 2


@pytest.mark.parametrize(("outputs", "lengths"), [([], True), ([("embeddings", {})], False)])
@pytest.mark.parametrize(("parameters", "dtype"), [({}, pb.DTYPE_FLOAT32),
                                                   ({"datatype": "BF16"}, pb.DTYPE_BFLOAT16)])
def test_the_usual_request_takes_the_short_read(
        outputs: list[tuple[str, dict[str, Any]]], lengths: bool, parameters: dict[str, Any],
        dtype: int) -> None:
    r = request((IDS, "raw", [1, "T"]), {}, parameters, outputs, "", "r-1", False)
    read_ = usual_infer(r)
    assert read_ is not None
    options, (only,), reply = read_
    assert (options.model, options.version, options.dtype, options.in_message) == \
        ("m", 0, dtype, True)
    assert (only.field, only.ids.tolist(), only.ids.dtype, only.ids.flags.writeable) == \
        ("input_ids[0]", IDS, np.int64, True)
    assert (reply._id, reply._lengths, reply.region) == ("r-1", lengths, None)

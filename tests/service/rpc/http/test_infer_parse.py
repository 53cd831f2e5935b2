"""The REST infer body's two readers agree: what the usual small request's reader
(``_usual``) accepts, the general reader (``_read``) reads the same, for bodies built from
every field's valid and invalid forms; and the usual request does take the short one."""

from __future__ import annotations

import itertools
import random
from typing import Any

import numpy as np
import pytest

from service.engine import Input
from service.errors import InvalidArgument
from service.rpc.http import infer
from service.rpc.http.infer import InferRequest, _read, _usual, parse_infer

IDS = [50256, 0, 31373, 7]
# Each field's forms: valid ones, and ones the usual reader must leave to the general one.
DATA: list[Any] = [IDS, [1], list(range(64)), [IDS], list(range(65)), [], [1, True], [1.0],
                   ["5"], [1, None], [2**63], [-(2**63)], [-1], [[1], [2]]]
SHAPE: list[Any] = [[1, "T"], "T", ["T"], [1, 1, "T"], [True, "T"], [1.0, "T"], [2, "T"],
                    [1, 0], [1, "T+1"], None]
TENSOR: list[dict[str, Any]] = [{}, {"name": "text"}, {"datatype": "INT32"},
                                {"datatype": "int64"}, {"parameters": {}},
                                {"parameters": {"binary_data_size": 8}}, {"extra": 1}]
PARAMETERS: list[Any] = [None, {}, {"datatype": "FP32"}, {"datatype": "BF16"},
                         {"datatype": "FP16"}, {"binary_data_output": True},
                         {"datatype": "BF16", "binary_data_output": True},
                         {"datatype": "fp32"}, {"datatype": None}, {"datatype": 1},
                         {"datatype": "INT8"}, {"binary_data_output": 1},
                         {"start_position": 2}, {"compose": "token_only"}, {"truncate": "left"},
                         {"priority": 1}, {"unknown": 1}, []]
OUTPUTS: list[Any] = [
    None, [], [{"name": "embeddings"}],
    [{"name": "embeddings", "parameters": {"binary_data": True}}],
    [{"name": "embeddings", "parameters": {"binary_data": False}}],
    [{"name": "sequence_lengths", "parameters": {"binary_data": True}},
     {"name": "embeddings", "parameters": {"binary_data": True}}],
    [{"name": "embeddings", "parameters": {"binary_data": True}}, {"name": "sequence_lengths"}],
    [{"name": "sequence_lengths"}], [{"name": "embeddings"}, {"name": "embeddings"}],
    [{"name": "x"}], [{"name": ["embeddings"]}], [{"name": "embeddings", "extra": 1}],
    [{"name": "embeddings", "parameters": {"datatype": "BF16", "binary_data": True}}],
    [{"name": "embeddings", "parameters": {"binary_data": 1}}],
    [{"name": "embeddings", "parameters": {"shared_memory_region": "r"}}],
    [{"name": "embeddings", "parameters": []}], ["embeddings"], {"name": "embeddings"},
    [{"name": "embeddings"}, {"name": "sequence_lengths"}, {"name": "x"}],
    [{"name": "embeddings", "parameters": {}}],
    [{"name": "embeddings", "parameters": {"binary_data": None}}],
    [{"name": "embeddings", "parameters": {"binary_data": True, "unknown": 1}}]]
ID: list[Any] = [None, "", "r-1", "é", "\ud800", 5]


def body(data: Any, shape: Any, tensor: dict[str, Any], parameters: Any, outputs: Any,
         request_id: Any) -> dict[str, Any]:
    """A request's JSON object from one form of each field (None: the field is absent)."""
    T = len(data)
    dims = {"T": T, "T+1": T + 1}
    t: dict[str, Any] = {"name": "input_ids", "datatype": "INT64", "data": data}
    if shape is not None:
        t["shape"] = [dims.get(d, d) for d in shape] if isinstance(shape, list) \
            else [1, T]
    t.update(tensor)
    if "binary_data_size" in t.get("parameters", {}):
        del t["data"]
    header: dict[str, Any] = {"inputs": [t]}
    for key, value in (("parameters", parameters), ("outputs", outputs), ("id", request_id)):
        if value is not None:
            header[key] = value
    return header


def same(a: InferRequest, b: InferRequest) -> bool:
    """Equal as admission and the answer read them."""
    def inputs(r: InferRequest) -> list[tuple[Any, ...]]:
        return [(i.field, i.value_field, i.start_position, i.text, np.asarray(i.ids).dtype,
                 np.asarray(i.ids).tolist()) for i in r.inputs]

    def options(r: InferRequest) -> list[Any]:
        return [getattr(r.options, k) for k in type(r.options).__slots__]

    return (a.request_id, a.outputs, options(a), inputs(a)) == \
        (b.request_id, b.outputs, options(b), inputs(b))


def forms() -> list[tuple[Any, ...]]:
    """Every combination of each field's first forms (the ones the usual reader may take),
    each other form of one field among them, and a sample of the whole product."""
    fields = (DATA, SHAPE, TENSOR, PARAMETERS, OUTPUTS, ID)
    usual = [f[:n] for f, n in zip(fields, (3, 2, 1, 7, 7, 3))]
    out = list(itertools.product(*usual))
    rng = random.Random(0)
    for i, field in enumerate(fields):
        for form in field:
            for _ in range(8):
                pick = [rng.choice(u) for u in usual]
                pick[i] = form
                out.append(tuple(pick))
    out += rng.sample(list(itertools.product(*fields)), 4000)
    return out


def test_what_the_usual_reader_takes_the_general_one_reads_the_same() -> None:
    taken = refused = 0
    for form in forms():
        header = body(*form)
        usual = _usual(header, "m", 2)
        try:
            general: InferRequest | None = _read(header, memoryview(b""), "m", 2)
        except InvalidArgument:
            general = None
            refused += 1
        if usual is not None:
            taken += 1
            assert general is not None, header  # refused by the general reader
            assert same(usual, general), header
    assert taken > 600  # the usual requests among them were taken, and many refused
    assert refused > 4000


@pytest.mark.parametrize("header", [
    # the serving benchmark's request, and a Triton client's (tritonclient.http)
    {"inputs": [{"name": "input_ids", "datatype": "INT64", "shape": [1, 4], "data": IDS}],
     "parameters": {"datatype": "FP32"},
     "outputs": [{"name": "embeddings", "parameters": {"binary_data": True}}]},
    {"inputs": [{"name": "input_ids", "shape": [1, 4], "datatype": "INT64", "data": IDS}],
     "outputs": [{"name": "embeddings", "parameters": {"binary_data": True}}], "id": "7"},
    {"inputs": [{"name": "input_ids", "shape": [1, 4], "datatype": "INT64", "data": IDS}]},
])
def test_the_usual_small_requests_take_the_short_read(header: dict[str, Any],
                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    import orjson

    def general(*args: Any) -> None:
        raise AssertionError("the usual outputs went through the general reader")

    with monkeypatch.context() as m:
        if len(header.get("outputs", ())) == 1:  # embeddings alone: read in a few steps
            m.setattr(infer, "_outputs", general)
        usual = _usual(header, "m", 0)
    assert usual is not None
    assert isinstance(usual.inputs[0], Input)
    assert usual.inputs[0].ids.tolist() == IDS
    assert same(parse_infer(orjson.dumps(header), None, "m", 0), usual)
    # binary data after the JSON is never the usual request's: the general read refuses it
    data = orjson.dumps(header)
    with pytest.raises(InvalidArgument, match="8 bytes of binary data follow the JSON"):
        parse_infer(data + b"\0" * 8, len(data), "m", 0)

"""The REST front's endpoints and tensors: JSON and binary, every dtype and compose, each
answer bit for bit the native Embed's."""

from __future__ import annotations

import json
import struct

import numpy as np
import pytest

from genproto.embedding.v1 import embedding_pb2 as pb
from genproto.embedding.v1 import embedding_pb2_grpc as pb_grpc
from service.local import ServerHandle
from tests.oip_cases import COMPOSE, DATATYPES, native_rows
from tests.service.rpc.http.conftest import (
    TINY_METADATA,
    as_bits,
    binary_outputs,
    infer_body,
    request,
)
from tests.tiny_model import DIM

IDS = [[31373, 995, 0, 50256, 7], [1, 2, 3, 4, 5]]


def test_health_metadata_and_index(server: ServerHandle) -> None:
    port = server.http_port
    assert request(port, "GET", "/v2/health/live").json() == {"live": True}
    assert request(port, "GET", "/v2/health/ready").json() == {"ready": True}
    meta = request(port, "GET", "/v2")
    assert meta.status == 200
    assert meta.headers["content-type"] == "application/json"
    assert meta.json()["extensions"] == ["parameters", "binary_tensor_data"]
    assert request(port, "GET", "/v2/models/tiny").json() == TINY_METADATA
    assert request(port, "GET", "/v2/models/tiny/versions/1").json() == TINY_METADATA
    assert request(port, "GET", "/v2/models/tiny/ready").json() == {"name": "tiny",
                                                                    "ready": True}
    missing = request(port, "GET", "/v2/models/tiny/versions/9/ready")
    assert (missing.status, missing.json()["ready"]) == (400, False)
    index = request(port, "POST", "/v2/repository/index", {"ready": True}).json()
    assert [(r["name"], r["version"], r["state"]) for r in index] == [
        ("rope", "1", "READY"), ("tiny", "1", "READY")]


def test_unknown_routes(server: ServerHandle) -> None:
    port = server.http_port
    assert request(port, "GET", "/v2/nope").status == 404
    wrong = request(port, "GET", "/v2/models/tiny/infer")
    assert (wrong.status, wrong.headers["allow"]) == (405, "POST")
    assert wrong.json() == {"error": "GET /v2/models/tiny/infer: use POST"}


@pytest.mark.parametrize("datatype", list(DATATYPES))
@pytest.mark.parametrize("compose", list(COMPOSE))
def test_binary_output_equals_native_embed(server: ServerHandle,
                                           native: pb_grpc.EmbeddingServiceStub,
                                           datatype: str, compose: str) -> None:
    body = infer_body(IDS, start_position=3, compose=compose, datatype=datatype)
    body["id"] = "r-1"
    body["outputs"] = [{"name": "embeddings", "parameters": {"binary_data": True}},
                       {"name": "sequence_lengths"}]
    reply = request(server.http_port, "POST", "/v2/models/tiny/infer", body)
    header, binary = binary_outputs(reply)
    assert header["id"] == "r-1"
    assert header["model_name"] == "tiny"
    assert header["parameters"]["start_position"] == 3
    assert header["outputs"] == [
        {"name": "embeddings", "datatype": datatype, "shape": [2, 5, DIM],
         "parameters": {"binary_data_size": len(binary["embeddings"])}},
        {"name": "sequence_lengths", "datatype": "INT64", "shape": [2], "data": [5, 5]}]
    assert binary["embeddings"] == native_rows(native, IDS, start_position=3,
                                               compose=COMPOSE[compose],
                                               dtype=DATATYPES[datatype])


def test_one_sequence_answers_of_every_shape_have_their_own_header(
        server: ServerHandle) -> None:
    """A one-sequence binary answer without an id reuses the layout of the last answer of
    its shape: each variant (T, start, truncation, dtype, compose, outputs and their
    order), asked twice and interleaved with the others, gets the header its own request
    with an id gets (built afresh), less the id, and the same bytes after it."""
    variants = []
    for T, start, datatype, compose in ((5, 0, "FP32", "token_plus_position"),
                                        (5, 3, "FP32", "token_plus_position"),
                                        (6, 0, "BF16", "token_only"),
                                        (5, 0, "FP16", "position_only")):
        for outputs in ([{"name": "embeddings", "parameters": {"binary_data": True}}],
                        [{"name": "sequence_lengths", "parameters": {"binary_data": True}},
                         {"name": "embeddings", "parameters": {"binary_data": True}}],
                        [{"name": "embeddings", "parameters": {"binary_data": True}},
                         {"name": "sequence_lengths"}]):
            body = infer_body([list(range(1, T + 1))], start_position=start,
                              datatype=datatype, compose=compose)
            body["outputs"] = outputs
            variants.append(body)
    long = infer_body([list(range(1, 81))], truncate="right")  # past max_seq_len (64)
    long["outputs"] = variants[0]["outputs"]
    variants.append(long)
    for body in variants + variants:
        plain = request(server.http_port, "POST", "/v2/models/tiny/infer", body)
        with_id = request(server.http_port, "POST", "/v2/models/tiny/infer",
                          {**body, "id": "x"})
        header, binary = binary_outputs(plain)
        header_id, binary_id = binary_outputs(with_id)
        assert header_id.pop("id") == "x"
        assert (header, binary) == (header_id, binary_id), body
    truncated, _ = binary_outputs(request(server.http_port, "POST", "/v2/models/tiny/infer",
                                          long))
    assert truncated["parameters"]["truncated_tokens"] == 80 - 64


@pytest.mark.parametrize("compose", list(COMPOSE))
def test_json_output_fp32_is_bit_exact(server: ServerHandle,
                                       native: pb_grpc.EmbeddingServiceStub,
                                       compose: str) -> None:
    reply = request(server.http_port, "POST", "/v2/models/tiny/versions/1/infer",
                    infer_body(IDS, start_position=3, compose=compose))
    assert reply.status == 200
    assert reply.headers["content-type"] == "application/json"
    embeddings, lengths = reply.json()["outputs"]
    assert embeddings["shape"] == [2, 5, DIM]
    assert lengths["data"] == [5, 5]
    assert as_bits(embeddings["data"]) == native_rows(native, IDS, start_position=3,
                                                      compose=COMPOSE[compose])


@pytest.mark.parametrize("datatype", ["FP16", "BF16"])
def test_json_output_of_half_types_is_refused(server: ServerHandle, datatype: str) -> None:
    reply = request(server.http_port, "POST", "/v2/models/tiny/infer",
                    infer_body(IDS, datatype=datatype))
    assert reply.status == 400
    assert reply.json() == {"error": (
        f"sending {datatype} data via JSON is not supported: ask for output 'embeddings' "
        f"with parameters {{\"binary_data\": true}} (the binary tensor data extension)")}


@pytest.mark.parametrize("dtype", ["<i8", "<i4"])
def test_binary_input_ids(server: ServerHandle, native: pb_grpc.EmbeddingServiceStub,
                          dtype: str) -> None:
    raw = np.asarray(IDS, dtype=dtype).tobytes()
    head = json.dumps({
        "inputs": [{"name": "input_ids", "shape": [2, 5],
                    "datatype": "INT64" if dtype == "<i8" else "INT32",
                    "parameters": {"binary_data_size": len(raw)}}],
        "parameters": {"binary_data_output": True}}).encode()
    reply = request(server.http_port, "POST", "/v2/models/tiny/infer", head + raw,
                    {"Inference-Header-Content-Length": str(len(head)),
                     "Content-Type": "application/octet-stream"})
    header, binary = binary_outputs(reply)
    assert binary["embeddings"] == native_rows(native, IDS)
    assert np.frombuffer(binary["sequence_lengths"], "<i8").tolist() == [5, 5]
    # The binary outputs follow the JSON in output order.
    assert [o["name"] for o in header["outputs"]] == ["embeddings", "sequence_lengths"]


@pytest.mark.parametrize(("name", "datatype", "shape", "raw", "message"), [
    ("input_ids", "INT64", [2, 5], np.arange(9, dtype="<i8").tobytes(),
     "input 'input_ids' INT64 [2, 5] needs 80 bytes of binary data; got 72"),
    ("text", "BYTES", [2], b"\x01\x00\x00",
     "input 'text' [2] needs 2 strings; binary data has 3 bytes, fewer than their 8 length "
     "bytes"),
    ("text", "BYTES", [2], struct.pack("<I", 2) + b"hi" + b"\x05\x00",
     "input 'text': binary data ends inside a length"),
    ("text", "BYTES", [1], struct.pack("<I", 9) + b"hi",
     "input 'text'[0]: length 9 runs past the end of binary data"),
])
def test_binary_input_messages_name_the_rest_field(server: ServerHandle, name: str,
                                                   datatype: str, shape: list[int],
                                                   raw: bytes, message: str) -> None:
    """A binary input's refusal names what a REST client sent (its binary data), not the
    gRPC form's raw_input_contents."""
    head = json.dumps({"inputs": [{"name": name, "shape": shape, "datatype": datatype,
                                   "parameters": {"binary_data_size": len(raw)}}]}).encode()
    reply = request(server.http_port, "POST", "/v2/models/tiny/infer", head + raw,
                    {"Inference-Header-Content-Length": str(len(head))})
    assert (reply.status, reply.json()) == (400, {"error": message})


def test_ragged_text_binary_in_and_out(server: ServerHandle,
                                       native: pb_grpc.EmbeddingServiceStub) -> None:
    texts = [b"hello world", "caf\u00e9 \u2603".encode()]
    raw = b"".join(struct.pack("<I", len(t)) + t for t in texts)
    head = json.dumps({
        "inputs": [{"name": "text", "shape": [2], "datatype": "BYTES",
                    "parameters": {"binary_data_size": len(raw)}}],
        "outputs": [{"name": "sequence_lengths", "parameters": {"binary_data": True}},
                    {"name": "embeddings", "parameters": {"binary_data": True,
                                                          "datatype": "BF16"}}]}).encode()
    reply = request(server.http_port, "POST", "/v2/models/tiny/infer", head + raw,
                    {"Inference-Header-Content-Length": str(len(head))})
    _header, binary = binary_outputs(reply)
    first = native.Embed(pb.EmbedRequest(text="hello world", dtype=pb.DTYPE_BFLOAT16))
    second = native.Embed(pb.EmbedRequest(text=texts[1].decode(), dtype=pb.DTYPE_BFLOAT16))
    T = max(len(first.token_ids), len(second.token_ids))
    assert np.frombuffer(binary["sequence_lengths"], "<i8").tolist() == [
        len(first.token_ids), len(second.token_ids)]
    rows = np.frombuffer(binary["embeddings"], "<u2").reshape(2, T, DIM)
    for b, reply_b in enumerate((first, second)):
        n = len(reply_b.token_ids)
        assert rows[b, :n].tobytes() == reply_b.embeddings.data
        assert not rows[b, n:].any()  # padding rows are zero


def test_tokenize_helper(server: ServerHandle) -> None:
    reply = request(server.http_port, "POST", "/v2/models/tiny/tokenize",
                    infer_body(texts=["hello world"], start_position=2))
    assert reply.status == 200
    assert reply.json() == {
        "model_name": "tiny", "model_version": "1", "dim": DIM, "width": DIM,
        "position": "learned", "max_seq_len": 64, "family": "", "rules": {},
        "dtype": "float32", "sequences": [{
            "ids": [31373, 995], "tokens": ["hello", " world"], "untrained": [True, False],
            "start_position": 2, "truncated_tokens": 0}]}


def test_one_engine_and_no_grpc_front_imported(server: ServerHandle) -> None:
    import ast
    from pathlib import Path

    s = server.server
    assert s.http is not None
    assert s.http.engine is s.engine is s.fronts[0].engine is s.fronts[1].engine
    assert s.http.frame is s.frame
    rest = Path(__file__).resolve().parents[4] / "service" / "rpc" / "http"
    for path in sorted(rest.glob("*.py")):
        tree = ast.parse(path.read_text())
        name = path.name
        imported = {n.module for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)} | {
            a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names}
        assert not imported & {"service.rpc.oip", "service.rpc.native"}, name


_NOT_INTEGERS = "INT64 data must be integers (a flat list, or nested lists of one shape)"


@pytest.mark.parametrize(("datatype", "row", "error"), [
    ("INT64", [2**63], "a value is outside INT64"),  # numpy reads it as uint64
    ("INT64", [1, 2**63], _NOT_INTEGERS),  # int64 and uint64 together: no integer array
    ("INT64", [2**64], _NOT_INTEGERS),
    ("INT64", [-(2**63) - 1], _NOT_INTEGERS),
    ("INT32", [1, 2**31], "a value is outside INT32"),
    ("INT32", [-(2**31) - 1], "a value is outside INT32"),
])
def test_json_ids_outside_their_datatype_are_refused(server: ServerHandle, datatype: str,
                                                     row: list[int], error: str) -> None:
    for data in ([row], row):  # nested [[...]], and flat [...] (a short one is read apart)
        body = infer_body([row])
        body["inputs"][0].update(datatype=datatype, data=data)
        reply = request(server.http_port, "POST", "/v2/models/tiny/infer", body)
        assert (reply.status, reply.json()) == (400, {"error": f"input 'input_ids': {error}"})


@pytest.mark.parametrize("row", [["5"], [1.0], [1, 2.5], [3, None], [1, [2]]])
def test_json_ids_that_are_not_integers_are_refused(server: ServerHandle,
                                                    row: list[object]) -> None:
    """A short flat list is copied as int64 without numpy reading its types: a string, a
    float (even a whole one) or a null among its values must still be refused, not read
    as the integer it would convert to."""
    body = infer_body([[1] * len(row)])
    body["inputs"][0]["data"] = row
    reply = request(server.http_port, "POST", "/v2/models/tiny/infer", body)
    assert (reply.status, reply.json()) == (400, {
        "error": f"input 'input_ids': {_NOT_INTEGERS}"})


@pytest.mark.parametrize("row", [
    [1, True], [False, 7], [True], [5] * 100 + [True],  # a long list: found by its 1
    [0] * 100 + [False],
])
def test_json_booleans_among_ids_are_refused(server: ServerHandle, row: list[int]) -> None:
    """numpy reads true and false among ints as 1 and 0; JSON booleans are not ids."""
    for data in ([row], row):  # nested [[...]] and flat [...]
        body = infer_body([row])
        body["inputs"][0]["data"] = data
        reply = request(server.http_port, "POST", "/v2/models/tiny/infer", body)
        assert (reply.status, reply.json()) == (400, {
            "error": f"input 'input_ids': {_NOT_INTEGERS}"})


@pytest.mark.parametrize(("datatype", "edge"), [("INT64", 2**63 - 1), ("INT64", -(2**63)),
                                                ("INT32", 2**31 - 1), ("INT32", -(2**31))])
def test_json_ids_at_their_datatype_edge_reach_the_vocabulary_check(
        server: ServerHandle, datatype: str, edge: int) -> None:
    body = infer_body([[1, edge]])
    body["inputs"][0]["datatype"] = datatype
    reply = request(server.http_port, "POST", "/v2/models/tiny/infer", body)
    assert (reply.status, reply.json()) == (400, {
        "error": f"input_ids[0][1]={edge} is out of range [0, 50257) for model 'tiny'"})


@pytest.mark.parametrize("binary", [True, False])
def test_request_id_is_echoed_as_text_and_a_lone_surrogate_refused(server: ServerHandle,
                                                                   binary: bool) -> None:
    body = infer_body(IDS)
    body["parameters"] = {"binary_data_output": binary}
    body["id"] = "réq-ü-1"
    reply = request(server.http_port, "POST", "/v2/models/tiny/infer", body)
    header = binary_outputs(reply)[0] if binary else reply.json()
    assert header["id"] == "réq-ü-1"
    body["id"] = "ab\ud800"  # json.dumps writes the escape \ud800: valid JSON text
    refused = request(server.http_port, "POST", "/v2/models/tiny/infer", body)
    assert (refused.status, refused.json()) == (400, {
        "error": "id is not valid Unicode text (a lone surrogate at character 2); it is "
                 "echoed in the response"})

"""The OIP face with the real tritonclient: metadata, every dtype and compose, batches,
offsets, text, and every row of the shared request table (``tests/vectors/oip_cases.json``)
— each answer bit for bit the native Embed's."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from client.shm import SharedMemoryRegion
from genproto.embedding.v1 import embedding_pb2 as pb
from genproto.embedding.v1 import embedding_pb2_grpc as pb_grpc
from service.local import ServerHandle
from tests.oip_cases import (
    CASES,
    COMPOSE,
    DATATYPES,
    SERVERS,
    OipCase,
    Outcome,
    check,
    native_rows,
)
from tests.service.rpc.oip.conftest import Triton
from tests.tiny_model import DIM, start

# The driver names an output array by its numpy dtype.
NUMPY_DTYPES = {"FP32": "float32", "FP16": "float16", "BF16": "bfloat16"}
IDS = [[31373, 995, 0, 50256, 7], [1, 2, 3, 4, 5]]


def test_health_and_metadata(server: ServerHandle, triton: Triton) -> None:
    ready, meta, smeta, missing = triton(server.target, [
        {"op": "ready", "model": "tiny"}, {"op": "model_metadata", "model": "tiny"},
        {"op": "server_metadata"}, {"op": "ready", "model": "nope"}])
    assert ready["ok"] == {"live": True, "ready": True, "model_ready": True}
    assert missing["ok"]["model_ready"] is False
    assert meta["ok"] == {
        "name": "tiny", "versions": ["1"], "platform": "embedding",
        "inputs": [{"name": "input_ids", "datatype": "INT64", "shape": ["-1", "-1"]},
                   {"name": "text", "datatype": "BYTES", "shape": ["-1"]}],
        "outputs": [{"name": "embeddings", "datatype": "FP32", "shape": ["-1", "-1", str(DIM)]},
                    {"name": "sequence_lengths", "datatype": "INT64", "shape": ["-1"]}]}
    assert smeta["ok"]["name"] == "embedding-service"
    assert smeta["ok"]["extensions"] == ["parameters", "system_shared_memory"]


@pytest.mark.parametrize("datatype", list(DATATYPES))
@pytest.mark.parametrize("compose", list(COMPOSE))
def test_infer_equals_native_embed(server: ServerHandle, triton: Triton,
                                   native: pb_grpc.EmbeddingServiceStub, datatype: str,
                                   compose: str) -> None:
    (got,) = triton(server.target, [{
        "op": "infer", "ids": IDS, "id": "r-1", "outputs": ["embeddings"],
        "parameters": {"start_position": 3, "compose": compose, "datatype": datatype}}])
    want = native_rows(native, IDS, start_position=3, compose=COMPOSE[compose],
                       dtype=DATATYPES[datatype])
    out = got["ok"]["outputs"]["embeddings"]
    assert (out["dtype"], out["shape"]) == (NUMPY_DTYPES[datatype], [2, 5, DIM])
    assert bytes.fromhex(out["hex"]) == want
    assert list(got["ok"]["outputs"]) == ["embeddings"]
    assert (got["ok"]["model_name"], got["ok"]["model_version"], got["ok"]["id"]) == \
        ("tiny", "1", "r-1")
    assert got["ok"]["parameters"]["start_position"] == "int64_param: 3"


def test_text_batch_pads_shorter_sequences_with_zero_rows(
        server: ServerHandle, triton: Triton, native: pb_grpc.EmbeddingServiceStub) -> None:
    texts = ["hello world, again", "hi"]
    (got,) = triton(server.target, [{"op": "infer", "texts": texts,
                                     "parameters": {"datatype": "FP16"}}])
    out = got["ok"]["outputs"]
    lengths = np.frombuffer(bytes.fromhex(out["sequence_lengths"]["hex"]), "<i8").tolist()
    assert lengths == [4, 1]  # "hello", " world", ",", " again" | "hi"
    rows = np.frombuffer(bytes.fromhex(out["embeddings"]["hex"]), np.float16).reshape(2, 4, DIM)
    for b, text in enumerate(texts):
        want = np.frombuffer(native.Embed(pb.EmbedRequest(text=text, dtype=pb.DTYPE_FLOAT16)
                                          ).embeddings.data, np.float16)
        assert rows[b, : lengths[b]].tobytes() == want.tobytes()
    assert not rows[1, 1:].any()  # padding rows are zero


@pytest.fixture(scope="module")
def table_outcomes(case_servers: dict[str, ServerHandle], triton: Triton) -> dict[str, Outcome]:
    """Every row of the shared table through tritonclient.grpc: one driver per server."""
    outcomes = {}
    for name, handle in case_servers.items():
        rows = [c for c in CASES if c.server == name]
        calls = [{"op": "infer", "model": c.model, "version": c.version, "headers": c.headers,
                  "id": c.request.get("id", ""), "parameters": c.request.get("parameters"),
                  "outputs": c.request.get("outputs", []),
                  **({"ids": c.request["ids"], "datatype": c.request.get("datatype", "INT64")}
                     if "ids" in c.request else {"texts": [{"hex": t.hex()} for t in c.texts()]})}
                 for c in rows]
        # Each row followed by a good request, on the same connection: still serving.
        token = SERVERS[name].get("auth_token")
        good = {"op": "infer", "ids": [[1, 2]],
                "headers": {"authorization": f"Bearer {token}"} if token else {}}
        results = triton(handle.target, [c for call in calls for c in (call, good)])
        for after in results[1::2]:
            assert after["ok"]["outputs"]["embeddings"]["shape"] == [1, 2, DIM], after
        for case, got in zip(rows, results[::2], strict=True):
            outs = got.get("ok", {}).get("outputs", {})
            outcomes[case.name] = Outcome(
                got.get("status"), got.get("message"),
                {k: v["shape"] for k, v in outs.items()},
                {k: bytes.fromhex(v["hex"]) for k, v in outs.items()})
    return outcomes


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.name)
def test_table_row(case_servers: dict[str, ServerHandle], table_outcomes: dict[str, Outcome],
                   case: OipCase) -> None:
    check(case_servers[case.server].target, case, table_outcomes[case.name], http=False)


def test_auth_and_response_size(tiny_repo: Path, triton: Triton) -> None:
    handle = start(tiny_repo, max_message_bytes=2000, auth_token="t0ken")
    try:
        ok = {"authorization": "Bearer t0ken"}
        no_auth, too_big, fine = (
            triton(handle.target, [{"op": "infer", "ids": [[1]]}])[0],
            triton(handle.target, [{"op": "infer", "ids": [[1] * 40]}], headers=ok)[0],
            triton(handle.target, [{"op": "infer", "ids": [[1] * 4]}], headers=ok)[0])
    finally:
        handle.stop()
    assert (no_auth["status"], no_auth["message"]) == (
        "UNAUTHENTICATED", "missing or invalid 'authorization: Bearer <token>'")
    assert too_big["status"] == "RESOURCE_EXHAUSTED"
    assert too_big["message"].endswith("the largest T that fits is 12")
    assert fine["ok"]["outputs"]["embeddings"]["shape"] == [1, 4, DIM]


def test_no_model_loaded_is_unavailable(tmp_path: Path, triton: Triton) -> None:
    handle = start(tmp_path)
    try:
        got, ready = triton(handle.target, [{"op": "infer", "ids": [[1]]},
                                            {"op": "ready", "model": "tiny"}])
    finally:
        handle.stop()
    assert (got["status"], got["message"]) == ("UNAVAILABLE",
                                               "no model is loaded yet; retry shortly")
    assert ready["ok"] == {"live": True, "ready": False, "model_ready": False}


@pytest.mark.parametrize("datatype", list(DATATYPES))
def test_shared_memory_output(server: ServerHandle, triton: Triton,
                              native: pb_grpc.EmbeddingServiceStub, datatype: str) -> None:
    want = native_rows(native, IDS, dtype=DATATYPES[datatype])
    with SharedMemoryRegion("triton", 8192) as region:
        register, status, got, too_small, unregister = triton(server.target, [
            {"op": "shm_register", "name": "out0", "key": region.key, "byte_size": 8192},
            {"op": "shm_status"},
            {"op": "infer", "ids": IDS, "parameters": {"datatype": datatype},
             "shm": {"region": "out0", "byte_size": len(want), "offset": 256}},
            {"op": "infer", "ids": [[1] * 64] * 9,
             "shm": {"region": "out0", "byte_size": 8192}},
            {"op": "shm_unregister", "name": "out0"}])
        assert bytes(region.mapping[256: 256 + len(want)]) == want
    assert register == unregister == {"ok": {}}
    assert status["ok"]["regions"]["out0"] == {"name": "out0", "key": region.key,
                                               "byte_size": "8192"}
    out = got["ok"]["outputs"]["embeddings"]
    assert (out["datatype"], out["shape"]) == (datatype, [2, 5, DIM])
    assert (too_small["status"], too_small["message"]) == (
        "INVALID_ARGUMENT", "outputs['embeddings']: the output needs 36864 bytes at offset 0 "
        "but region 'out0' has 8192 bytes; the largest T that fits is 14")


def test_queue_full_and_deadline(tiny_repo: Path, triton: Triton) -> None:
    """The queue budget and the deadline rows, through tritonclient: a 1 s batch delay holds
    work in the queue (8 tokens of budget), so a third request of 3 tokens overflows it, and
    a 0.3 s client timeout expires while its request waits."""
    handle = start(tiny_repo, max_batch_tokens=8, max_queue_tokens=8,
                   max_batch_delay_us=1_000_000)
    try:
        together, late = triton(handle.target, [
            {"op": "infer_together", "ids": [[1, 2, 3], [4, 5, 6], [7, 8, 9]]},
            {"op": "infer", "ids": [[1]], "client_timeout": 0.3}])
    finally:
        handle.stop()
    assert sorted(o.get("status", "OK") for o in together["ok"]) == \
        ["OK", "OK", "RESOURCE_EXHAUSTED"]
    (full,) = [o for o in together["ok"] if "status" in o]
    assert full["message"] == ("queue holds 6 tokens; this request's 3 would exceed "
                               "max_queue_tokens=8; retry later")
    assert late["status"] == "DEADLINE_EXCEEDED"

"""The serving suite's parts: its grid, its targets on exact figures, and its reference
servers (ceiling, lookup floor, naive) against the real service."""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import grpc
import orjson
import pytest
import torch

from bench.harness.checkpoint import MODEL_NAME, VOCAB_SIZE, Shape, ensure_model
from bench.harness.config import BenchConfig
from bench.harness.launch import ServerProcess, stop
from bench.servers.ceiling import CeilingPayloads
from bench.servers.host import Captured
from bench.servers.naive import NaiveEmbedder, NaiveResponse, decode_naive
from bench.suites.serving import Cell, capture, cells, rest_body, start_servers, targets
from client.shm import SharedMemoryRegion, rows_from_region
from genproto.embedding.v1 import embedding_pb2 as pb
from genproto.embedding.v1 import embedding_pb2_grpc as pb_grpc

C, IDS = 8, [5, 50000, 7, 9, 123, 4]


def test_each_server_runs_the_modes_it_has() -> None:
    cfg = BenchConfig(ts=(16,), dtypes=("float32", "bfloat16"), concurrencies=(1,))
    assert [c.key for c in cells(cfg)] == [
        "ceiling/unary/T16/float32/c1", "floor/unary/T16/float32/c1",
        "naive/unary/T16/float32/c1", "service/unary/T16/float32/c1",
        "ceiling/unary/T16/bfloat16/c1", "floor/unary/T16/bfloat16/c1",  # naive: fp32 only
        "service/unary/T16/bfloat16/c1",
        "ceiling/stream/T16/float32/c1", "floor/stream/T16/float32/c1",
        "service/stream/T16/float32/c1", "ceiling/stream/T16/bfloat16/c1",
        "floor/stream/T16/bfloat16/c1", "service/stream/T16/bfloat16/c1",
        "service/oip/T16/float32/c1", "service/oip/T16/bfloat16/c1",
        "floor/shm/T16/float32/c1", "service/shm/T16/float32/c1",
        "floor/shm/T16/bfloat16/c1", "service/shm/T16/bfloat16/c1",
        "ceiling/rest/T16/float32/c1", "floor/rest/T16/float32/c1",
        "service/rest/T16/float32/c1", "ceiling/rest/T16/bfloat16/c1",
        "floor/rest/T16/bfloat16/c1", "service/rest/T16/bfloat16/c1",
        "ceiling/json/T16/float32/c1", "floor/json/T16/float32/c1",
        "service/json/T16/float32/c1"]  # JSON: fp32 only


def test_targets_judge_each_line_against_its_reference_in_the_same_run() -> None:
    cfg = BenchConfig(ts=(16, 1024), concurrencies=(1, 16))
    rates = {  # req/s of the cells the targets read; every other cell does 100
        "service/unary/T1024/float32/c16": 70, "naive/unary/T1024/float32/c16": 5,
        "service/unary/T16/float32/c16": 90, "service/stream/T16/float32/c1": 180,
        "ceiling/stream/T16/float32/c1": 200, "service/stream/T16/float32/c16": 150,
        "ceiling/stream/T16/float32/c16": 200, "service/unary/T1024/bfloat16/c16": 112,
        "service/oip/T16/float32/c16": 81, "service/oip/T1024/float32/c16": 63,
        "service/shm/T1024/float32/c16": 350, "service/shm/T1024/bfloat16/c16": 420,
        "floor/shm/T1024/bfloat16/c16": 150, "service/rest/T16/float32/c1": 80,
        "service/rest/T16/float32/c16": 79, "service/rest/T1024/float32/c16": 95,
        "service/json/T16/float32/c16": 50, "floor/unary/T16/float32/c16": 80,
        "floor/json/T16/float32/c16": 40}
    reps = {cell: [{"req_s": float(rates.get(cell.key, 100)),
                    "p50_ms": 1.2 if cell.key == "service/unary/T16/float32/c1" else 1.0}] * 2
            for cell in cells(cfg)}
    got = [(t.name, round(t.value, 4), t.met, t.floor and round(t.floor, 4))
           for t in targets(cfg, reps)]
    assert got == [  # a line against the ceiling carries the floor's own figure
        ("T=1024 fp32 c=16 unary: service / gRPC ceiling throughput", 0.7, False, 1.0),
        ("T=1024 fp32 c=16 unary: service / naive throughput", 14.0, True, None),
        ("T=16 fp32 c=16 unary: service / gRPC ceiling throughput", 0.9, True, 0.8),
        ("T=16 fp32 c=16 unary: service / gRPC lookup floor throughput", 1.125, True, None),
        ("T=16 fp32 c=1 unary: service p50 / gRPC ceiling p50", 1.2, True, 1.0),
        ("T=16 fp32 c=1 unary: service p50 / gRPC lookup floor p50", 1.2, False, None),
        ("T=16 fp32 c=1: stream/unary throughput, service / gRPC ceiling", 0.9, True, 0.5),
        # floor: stream 100 / unary 80, over the ceiling's stream 200 / unary 100
        ("T=16 fp32 c=16: stream/unary throughput, service / gRPC ceiling", 0.8333, False,
         0.625),
        ("T=1024 c=16 unary: bf16 / fp32 throughput", 1.6, True, None),
        ("T=16 fp32 c=16: OIP ModelInfer / native unary throughput", 0.9, True, None),
        ("T=1024 fp32 c=16: OIP ModelInfer / native unary throughput", 0.9, True, None),
        ("T=1024 fp32 c=16: shm / gRPC ceiling throughput", 3.5, True, 1.0),
        ("T=1024 c=16 shm: bf16/fp32 throughput, service / lookup floor", 0.8, False, None),
        ("REST binary T=16 fp32 c=1: service / lookup floor throughput", 0.8, True, None),
        ("REST binary T=16 fp32 c=16: service / lookup floor throughput", 0.79, False, None),
        ("REST binary T=1024 fp32 c=16: service / lookup floor throughput", 0.95, True, None),
        ("REST JSON T=16 fp32 c=16: service / REST ceiling throughput", 0.5, True, 0.4),
        ("REST JSON T=16 fp32 c=16: service / JSON lookup floor throughput", 1.25, True,
         None)]
    shorter = replace(cfg, modes=("unary",), backends=("ceiling", "service"))
    assert [t.name for t in targets(shorter, {c: reps[c] for c in cells(shorter)})] == [
        "T=1024 fp32 c=16 unary: service / gRPC ceiling throughput",
        "T=16 fp32 c=16 unary: service / gRPC ceiling throughput",
        "T=16 fp32 c=1 unary: service p50 / gRPC ceiling p50",
        "T=1024 c=16 unary: bf16 / fp32 throughput"]  # a line whose cells did not run: none


def test_rest_body_asks_for_the_ids_rows_in_the_dtype() -> None:
    assert json.loads(rest_body([3, 4], "bfloat16", binary=True)) == {
        "inputs": [{"name": "input_ids", "datatype": "INT64", "shape": [1, 2],
                    "data": [3, 4]}],
        "parameters": {"datatype": "BF16"},
        "outputs": [{"name": "embeddings", "parameters": {"binary_data": True}}]}


def test_naive_reply_is_token_plus_position_as_floats() -> None:
    token_table = torch.arange(30, dtype=torch.float32).reshape(10, 3)  # (vocab, C)
    position_table = torch.full((5, 3), 0.5)  # (max_seq_len, C)
    request = pb.EmbedRequest(token_ids=pb.TokenIds(ids=[7, 2]), start_position=1)
    reply: Any = NaiveResponse.FromString(
        NaiveEmbedder(token_table, position_table).reply(request))
    assert list(reply.shape) == [2, 3]
    assert list(reply.values) == [21.5, 22.5, 23.5, 6.5, 7.5, 8.5]
    assert decode_naive(reply).tolist() == [[21.5, 22.5, 23.5], [6.5, 7.5, 8.5]]


def test_ceiling_reply_is_a_whole_embed_response_built_once() -> None:
    payloads = CeilingPayloads(dim=C)
    request = pb.EmbedRequest(token_ids=pb.TokenIds(ids=IDS), dtype=pb.DTYPE_BFLOAT16)
    raw = payloads.reply(request)
    assert payloads.reply(request) is raw
    resp = pb.EmbedResponse.FromString(raw)
    assert (list(resp.embeddings.shape), resp.embeddings.dtype) == ([6, C], pb.DTYPE_BFLOAT16)
    assert len(resp.embeddings.data) == 6 * C * 2
    assert list(resp.token_ids) == [0, 1, 2, 3, 4, 5]


@pytest.fixture(scope="module")
def root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("serving")


@pytest.fixture(scope="module")
def servers(root: Path) -> Iterator[dict[str, ServerProcess]]:
    """The suite's ceiling, floor and service, as it starts them, on a C=8 model; their
    REST answers come from ``root/captured``."""
    repo = ensure_model(root / "model", Shape(VOCAB_SIZE, C, 16))
    cfg = BenchConfig(ts=(len(IDS),), dim=C, max_seq_len=16, out=root,
                      backends=("ceiling", "floor", "service"))
    running = start_servers(cfg, repo, root / "captured")
    yield running
    assert stop(running.values()) == [0, 0, 0]


def _embed(server: ServerProcess, request: pb.EmbedRequest) -> pb.EmbedResponse:
    with grpc.insecure_channel(server.target) as channel:
        return pb_grpc.EmbeddingServiceStub(channel).Embed(request, timeout=30)


@pytest.mark.parametrize("dtype", [pb.DTYPE_FLOAT32, pb.DTYPE_BFLOAT16])
def test_the_floor_answers_the_services_rows_bit_for_bit(
        servers: dict[str, ServerProcess], dtype: int) -> None:
    request = pb.EmbedRequest(model=MODEL_NAME, dtype=dtype,  # type: ignore[arg-type]
                              token_ids=pb.TokenIds(ids=IDS), start_position=3)
    want = _embed(servers["service"], request).embeddings
    assert _embed(servers["floor"], request).embeddings == want
    with (SharedMemoryRegion("floor-test", 4096) as region,
          grpc.insecure_channel(servers["floor"].target) as channel):
        stub = pb_grpc.EmbeddingServiceStub(channel)
        stub.RegisterSharedMemory(pb.RegisterSharedMemoryRequest(
            region=region.region_message()))
        request.output.region, request.output.offset = "floor-test", 64
        resp = stub.Embed(request)
        rows = rows_from_region(region, resp.embeddings, resp.output, raw_bfloat16=True)
        assert (resp.output.offset, resp.output.byte_size) == (64, len(want.data))
        assert rows.tobytes() == want.data
        del rows  # the region's mapping closes only once no view of it is left
        stub.UnregisterSharedMemory(pb.UnregisterSharedMemoryRequest(name=""))


def _post(server: ServerProcess, path: str, body: bytes) -> tuple[int, bytes]:
    url = f"http://127.0.0.1:{server.http_port}/{path}"
    try:
        with urllib.request.urlopen(urllib.request.Request(url, body), timeout=30) as r:
            return r.status, r.read()
    except urllib.error.HTTPError as e:
        return e.code, e.read()


@pytest.fixture(scope="module")
def captured(servers: dict[str, ServerProcess], root: Path) -> Captured:
    """The service's answers to a binary and a JSON request, as the suite captures them."""
    points = [Cell("service", "rest", len(IDS), "float32", 1),
              Cell("service", "json", len(IDS), "float32", 1)]
    out = Captured(root / "captured")
    capture(servers["service"], points, {len(IDS): [IDS]}, out)
    return out


def test_rest_ceiling_and_floor_answer_the_services_own_bytes(
        servers: dict[str, ServerProcess], captured: Captured) -> None:
    body = rest_body(IDS, "float32", binary=True)
    status, want = _post(servers["service"], f"v2/models/{MODEL_NAME}/infer", body)
    assert status == 200
    rows = len(IDS) * C * 4
    assert json.loads(want[:-rows])["outputs"][0]["shape"] == [1, len(IDS), C]
    assert _post(servers["floor"], "rest-T6-float32", body) == (200, want)
    assert _post(servers["ceiling"], "rest-T6-float32", body) == (200, want)
    json_body = rest_body(IDS, "float32", binary=False)
    status, want_json = _post(servers["service"], f"v2/models/{MODEL_NAME}/infer", json_body)
    assert status == 200
    assert len(json.loads(want_json)["outputs"][0]["data"]) == len(IDS) * C
    assert _post(servers["ceiling"], "json-T6-float32", json_body) == (200, want_json)
    assert _post(servers["floor"], "json-T6-float32", json_body) == (200, want_json)


@pytest.mark.parametrize(("binary", "point"), [(True, "rest"), (False, "json")])
def test_the_rest_floor_answers_the_ids_it_is_sent(
        servers: dict[str, ServerProcess], captured: Captured, binary: bool,
        point: str) -> None:
    """The ids are read from the request, as every REST server must read them: other ids
    of the same T get their own rows, the service's bytes for them; another T is refused."""
    other = [i + 1 for i in reversed(IDS)]
    body = rest_body(other, "float32", binary)
    status, want = _post(servers["service"], f"v2/models/{MODEL_NAME}/infer", body)
    assert status == 200
    got = _post(servers["floor"], f"{point}-T6-float32", body)
    assert got == (200, want)
    assert got != _post(servers["floor"], f"{point}-T6-float32", rest_body(IDS, "float32", binary))
    assert _post(servers["floor"], f"{point}-T6-float32", rest_body(other[:5], "float32",
                                                                    binary)) == (
        400, f"floor: /{point}-T6-float32 serves T=6".encode())


def test_a_floor_whose_lookup_differs_from_the_service_refuses_to_serve(
        servers: dict[str, ServerProcess], captured: Captured) -> None:
    cell = captured.get("/rest-T6-float32")
    wrong = bytearray(cell.body)
    wrong[-1] ^= 1  # one bit of the last row
    captured.put("rest-T6-bfloat16", replace(cell, body=bytes(wrong)))  # as a new point
    assert _post(servers["floor"], "rest-T6-bfloat16", b"{}") == (
        500, b"floor: /rest-T6-bfloat16 differs from the service's response")
    cell = captured.get("/json-T6-float32")
    answer = orjson.loads(cell.body)
    answer["outputs"][0]["data"][-1] += 1.0  # the last value of the last row
    captured.put("json-T6-bfloat16", replace(cell, body=orjson.dumps(answer)))
    assert _post(servers["floor"], "json-T6-bfloat16", b"{}") == (
        500, b"floor: /json-T6-bfloat16 differs from the service's response")


def test_the_references_send_a_large_body_in_slices_whole() -> None:
    """A reference server's body past one slice leaves as the service sends one (views of
    1 MiB, the headers with the first): the client reads every byte and the headers as
    given."""
    import asyncio

    import aiohttp
    from aiohttp import web

    from bench.servers.host import respond

    body = bytes(range(256)) * (3 * 4096 + 7)  # 3 MiB and change: four slices

    async def handle(request: web.BaseRequest) -> web.StreamResponse:
        await request.read()
        return await respond(request, body, {"Content-Type": "application/octet-stream",
                                                  "Inference-Header-Content-Length": "9"})

    async def scenario() -> tuple[int, dict[str, str], bytes]:
        server = await asyncio.get_running_loop().create_server(
            web.Server(handle, access_log=None), "127.0.0.1", 0)
        port = server.sockets[0].getsockname()[1]
        try:
            async with aiohttp.ClientSession() as session, session.post(
                    f"http://127.0.0.1:{port}/x", data=b"{}") as r:
                return r.status, dict(r.headers), await r.read()
        finally:
            server.close()

    status, headers, got = asyncio.run(scenario())
    assert (status, got) == (200, body)
    assert (headers["Content-Length"], headers["Inference-Header-Content-Length"]) == (
        str(len(body)), "9")

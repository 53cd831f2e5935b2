"""KServe's InferenceGraph router, played by this test as its documentation and code
describe it, over deploy/kserve/inferencegraph.yaml: each step an HTTP POST of JSON; a
``data: $response`` step gets the previous step's response body byte for byte; a ``Hard``
step that fails ends the graph with its response."""

from __future__ import annotations

import http.server
import json
import re
import threading
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any, ClassVar

import grpc
import numpy as np
import pytest
import yaml

from genproto.embedding.v1 import embedding_pb2 as pb
from genproto.embedding.v1 import embedding_pb2_grpc as pb_grpc
from service.local import ServerHandle
from tests.tiny_model import DIM

ROOT = Path(__file__).resolve().parents[4]
GRAPH = ROOT / "deploy" / "kserve" / "inferencegraph.yaml"


class Downstream(http.server.BaseHTTPRequestHandler):
    """The placeholder step: records each body it is sent and answers a small JSON."""

    received: ClassVar[list[bytes]] = []

    def do_POST(self) -> None:
        """One step call."""
        body = self.rfile.read(int(self.headers["Content-Length"]))
        Downstream.received.append(body)
        reply = json.dumps({"received_bytes": len(body)}).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(reply)))
        self.end_headers()
        self.wfile.write(reply)

    def log_message(self, *args: Any) -> None:
        """Quiet."""


@pytest.fixture
def downstream() -> Iterator[str]:
    Downstream.received = []
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Downstream)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}/"
    server.shutdown()
    server.server_close()


def post(url: str, body: bytes) -> tuple[int, bytes]:
    """The router's call: POST, Content-Type application/json, the body as is."""
    request = urllib.request.Request(url, data=body, method="POST",
                                     headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=30) as response:
            return response.status, response.read()
    except urllib.error.HTTPError as e:
        return e.code, e.read()


def route(graph: dict[str, Any], urls: dict[str, str], request: bytes) -> tuple[int, bytes]:
    """A Sequence node as the router runs it: step by step, $response chaining, Hard stops."""
    root = graph["spec"]["nodes"]["root"]
    assert root["routerType"] == "Sequence"
    response = request
    status = 200
    for step in root["steps"]:
        body = response if step.get("data") == "$response" else request
        status, response = post(urls[step["serviceName"]], body)
        if status >= 300 and step.get("dependency") == "Hard":
            return status, response
    return status, response


def documented_request() -> bytes:
    """The REST body docs/interop.md's KServe section gives for the first step."""
    section = (ROOT / "docs" / "interop.md").read_text().split("## KServe InferenceGraph")[1]
    (block,) = re.findall(r"```json\n(.*?)```", section, re.S)
    return json.dumps(json.loads(block)).encode()


def test_sequence_feeds_the_embedding_response_to_the_next_step(
        server: ServerHandle, downstream: str) -> None:
    graph = yaml.safe_load(GRAPH.read_text())
    urls = {"embedding-service-http":
            f"http://127.0.0.1:{server.http_port}/v2/models/tiny/infer",
            "my-downstream-transformer": downstream}
    assert {s["serviceName"] for s in graph["spec"]["nodes"]["root"]["steps"]} == set(urls)
    status, final = route(graph, urls, documented_request())
    assert status == 200
    (forwarded,) = Downstream.received
    assert json.loads(final) == {"received_bytes": len(forwarded)}
    # The downstream got the embedding step's response, byte for byte, as its request.
    assert forwarded == post(urls["embedding-service-http"], documented_request())[1]
    response = json.loads(forwarded)
    embeddings = response["outputs"][0]
    assert (embeddings["name"], embeddings["datatype"], embeddings["shape"]) == (
        "embeddings", "FP32", [1, 5, DIM])
    with grpc.insecure_channel(server.target) as channel:
        native = pb_grpc.EmbeddingServiceStub(channel).Embed(pb.EmbedRequest(
            model="tiny", token_ids=pb.TokenIds(ids=[464, 3797, 11114, 284, 262]),
            compose=pb.COMPOSE_TOKEN_ONLY, start_position=7))
    assert np.asarray(embeddings["data"], "<f4").tobytes() == native.embeddings.data


def test_a_refused_hard_step_ends_the_graph(server: ServerHandle, downstream: str) -> None:
    graph = yaml.safe_load(GRAPH.read_text())
    urls = {"embedding-service-http":
            f"http://127.0.0.1:{server.http_port}/v2/models/tiny/infer",
            "my-downstream-transformer": downstream}
    bad = json.dumps({"inputs": [{"name": "input_ids", "shape": [1, 1], "datatype": "INT64",
                                  "data": [50257]}]}).encode()
    status, body = route(graph, urls, bad)
    assert (status, json.loads(body)) == (400, {
        "error": "input_ids[0][0]=50257 is out of range [0, 50257) for model 'tiny'"})
    assert Downstream.received == []

"""The frame over HTTP: every status-table row as its HTTP status and JSON error, the
token, the body limit before reading, the deadline header, draining, metrics and traces."""

from __future__ import annotations

import json
import logging
import socket
import threading
import time
import urllib.request
from collections.abc import Callable
from pathlib import Path

import grpc
import pytest
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind, StatusCode

from genproto.embedding.v1 import embedding_pb2 as pb
from genproto.embedding.v1 import embedding_pb2_grpc as pb_grpc
from service import tracing
from service.errors import http_status_for
from service.local import ServerHandle
from tests.service.rpc.http.conftest import Reply, infer_body, request
from tests.tiny_model import MakeCheckpoint, start

AUTH = {"Authorization": "Bearer t0ken"}
INFER = "/v2/models/tiny/infer"


def good(port: int, headers: dict[str, str] | None = None) -> None:
    """A good request right after a refusal still works."""
    reply = request(port, "POST", INFER, infer_body(texts=["hello world"]), headers)
    assert reply.status == 200, reply.body
    assert reply.json()["outputs"][1]["data"] == [2]


def expect(port: int, body: dict[str, object], status: int, message: str,
           headers: dict[str, str] | None = None, path: str = INFER) -> Reply:
    reply = request(port, "POST", path, body, headers)
    assert (reply.status, reply.json()) == (status, {"error": message})
    assert reply.headers["content-type"] == "application/json"
    good(port, headers)
    return reply


@pytest.mark.parametrize(("body", "message"), [
    (infer_body([[5, -1]]), "input_ids[0][1]=-1 is out of range [0, 50257) for model 'tiny'"),
    (infer_body([[1] * 65]), "input_ids[0]: start_position (0) + T (65) = 65 exceeds "
                             "max_seq_len 64 of model 'tiny' (or set truncate)"),
    (infer_body([[1]], compose="tokens"), "parameters['compose']='tokens' must be one of "
     "['position_only', 'token_only', 'token_plus_position']"),
    (infer_body([[1]], bogus=1), "parameters ['bogus'] are not known; this model takes "
     "['add_special_tokens', 'allow_special_tokens', 'compose', 'datatype', 'start_position', "
     "'truncate']"),
    ({"inputs": []}, "inputs []: give exactly one of 'input_ids' [B, T] (INT64/INT32) or "
                     "'text' [B] (BYTES)"),
    ({"inputs": [{"name": "input_ids", "datatype": "INT64", "shape": [1, 3],
                  "data": [1, 2]}]},
     "input 'input_ids' [1, 3] needs 3 values in data; got 2"),
    ({"inputs": [{"name": "input_ids", "datatype": "INT64", "shape": [1, 1],
                  "data": [1.5]}]}, "input 'input_ids': INT64 data must be integers (a flat "
                                    "list, or nested lists of one shape)"),
    ({"inputs": [{"name": "input_ids", "datatype": "INT64", "shape": [2, 2],
                  "data": [[1, 2], [3]]}]}, "input 'input_ids': INT64 data must be integers "
                                            "(a flat list, or nested lists of one shape)"),
])
def test_invalid_argument_is_400(server: ServerHandle, body: dict[str, object],
                                 message: str) -> None:
    expect(server.http_port, body, 400, message)


def test_not_json_is_400(server: ServerHandle) -> None:
    reply = request(server.http_port, "POST", INFER, b"{nope")
    assert reply.status == 400
    assert reply.json()["error"].startswith("request body is not valid JSON: ")


def test_not_found_and_failed_precondition(server: ServerHandle) -> None:
    expect(server.http_port, infer_body([[1]]), 404,
           "model 'nope' is not loaded (loaded: rope, tiny)", path="/v2/models/nope/infer")
    expect(server.http_port, infer_body([[1]], compose="position_only"), 400,
           "compose=COMPOSE_POSITION_ONLY needs a position table; model 'rope' has position "
           "'none'", path="/v2/models/rope/infer")


def test_unauthenticated_is_401(limited_server: ServerHandle) -> None:
    port = limited_server.http_port
    for headers in ({}, {"Authorization": "Bearer wrong"}):
        reply = request(port, "POST", INFER, infer_body([[1]]), headers)
        assert (reply.status, reply.json()) == (
            401, {"error": "missing or invalid 'authorization: Bearer <token>'"})
        assert reply.headers["www-authenticate"] == "Bearer"
    assert request(port, "GET", "/v2/health/ready").status == 401  # every /v2 route
    good(port, AUTH)


def test_limits_as_on_grpc(limited_server: ServerHandle) -> None:
    port = limited_server.http_port
    expect(port, infer_body(texts=["é" * 9]), 400,
           "text[0] is 18 bytes; max_text_bytes is 16", AUTH)
    expect(port, infer_body([list(range(20))]), 429,
           "response would be ~2624 bytes (20 tokens x 16 x 4 B) > max_message_bytes 2000; "
           "the largest T that fits is 12", AUTH)


def test_body_over_the_limit_is_413_before_reading(limited_server: ServerHandle) -> None:
    # Headers only, claiming a gigabyte: the answer comes without a byte of body sent.
    with socket.create_connection(("127.0.0.1", limited_server.http_port), timeout=10) as s:
        s.sendall(b"POST /v2/models/tiny/infer HTTP/1.1\r\nHost: x\r\nAuthorization: "
                  b"Bearer t0ken\r\nContent-Length: 1000000000\r\n\r\n")
        head = s.recv(65536).decode()
    assert head.startswith("HTTP/1.1 413 ")
    assert head.endswith('{"error": "request body is 1000000000 bytes; max_message_bytes is '
                         '2000"}')
    # Without a length, the body is read only until it passes the limit.
    with socket.create_connection(("127.0.0.1", limited_server.http_port), timeout=10) as s:
        chunk = b"%x\r\n%s\r\n" % (1500, b"x" * 1500)
        s.sendall(b"POST /v2/models/tiny/infer HTTP/1.1\r\nHost: x\r\nAuthorization: "
                  b"Bearer t0ken\r\nTransfer-Encoding: chunked\r\n\r\n" + chunk * 2)
        head = s.recv(65536).decode()
    assert head.startswith("HTTP/1.1 413 ")
    assert head.endswith('{"error": "request body is over max_message_bytes 2000"}')
    good(limited_server.http_port, AUTH)


def test_queue_full_is_429_and_deadline_is_504(limited_server: ServerHandle) -> None:
    port = limited_server.http_port
    first: list[Reply] = []
    holder = threading.Thread(target=lambda: first.append(
        request(port, "POST", INFER, infer_body([list(range(6))]), AUTH)))
    holder.start()
    time.sleep(0.2)  # queued, waiting out the batch delay
    expect(port, infer_body([list(range(6))]), 429, "queue holds 6 tokens; this request's 6 "
           "would exceed max_queue_tokens=8; retry later", AUTH)
    holder.join()
    assert first[0].status == 200
    late = request(port, "POST", INFER, infer_body([[1, 2]]), {**AUTH, "grpc-timeout": "50m"})
    assert (late.status, late.json()) == (504, {"error": "deadline passed while queued; no "
                                                         "work was done"})
    bad = request(port, "POST", INFER, infer_body([[1]]), {**AUTH, "grpc-timeout": "soon"})
    assert (bad.status, bad.json()) == (400, {"error": "grpc-timeout='soon' must be 1-8 "
                                          "digits and a unit (H, M, S, m, u, n), e.g. '250m'"})
    good(port, {**AUTH, "grpc-timeout": "10S"})


def test_unavailable_until_a_model_and_while_draining(
        tmp_path: Path, make_checkpoint: MakeCheckpoint) -> None:
    handle = start(tmp_path, max_batch_delay_us=500_000)
    try:
        port = handle.http_port
        assert request(port, "GET", "/v2/health/ready").status == 400
        expect_503 = request(port, "POST", INFER, infer_body([[1]]))
        assert (expect_503.status, expect_503.json()) == (
            503, {"error": "no model is loaded yet; retry shortly"})
        make_checkpoint(tmp_path)
        handle.refresh()
        good(port)
        held: list[Reply] = []
        inflight = threading.Thread(target=lambda: held.append(
            request(port, "POST", INFER, infer_body([[1, 2, 3]]))))
        inflight.start()
        time.sleep(0.2)  # in flight, held by the batch delay
        handle.server.engine.draining = True
        refused = request(port, "GET", "/v2/health/live")
        assert (refused.status, refused.json()) == (
            503, {"error": "server is draining for shutdown; retry on another replica"})
        handle.server.engine.draining = False
        handle.stop(grace=5)  # the in-flight request finishes within the grace
        inflight.join()
        assert held[0].status == 200
        assert held[0].json()["outputs"][1]["data"] == [3]
    finally:
        handle.stop()


def test_internal_error_hides_details(server: ServerHandle, monkeypatch: pytest.MonkeyPatch,
                                      caplog: pytest.LogCaptureFixture) -> None:
    tokenizer = server.server.repo.get("tiny", 0).tokenizer
    boom: Callable[..., list[int]] = lambda *a: (_ for _ in ()).throw(RuntimeError("secret"))  # noqa: E731
    monkeypatch.setattr(tokenizer, "encode", boom)
    with caplog.at_level(logging.ERROR, logger="service.frame"):
        reply = request(server.http_port, "POST", INFER, infer_body(texts=["x"]),
                        {"x-request-id": "r-42"})
    assert (reply.status, reply.json()) == (
        500, {"error": "internal error (request_id='r-42'); see server logs"})
    assert any("request_id='r-42'" in r.getMessage() for r in caplog.records)
    monkeypatch.undo()
    good(server.http_port)


def test_every_code_has_one_http_status() -> None:
    assert {code.name: http_status_for(code) for code in grpc.StatusCode} == {
        "OK": 200, "CANCELLED": 499, "UNKNOWN": 500, "INVALID_ARGUMENT": 400,
        "DEADLINE_EXCEEDED": 504, "NOT_FOUND": 404, "ALREADY_EXISTS": 409,
        "PERMISSION_DENIED": 403, "RESOURCE_EXHAUSTED": 429, "FAILED_PRECONDITION": 400,
        "ABORTED": 500, "OUT_OF_RANGE": 400, "UNIMPLEMENTED": 501, "INTERNAL": 500,
        "UNAVAILABLE": 503, "DATA_LOSS": 500, "UNAUTHENTICATED": 401}


def test_http_and_grpc_share_one_batch_and_the_metrics(tiny_repo: Path) -> None:
    handle = start(tiny_repo, max_batch_delay_us=300_000)
    try:
        replies: list[Reply] = []
        over_http = threading.Thread(target=lambda: replies.append(request(
            handle.http_port, "POST", INFER, infer_body([[1, 2, 3, 4]]))))
        over_http.start()
        with grpc.insecure_channel(handle.target) as channel:
            native = pb_grpc.EmbeddingServiceStub(channel).Embed(
                pb.EmbedRequest(token_ids=pb.TokenIds(ids=[5, 6, 7])))
        over_http.join()
        url = f"http://127.0.0.1:{handle.metrics_port}/metrics"
        with urllib.request.urlopen(url, timeout=10) as response:
            text = response.read().decode()
    finally:
        handle.stop()
    assert replies[0].status == 200
    assert len(native.token_ids) == 3
    lines = dict(line.rsplit(" ", 1) for line in text.splitlines()
                 if line.startswith(("embed_batch_requests_", "embed_batch_tokens_")))
    assert (lines["embed_batch_requests_count"], lines["embed_batch_requests_sum"]) == \
        ("1.0", "2.0")  # one batch of the two fronts' requests
    assert lines["embed_batch_tokens_sum"] == "7.0"
    assert 'embed_requests_total{code="OK",model="tiny",rpc="http/ModelInfer"} 1.0' in text


def test_metrics_off_count_nothing_and_answer_the_same(tiny_repo: Path) -> None:
    """``--metrics-port -1``: no request touches a series (off costs nothing per request),
    and every answer is the one a server counting its metrics gives."""
    answers = {}
    for port in (0, -1):
        handle = start(tiny_repo, metrics_port=port)
        try:
            http = [request(handle.http_port, "POST", INFER, body) for body in (
                infer_body([[1, 2, 3, 4]]), infer_body(texts=["hello world"]),
                infer_body([[1, 2, 10**6]]))]
            with grpc.insecure_channel(handle.target) as channel:
                stub = pb_grpc.EmbeddingServiceStub(channel)
                native = stub.Embed(pb.EmbedRequest(token_ids=pb.TokenIds(ids=[5, 6, 7])))
                streamed = list(stub.EmbedStream(iter([pb.EmbedRequest(text="hi")])))
            metrics = handle.server.metrics
        finally:
            handle.stop()
        answers[port] = ([(r.status, r.body) for r in http], native.embeddings.data,
                         [m.embeddings.data for m in streamed])
        if port == -1:
            assert metrics.counting is False
            for series in (metrics.requests, metrics.request_duration, metrics.tokens,
                           metrics.output_bytes, metrics.compute_duration,
                           metrics.untrained_lookups):
                assert series._children == {}, series.name
            for histogram in (metrics.queue_duration, metrics.tokenize_duration,
                              metrics.batch_tokens, metrics.batch_requests):
                child = histogram._children[()]
                assert (sum(child.counts), child.sum) == (0, 0.0), histogram.name
            assert metrics.inflight == 0
        else:
            assert metrics.requests._children[("http/ModelInfer", "tiny", "OK")].value == 2
            assert metrics.requests._children[
                ("http/ModelInfer", "tiny", "INVALID_ARGUMENT")].value == 1
            assert sum(metrics.tokenize_duration._children[()].counts) == 2
    assert [status for status, _ in answers[-1][0]] == [200, 200, 400]
    assert answers[-1] == answers[0]


def test_traceparent_makes_the_server_span_a_child(tiny_repo: Path) -> None:
    exporter = InMemorySpanExporter()
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(tracing, "_exporter", lambda endpoint: exporter)
        handle = start(tiny_repo, otlp_endpoint="http://127.0.0.1:9")  # never contacted
    try:
        parent = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"
        assert request(handle.http_port, "POST", INFER, infer_body(texts=["hi there"]),
                       {"traceparent": parent}).status == 200
        assert request(handle.http_port, "POST", "/v2/models/nope/infer",
                       infer_body([[1]])).status == 404
        assert handle.server.tracing is not None
        handle.server.tracing.provider.force_flush(10_000)
        spans = list(exporter.get_finished_spans())
    finally:
        handle.stop()
    server_spans = [s for s in spans if s.kind == SpanKind.SERVER]
    assert [s.name for s in server_spans] == [
        "POST /v2/models/(?P<model>[^/]+)(?:/versions/(?P<version>[^/]+))?/infer"] * 2
    ok, missing = server_spans
    assert ok.context is not None
    assert ok.parent is not None
    assert f"{ok.context.trace_id:032x}" == "0af7651916cd43dd8448eb211c80319c"
    assert f"{ok.parent.span_id:016x}" == "b7ad6b7169203331"
    kids = sorted(s.name for s in spans if s.parent is not None
                  and s.parent.span_id == ok.context.span_id)
    assert kids == ["compute", "queue", "tokenize", "write"]
    assert ok.attributes is not None
    assert ok.attributes["rpc.grpc.status_code"] == 0
    assert missing.status.status_code == StatusCode.ERROR
    assert missing.status.description == "NOT_FOUND: model 'nope' is not loaded (loaded: " \
                                         "rope, tiny)"
    assert json.dumps(dict(missing.attributes or {}))  # plain attribute values

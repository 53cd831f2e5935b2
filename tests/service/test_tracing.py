"""Tracing: a real server on port 0 whose OTLP exporter is swapped for an in-memory one."""

from __future__ import annotations

import itertools
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc
from opentelemetry import propagate
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor, SpanExporter, SpanExportResult
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind, StatusCode

from genproto.embedding.v1 import embedding_pb2 as pb
from genproto.embedding.v1 import embedding_pb2_grpc as pb_grpc
from service import tracing
from service.config import parse_config
from service.local import ServerHandle
from tests.tiny_model import start

SERVICE = "embedding.v1.EmbeddingService"
CLIENT = TracerProvider().get_tracer("test-client")  # the caller's side; exports nowhere


@dataclass
class Traced:
    handle: ServerHandle
    exporter: InMemorySpanExporter
    stub: pb_grpc.EmbeddingServiceStub
    endpoints: list[str]

    def spans(self, count: int) -> list[ReadableSpan]:
        """The ``count`` spans the server finished since the last call, then forget them.

        Waits for them: an aborted RPC's status reaches the client before the server's
        span ends (grpc.aio's abort sends it, then raises through the interceptor).
        """
        assert self.handle.server.tracing is not None
        deadline = time.monotonic() + 10
        while True:
            assert self.handle.server.tracing.provider.force_flush(10_000)
            spans = list(self.exporter.get_finished_spans())
            if len(spans) >= count or time.monotonic() > deadline:
                break
            time.sleep(0.01)
        self.exporter.clear()
        assert len(spans) == count, [s.name for s in spans]
        return spans


@pytest.fixture(scope="module")
def traced(tiny_repo: Path) -> Iterator[Traced]:
    exporter = InMemorySpanExporter()
    endpoints: list[str] = []

    def memory(endpoint: str) -> InMemorySpanExporter:
        endpoints.append(endpoint)
        return exporter

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(tracing, "_exporter", memory)
        handle = start(tiny_repo, otlp_endpoint="http://127.0.0.1:9")  # never contacted
    with grpc.insecure_channel(handle.target) as channel:
        t = Traced(handle, exporter, pb_grpc.EmbeddingServiceStub(channel), endpoints)
        t.spans(0)  # nothing before the first request
        yield t
    handle.stop()


def traceparent() -> list[tuple[str, str]]:
    """The current (client) span as gRPC metadata, through the configured propagator."""
    carrier: dict[str, str] = {}
    propagate.inject(carrier)
    return list(carrier.items())


def children(spans: list[ReadableSpan], parent: ReadableSpan) -> list[ReadableSpan]:
    kids = [s for s in spans if s.parent is not None
            and s.parent.span_id == parent.context.span_id]
    return sorted(kids, key=lambda s: (s.start_time, s.end_time))


def check_layout(parent: ReadableSpan, kids: list[ReadableSpan], timing: Any) -> None:
    """Children inside the parent, in order, lengths equal to the response's timing."""
    assert parent.start_time is not None
    assert parent.end_time is not None
    for kid in kids:
        assert kid.start_time is not None
        assert kid.end_time is not None
        assert parent.start_time <= kid.start_time <= kid.end_time <= parent.end_time
        assert kid.context.trace_id == parent.context.trace_id
    for before, after in itertools.pairwise(kids):
        assert before.end_time <= after.start_time  # type: ignore[operator]
    length = {k.name: k.end_time - k.start_time for k in kids}  # type: ignore[operator]
    assert length["queue"] == timing.queue_ns
    assert length["compute"] == timing.compute_ns
    if "tokenize" in length:
        assert length["tokenize"] == timing.tokenize_ns
    # tokenize starts where total_ns starts (the RPC's start), compute ends where it ends.
    first = kids[0] if kids[0].name == "tokenize" else None
    if first is not None:
        compute = next(k for k in kids if k.name == "compute")
        assert compute.end_time - first.start_time == timing.total_ns  # type: ignore[operator]


def test_text_request_is_a_child_of_the_client_span_with_four_children(
        traced: Traced) -> None:
    with CLIENT.start_as_current_span("client") as client:
        r = traced.stub.Embed(pb.EmbedRequest(text="hello world", request_id="r-1"),
                              metadata=traceparent())
    assert list(r.token_ids) == [31373, 995]
    spans = traced.spans(5)  # the server span and its four children, nothing else
    (server,) = [s for s in spans if s.kind == SpanKind.SERVER]
    assert server.name == f"{SERVICE}/Embed"
    assert server.context.trace_id == client.get_span_context().trace_id
    assert server.parent is not None
    assert server.parent.is_remote
    assert server.parent.span_id == client.get_span_context().span_id
    assert dict(server.attributes or {}) == {
        "rpc.system": "grpc", "rpc.service": SERVICE, "rpc.method": "Embed",
        "rpc.grpc.status_code": 0, "embed.request_id": "r-1", "embed.model": "tiny",
        "embed.version": 1, "embed.tokens": 2, "embed.sequences": 1,
        "embed.dtype": "float32"}
    assert server.status.status_code == StatusCode.UNSET
    kids = children(spans, server)
    assert [k.name for k in kids] == ["tokenize", "queue", "compute", "write"]
    compute = kids[2]
    assert dict(compute.attributes or {}) == {"embed.batch_tokens": 2,
                                              "embed.batch_requests": 1}
    check_layout(server, kids, r.timing)


def test_token_ids_request_has_no_tokenize_child(traced: Traced) -> None:
    with CLIENT.start_as_current_span("client") as client:
        r = traced.stub.Embed(pb.EmbedRequest(token_ids=pb.TokenIds(ids=[1, 2, 3]),
                                              dtype=pb.DTYPE_BFLOAT16),
                              metadata=traceparent())
    assert r.timing.tokenize_ns == 0
    spans = traced.spans(4)
    (server,) = [s for s in spans if s.kind == SpanKind.SERVER]
    assert server.parent is not None
    assert server.parent.span_id == client.get_span_context().span_id
    assert (server.attributes or {})["embed.tokens"] == 3
    assert (server.attributes or {})["embed.dtype"] == "bfloat16"
    assert (server.attributes or {})["embed.request_id"] == ""
    kids = children(spans, server)
    assert [k.name for k in kids] == ["queue", "compute", "write"]
    check_layout(server, kids, r.timing)


def test_error_request_ends_with_status_error_and_its_code(traced: Traced) -> None:
    request = pb.EmbedRequest(token_ids=pb.TokenIds(ids=[1, 99999]), request_id="r-bad")
    with CLIENT.start_as_current_span("client") as client, \
            pytest.raises(grpc.RpcError) as info:
        traced.stub.Embed(request, metadata=traceparent())
    assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    message = "input.token_ids.ids[1]=99999 is out of range [0, 50257) for model 'tiny'"
    assert info.value.details() == message
    (server,) = traced.spans(1)  # no children: nothing reached the batcher
    assert server.parent is not None
    assert server.parent.span_id == client.get_span_context().span_id
    assert server.status.status_code == StatusCode.ERROR
    assert server.status.description == f"INVALID_ARGUMENT: {message}"
    attributes = dict(server.attributes or {})
    assert attributes["rpc.grpc.status_code"] == grpc.StatusCode.INVALID_ARGUMENT.value[0] == 3
    assert attributes["embed.request_id"] == "r-bad"


def test_batch_and_stream_requests(traced: Traced) -> None:
    with CLIENT.start_as_current_span("client"):
        r = traced.stub.EmbedBatch(pb.EmbedBatchRequest(inputs=[
            pb.EmbedInput(text="hello world"), pb.EmbedInput(token_ids=pb.TokenIds(ids=[5]))]),
            metadata=traceparent())
    spans = traced.spans(5)
    (server,) = [s for s in spans if s.kind == SpanKind.SERVER]
    assert server.name == f"{SERVICE}/EmbedBatch"
    assert (server.attributes or {})["embed.tokens"] == 3
    assert (server.attributes or {})["embed.sequences"] == 2
    kids = children(spans, server)
    assert [k.name for k in kids] == ["tokenize", "queue", "compute", "write"]
    check_layout(server, kids, r.timing)

    requests = [pb.EmbedRequest(text="hello", request_id="s-0"),
                pb.EmbedRequest(token_ids=pb.TokenIds(ids=[7, 8]), request_id="s-1")]
    with CLIENT.start_as_current_span("client"):
        responses = list(traced.stub.EmbedStream(iter(requests), metadata=traceparent()))
    assert [r.request_id for r in responses] == ["s-0", "s-1"]
    spans = traced.spans(1 + 2 + 4 + 3)  # stream, its two requests, their children
    (stream,) = [s for s in spans if s.kind == SpanKind.SERVER]
    assert stream.name == f"{SERVICE}/EmbedStream"
    items = children(spans, stream)
    assert [(i.name, (i.attributes or {})["embed.request_id"]) for i in items] == [
        ("request", "s-0"), ("request", "s-1")]
    assert [k.name for k in children(spans, items[0])] == [
        "tokenize", "queue", "compute", "write"]
    assert [k.name for k in children(spans, items[1])] == ["queue", "compute", "write"]
    for item, response in zip(items, responses):
        check_layout(item, children(spans, item), response.timing)


def test_unsampled_caller_and_health_checks_record_nothing(traced: Traced) -> None:
    unsampled = [("traceparent", "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-00")]
    traced.stub.Embed(pb.EmbedRequest(text="hi"), metadata=unsampled)
    with grpc.insecure_channel(traced.handle.target) as channel:
        health = health_pb2_grpc.HealthStub(channel)
        assert health.Check(health_pb2.HealthCheckRequest(service="")).status == \
            health_pb2.HealthCheckResponse.SERVING
    assert traced.spans(0) == []
    # A request without a traceparent starts a new trace (ratio 1.0 records it).
    traced.stub.Embed(pb.EmbedRequest(text="hi"))
    (server, *_) = sorted(traced.spans(5), key=lambda s: s.kind != SpanKind.SERVER)
    assert server.kind == SpanKind.SERVER
    assert server.parent is None
    assert traced.endpoints == ["http://127.0.0.1:9"]


def test_no_endpoint_means_no_tracing_at_all(tiny_repo: Path,
                                             monkeypatch: pytest.MonkeyPatch) -> None:
    def no_exporter(endpoint: str) -> None:
        raise AssertionError(f"an exporter was built for {endpoint!r}")

    seen: list[object] = []
    record = tracing.record

    def spy(*args: Any) -> None:  # what the servicer's hook sees: no traced RPC
        seen.append(tracing._RPC.get())
        record(*args)

    monkeypatch.setattr(tracing, "_exporter", no_exporter)
    monkeypatch.setattr(tracing, "record", spy)
    handle = start(tiny_repo)
    try:
        assert handle.server.config.otlp_endpoint == ""
        assert handle.server.tracing is None
        assert tracing.interceptors(handle.server.tracing) is None
        with grpc.insecure_channel(handle.target) as channel, \
                CLIENT.start_as_current_span("client"):
            r = pb_grpc.EmbeddingServiceStub(channel).Embed(
                pb.EmbedRequest(text="hello world"), metadata=traceparent())
        assert list(r.token_ids) == [31373, 995]
        assert seen == [None]  # the hook ran, and no interceptor had started a span
    finally:
        handle.stop()


def test_tracing_flags_and_env() -> None:
    c = parse_config(["--otlp-endpoint", "http://collector:4317"],
                     {"EMBED_TRACE_SAMPLE_RATIO": "0.25"})
    assert (c.otlp_endpoint, c.trace_sample_ratio) == ("http://collector:4317", 0.25)
    assert (parse_config([], {}).otlp_endpoint, parse_config([], {}).trace_sample_ratio) == (
        "", 1.0)
    with pytest.raises(SystemExit):
        parse_config(["--trace-sample-ratio", "1.5"], {})


def test_shutdown_does_not_wait_for_a_collector_that_is_down() -> None:
    class Stuck(SpanExporter):  # a collector that never answers
        exported = threading.Event()

        def export(self, spans: Any) -> SpanExportResult:
            self.exported.set()
            time.sleep(5)
            return SpanExportResult.FAILURE

    provider = TracerProvider()
    stuck = Stuck()
    provider.add_span_processor(BatchSpanProcessor(stuck))
    provider.get_tracer("t").start_span("s").end()
    t0 = time.monotonic()
    tracing.shutdown(tracing.Tracing(provider, provider.get_tracer("t")), timeout=0.3)
    assert time.monotonic() - t0 < 2.0  # not the exporter's 5 s
    assert stuck.exported.wait(5)  # the flush did try


def test_oip_model_infer_has_the_same_children(traced: Traced) -> None:
    """The OIP face goes through the same batcher: its span has queue/compute/write."""
    from genproto.inference.v2 import grpc_service_pb2 as oip
    from genproto.inference.v2 import grpc_service_pb2_grpc as oip_grpc

    tensor = oip.ModelInferRequest.InferInputTensor(
        name="input_ids", datatype="INT64", shape=[1, 3],
        contents=oip.InferTensorContents(int64_contents=[1, 2, 3]))
    with grpc.insecure_channel(traced.handle.target) as channel, \
            CLIENT.start_as_current_span("client") as client:
        oip_grpc.GRPCInferenceServiceStub(channel).ModelInfer(
            oip.ModelInferRequest(model_name="tiny", id="oip-1", inputs=[tensor]),
            metadata=traceparent())
    spans = traced.spans(4)
    (server,) = [s for s in spans if s.kind == SpanKind.SERVER]
    assert server.name == "inference.GRPCInferenceService/ModelInfer"
    assert server.parent is not None
    assert server.parent.span_id == client.get_span_context().span_id
    attributes = server.attributes or {}
    assert (attributes["embed.tokens"], attributes["embed.request_id"]) == (3, "oip-1")
    assert [k.name for k in children(spans, server)] == ["queue", "compute", "write"]

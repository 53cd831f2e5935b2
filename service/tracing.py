"""Tracing with OpenTelemetry: one server span per RPC, its children laid out after the fact.

Off unless ``--otlp-endpoint`` is set: ``setup`` returns None, the server installs no
interceptor and builds no exporter (the SDK is not even imported), and ``record`` costs one
ContextVar read per request.

On: a gRPC aio server interceptor starts a SERVER span per RPC, named
``embedding.v1.EmbeddingService/Embed``, whose parent is the W3C ``traceparent`` in the
request's metadata (through the configured OTel propagator); the span's status and
``rpc.grpc.status_code`` come from the code the RPC ended with. When a job is done, the
servicer calls ``record`` on the event loop, which adds the children ``tokenize``,
``queue``, ``compute`` and ``write`` with explicit start and end times taken from the
timing the batcher already measured (``Job.timing``, ``Job.enqueued_ns``, ``start_ns``):
the compute thread never touches OTel context, and the batcher reads no extra clock.
Health checks and reflection (``/grpc.*``) are not traced.

Why not ``opentelemetry-instrumentation-grpc``'s aio interceptor: it does work with the
generic handlers here (verified: parent linkage and the identity serializers survive), but
it names spans with a leading ``/``, follows the server-side semantic convention that
leaves client errors such as INVALID_ARGUMENT with status UNSET (this service wants
ERROR), records every abort twice as an exception event with a traceback, wraps each
RPC's servicer context in a proxy, and makes one span for a whole EmbedStream. The
interceptor below does what this service needs on the OTel API alone, in ~100 lines.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator, Mapping
from contextvars import ContextVar
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import grpc
from opentelemetry import context as otel_context
from opentelemetry import propagate, trace
from opentelemetry.trace import Span, SpanKind, Status, StatusCode, Tracer

from service.dtypes import BY_WIRE

if TYPE_CHECKING:
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SpanExporter

    from service.config import ServerConfig
    from service.engine.admission import Admitted
    from service.engine.batcher import Job

__all__ = ["SERVICE_NAME", "SHUTDOWN_SECONDS", "Tracing", "interceptors", "record", "server_span",
           "setup", "shutdown"]

SERVICE_NAME = "embedding-service"  # resource service.name unless OTEL_SERVICE_NAME says
_UNTRACED = "/grpc."  # health, reflection: probes would drown the traces
_CODE_ATTR = "rpc.grpc.status_code"  # semantic conventions: the code's number
SHUTDOWN_SECONDS = 2.0  # at exit, after the drain: flushing must not outlast the pod's grace


@dataclass
class _Rpc:
    """The RPC being traced, as the interceptor hands it to ``record``."""

    tracer: Tracer
    span: Span
    streaming: bool  # EmbedStream: one child span per request on the stream


_RPC: ContextVar[_Rpc | None] = ContextVar("embed_traced_rpc", default=None)


@dataclass
class Tracing:
    """A server's tracer provider (with its OTLP exporter) and the tracer for its spans."""

    provider: TracerProvider
    tracer: Tracer


def setup(config: ServerConfig) -> Tracing | None:
    """The tracing of a server configured with ``config``; None (nothing) when off."""
    if not config.otlp_endpoint:
        return None
    # Imported here: a server without tracing never loads the SDK or the exporter.
    from opentelemetry.sdk.resources import Resource
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import BatchSpanProcessor
    from opentelemetry.sdk.trace.sampling import ParentBased, TraceIdRatioBased

    resource = Resource.create()  # OTEL_SERVICE_NAME, OTEL_RESOURCE_ATTRIBUTES
    if str(resource.attributes.get("service.name", "")).startswith("unknown_service"):
        resource = resource.merge(Resource({"service.name": SERVICE_NAME}))
    provider = TracerProvider(resource=resource,
                              sampler=ParentBased(TraceIdRatioBased(config.trace_sample_ratio)))
    # Batched: export runs on the processor's own thread, off the event loop.
    provider.add_span_processor(BatchSpanProcessor(_exporter(config.otlp_endpoint)))
    return Tracing(provider, provider.get_tracer("service.tracing"))


def _exporter(endpoint: str) -> SpanExporter:
    """The OTLP/gRPC exporter (tests replace this function with an in-memory one)."""
    from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter

    return OTLPSpanExporter(endpoint=endpoint)  # connects lazily, at the first export


def interceptors(tracing: Tracing | None) -> list[grpc.aio.ServerInterceptor] | None:
    """The server interceptors for ``tracing`` (None when off: grpc gets none at all)."""
    return None if tracing is None else [_Interceptor(tracing.tracer)]


def shutdown(tracing: Tracing | None, timeout: float = SHUTDOWN_SECONDS) -> None:
    """Flush the spans still queued and stop the exporter, waiting at most ``timeout``.

    Bounded: with the collector down, the exporter's retries would hold the process's
    exit for its whole OTLP timeout (measured: 7.7 s); spans not out by then are dropped.
    """
    if tracing is not None:
        flush = threading.Thread(target=tracing.provider.shutdown, name="embed-trace-flush",
                                 daemon=True)
        flush.start()
        flush.join(timeout)


@contextlib.contextmanager
def server_span(tracing: Tracing | None, name: str, carrier: Mapping[str, str],
                attributes: dict[str, Any]) -> Iterator[Callable[[int, str], None]]:
    """A SERVER span around a request of a transport without an interceptor (HTTP): its
    parent from ``carrier`` (the request's headers: ``traceparent``, ``baggage``), current
    for the body so ``record`` adds the children. Yields ``end_with(code, message)``, the
    gRPC status code's number the request ended with (as ``rpc.grpc.status_code``, the
    same attribute the gRPC spans carry). ``tracing`` None: nothing at all."""
    if tracing is None:
        yield _no_status
        return
    remote = propagate.extract(carrier, context=otel_context.Context())
    span = tracing.tracer.start_span(name, remote, SpanKind.SERVER, attributes)
    token = otel_context.attach(trace.set_span_in_context(span, remote))
    rpc_token = _RPC.set(_Rpc(tracing.tracer, span, False))
    status: list[tuple[int, str]] = []
    try:
        yield lambda code, message: status.append((code, message))
    finally:
        code, message = status[-1] if status else (2, "UNKNOWN")  # 2 = UNKNOWN
        span.set_attribute(_CODE_ATTR, code)
        if code != 0:
            span.set_status(Status(StatusCode.ERROR, message))
        span.end()
        _RPC.reset(rpc_token)
        otel_context.detach(token)


def _no_status(code: int, message: str) -> None:
    """``server_span``'s status setter when tracing is off."""


def record(admitted: Admitted, job: Job, request_id: str) -> None:
    """Add a finished job's child spans and attributes to the current RPC's span.

    Called on the event loop right after ``batcher.submit`` returns. Children: tokenize
    (only when text was tokenized; placed at the RPC's start, its length the measured
    tokenize time, for several texts their sum capped at admission's end), queue (submit →
    batch start), compute (the lookup → the response finished), write (finished → handed
    back here, on the event loop, on its way to gRPC).
    """
    rpc = _RPC.get()
    if rpc is None:  # tracing off, or an untraced RPC: one ContextVar read
        return
    _record(rpc, admitted, job, request_id)


def _record(rpc: _Rpc, admitted: Admitted, job: Job, request_id: str) -> None:
    if not rpc.span.is_recording() or job.timing is None:
        return
    offset = _epoch_offset()
    now = time.perf_counter_ns()
    timing = job.timing
    finished = job.start_ns + timing.total_ns
    parent = rpc.span
    if rpc.streaming:  # one span per request on the stream, under the stream's span
        parent = rpc.tracer.start_span("request", trace.set_span_in_context(rpc.span),
                                       start_time=job.start_ns + offset)
    parent.set_attributes({
        "embed.model": admitted.model.name, "embed.version": admitted.model.version,
        "embed.tokens": admitted.tokens, "embed.sequences": len(admitted.sequences),
        "embed.dtype": BY_WIRE[admitted.options.dtype].name, "embed.request_id": request_id})
    context = trace.set_span_in_context(parent)
    spans: list[tuple[str, int, int, dict[str, Any]]] = []
    if timing.tokenize_ns > 0:
        end = job.start_ns + min(timing.tokenize_ns, job.enqueued_ns - job.start_ns)
        spans.append(("tokenize", job.start_ns, end, {}))
    batch_start = job.enqueued_ns + timing.queue_ns
    spans.append(("queue", job.enqueued_ns, batch_start, {}))
    spans.append(("compute", finished - timing.compute_ns, finished, {
        "embed.batch_tokens": job.batch_tokens, "embed.batch_requests": job.batch_requests}))
    spans.append(("write", finished, now, {}))
    for name, start, end, attributes in spans:
        child = rpc.tracer.start_span(name, context, attributes=attributes,
                                      start_time=start + offset)
        child.end(end_time=end + offset)
    if rpc.streaming:
        parent.end(end_time=now + offset)


def _epoch_offset() -> int:
    """time_ns() - perf_counter_ns(), read once per request: converts the batcher's
    perf_counter stamps to the epoch nanoseconds spans carry. The two clocks are read
    between two perf reads; a pair split by a preemption is read again."""
    for _ in range(3):
        before = time.perf_counter_ns()
        epoch = time.time_ns()
        after = time.perf_counter_ns()
        if after - before < 20_000:
            break
    return epoch - (before + after) // 2


class _Interceptor(grpc.aio.ServerInterceptor):
    """Starts and ends a SERVER span around each RPC's handler."""

    def __init__(self, tracer: Tracer) -> None:
        self._tracer = tracer
        self._wrapped: dict[str, tuple[grpc.RpcMethodHandler, grpc.RpcMethodHandler]] = {}

    async def intercept_service(
            self, continuation: Callable[[grpc.HandlerCallDetails],
                                         Awaitable[grpc.RpcMethodHandler]],
            handler_call_details: grpc.HandlerCallDetails) -> grpc.RpcMethodHandler:
        """The method's handler, its behaviour wrapped in a span (cached per method)."""
        handler = await continuation(handler_call_details)
        method: str = handler_call_details.method
        if handler is None or method.startswith(_UNTRACED):
            return handler
        cached = self._wrapped.get(method)
        if cached is None or cached[0] is not handler:
            cached = self._wrapped[method] = (handler, self._wrap(method, handler))
        return cached[1]

    def _wrap(self, method: str, handler: grpc.RpcMethodHandler) -> grpc.RpcMethodHandler:
        name = method.lstrip("/")
        service, _, rpc = name.rpartition("/")
        attributes = {"rpc.system": "grpc", "rpc.service": service, "rpc.method": rpc}
        start, end = self._start, self._end
        kind = (("stream" if handler.request_streaming else "unary") + "_"
                + ("stream" if handler.response_streaming else "unary"))
        behavior = getattr(handler, kind)
        factory = getattr(grpc, f"{kind}_rpc_method_handler")

        if handler.response_streaming:
            async def traced_stream(request: Any, context: Any) -> AsyncIterator[Any]:
                span, tokens = start(name, attributes, request, context, True)
                failed = None
                try:
                    result = behavior(request, context)
                    if hasattr(result, "__aiter__"):
                        async for response in result:
                            yield response
                    else:  # a handler that writes with context.write()
                        await result
                except BaseException as e:
                    failed = e
                    raise
                finally:
                    end(span, tokens, context, failed)
            wrapped: Any = traced_stream
        else:
            async def traced_unary(request: Any, context: Any) -> Any:
                span, tokens = start(name, attributes, request, context, False)
                failed = None
                try:
                    return await behavior(request, context)
                except BaseException as e:
                    failed = e
                    raise
                finally:
                    end(span, tokens, context, failed)
            wrapped = traced_unary
        return factory(wrapped, request_deserializer=handler.request_deserializer,
                       response_serializer=handler.response_serializer)

    def _start(self, name: str, attributes: dict[str, Any], request: Any, context: Any,
               streaming: bool) -> tuple[Span, tuple[object, object]]:
        metadata = {m.key: m.value for m in context.invocation_metadata() or ()}
        remote = propagate.extract(metadata, context=otel_context.Context())
        span = self._tracer.start_span(name, remote, SpanKind.SERVER, attributes)
        request_id = getattr(request, "request_id", "")  # unary: known even if it fails
        if request_id:
            span.set_attribute("embed.request_id", request_id)
        token = otel_context.attach(trace.set_span_in_context(span, remote))
        return span, (token, _RPC.set(_Rpc(self._tracer, span, streaming)))

    @staticmethod
    def _end(span: Span, tokens: tuple[Any, Any], context: Any,
             failed: BaseException | None) -> None:
        code = context.code()  # set by abort()/set_code(); None = not set
        if code is None:
            code = (grpc.StatusCode.OK if failed is None else grpc.StatusCode.CANCELLED
                    if isinstance(failed, asyncio.CancelledError) else grpc.StatusCode.UNKNOWN)
        span.set_attribute(_CODE_ATTR, code.value[0])
        if code != grpc.StatusCode.OK:
            # Every non-OK code is ERROR here, client errors included (the semantic
            # conventions leave those UNSET on servers): an operator filtering traces by
            # error wants the bad requests too; the code attribute tells whose fault.
            span.set_status(Status(StatusCode.ERROR, f"{code.name}: {context.details() or ''}"))
        span.end()
        # A stream's generator closed by the garbage collector runs this in another
        # context, where the tokens are not valid; the span is ended all the same.
        with contextlib.suppress(ValueError):
            _RPC.reset(tokens[1])
        otel_context.detach(tokens[0])

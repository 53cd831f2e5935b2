"""What tracing costs per request: the same in-process loop with tracing off and on.

Two servers over one GPT-2-sized checkpoint (C=768), each on its own event-loop thread in
this process, take the same sequential Embed requests from a client in this process, in
three settings:

- ``off``: no ``--otlp-endpoint`` (the default): no interceptor, no exporter.
- ``on``: ``--otlp-endpoint`` set, ratio 1.0, the real OTLP/gRPC exporter sending every
  span to a sink collector in a child process (an OTLP TraceService that counts spans).
- ``on, unsampled``: tracing on, every request carrying an unsampled ``traceparent``.

Rounds alternate between the servers so drift on a shared machine hits all of them;
the figures are medians over rounds of each round's mean wall time, process CPU time, and
event-loop CPU time inside tracing's own code (``tracing.meter``; with tracing off that
code never runs, so ``off`` reads 0 there). Also times ``tracing.record`` with tracing off
(what the servicer's hook costs a request then).

    .venv/bin/python -m bench.tracing [--requests 500] [--rounds 7] [--text "hello world"]
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import tempfile
import time
import timeit
from concurrent import futures
from pathlib import Path

import grpc

from bench.model import MODEL_NAME, ensure_model
from genproto.embedding.v1 import embedding_pb2 as pb
from genproto.embedding.v1 import embedding_pb2_grpc as pb_grpc
from service import tracing
from service.config import ServerConfig
from service.local import ServerHandle, start_in_thread

__all__ = ["main", "run_sink"]

_UNSAMPLED = (("traceparent", "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-00"),)


def run_sink() -> None:
    """An OTLP trace collector that accepts and counts spans; prints its port, then serves."""
    from opentelemetry.proto.collector.trace.v1 import trace_service_pb2 as ts
    from opentelemetry.proto.collector.trace.v1 import trace_service_pb2_grpc as ts_grpc

    class Sink(ts_grpc.TraceServiceServicer):
        spans = 0

        def Export(self, request: ts.ExportTraceServiceRequest,
                   context: grpc.ServicerContext) -> ts.ExportTraceServiceResponse:
            Sink.spans += sum(len(s.spans) for r in request.resource_spans
                              for s in r.scope_spans)
            sys.stderr.write(f"sink: {Sink.spans} spans\n")
            return ts.ExportTraceServiceResponse()

    server = grpc.server(futures.ThreadPoolExecutor(2))
    ts_grpc.add_TraceServiceServicer_to_server(Sink(), server)
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    print(port, flush=True)
    server.wait_for_termination()


def _round(stub: pb_grpc.EmbeddingServiceStub, request: pb.EmbedRequest, n: int,
           metadata: tuple[tuple[str, str], ...] | None) -> tuple[float, float]:
    """Mean wall seconds and process CPU seconds (every thread: client, server, exporter)
    per request over ``n`` sequential requests. CPU time is what tracing costs; wall time
    on a shared machine mostly measures the neighbours."""
    t0, c0 = time.perf_counter(), time.process_time()
    for _ in range(n):
        stub.Embed(request, metadata=metadata)
    return (time.perf_counter() - t0) / n, (time.process_time() - c0) / n


class _LoopCost:
    """CPU nanoseconds the event loop spends in tracing's own code (the interceptor's
    start/end and ``record``), from thread CPU clocks through ``tracing.meter``: other
    processes on the machine inflate wall and process time, much less the CPU time of the
    code itself."""

    def __init__(self) -> None:
        self.ns = 0
        self.calls = 0

    def add(self, ns: int) -> None:
        """One metered call's thread-CPU nanoseconds."""
        self.ns += ns
        self.calls += 1


def _record_off_ns() -> float:
    """Nanoseconds one ``tracing.record`` call costs when no traced RPC is current."""
    n = 200_000
    seconds = timeit.timeit(lambda: tracing.record(None, None, ""), number=n)  # type: ignore[arg-type]
    return seconds / n * 1e9


def main(argv: list[str] | None = None) -> int:
    """Run the comparison and print one line per setting."""
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--requests", type=int, default=500, help="requests per round")
    p.add_argument("--rounds", type=int, default=7)
    p.add_argument("--text", default="hello world")
    p.add_argument("--sink", action="store_true", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.sink:
        run_sink()
        return 0
    sink = subprocess.Popen([sys.executable, "-m", "bench.tracing", "--sink"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    handles: dict[str, ServerHandle] = {}
    try:
        assert sink.stdout is not None
        sink_port = int(sink.stdout.readline())
        repo = ensure_model(Path(tempfile.gettempdir()) / "embed-bench-tracing", 768, 1024)
        base = {"model_repository": repo / "models", "grpc_port": 0, "http_port": -1,
                "metrics_port": -1, "poll_seconds": 0, "default_model": MODEL_NAME,
                "device": "cpu"}
        on = {"otlp_endpoint": f"http://127.0.0.1:{sink_port}"}
        loop_cost = _LoopCost()
        tracing.meter(loop_cost.add)  # before the servers start: their handlers are timed
        handles["off"] = start_in_thread(ServerConfig(**base))  # type: ignore[arg-type]
        handles["on"] = start_in_thread(ServerConfig(**base, **on))  # type: ignore[arg-type]
        channels = {k: grpc.insecure_channel(h.target) for k, h in handles.items()}
        stubs = {k: pb_grpc.EmbeddingServiceStub(c) for k, c in channels.items()}
        request = pb.EmbedRequest(text=args.text)
        settings = [("off", "off", None), ("on", "on", None),
                    ("on, unsampled", "on", _UNSAMPLED)]
        for _name, key, md in settings:  # warm up: connections, caches, the tokenizer
            _round(stubs[key], request, 100, md)
        wall: dict[str, list[float]] = {name: [] for name, _, _ in settings}
        cpu: dict[str, list[float]] = {name: [] for name, _, _ in settings}
        loop: dict[str, list[float]] = {name: [] for name, _, _ in settings}  # µs
        for _ in range(args.rounds):
            for name, key, md in settings:
                before = loop_cost.ns
                w, c = _round(stubs[key], request, args.requests, md)
                wall[name].append(w)
                cpu[name].append(c)
                loop[name].append((loop_cost.ns - before) / args.requests / 1e3)
        tokens = len(stubs["off"].Embed(request).token_ids)
        print(f"Embed T={tokens} C=768, {args.rounds} rounds x {args.requests} sequential "
              f"requests, client and servers in one process; medians over rounds")
        for label, series in (("CPU", cpu), ("wall", wall)):
            off = statistics.median(series["off"])
            for name, _, _ in settings:
                mid = statistics.median(series[name])
                lo, hi = min(series[name]) * 1e6, max(series[name]) * 1e6
                print(f"  {label:4s} {name:14s} {mid * 1e6:8.1f} µs/request  "
                      f"({(mid - off) * 1e6:+7.1f} µs vs off; rounds {lo:.1f}..{hi:.1f})")
        for name, _, _ in settings:
            print(f"  loop {name:14s} {statistics.median(loop[name]):8.1f} µs/request of "
                  "event-loop CPU in tracing's code (interceptor + record)")
        print(f"  tracing.record with tracing off: {_record_off_ns():.0f} ns/call")
        for c in channels.values():
            c.close()
    finally:
        tracing.meter(None)
        for h in handles.values():
            h.stop()  # "on" flushes its last spans to the sink here
        sink.terminate()
        _, err = sink.communicate(timeout=30)
        lines = err.strip().splitlines()
        print(f"  sink received: {lines[-1] if lines else 'nothing'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

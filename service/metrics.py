"""Prometheus metrics (prefix ``embed_``), one registry per server instance.

A registry per instance (not the global default) lets tests run several servers in one
process without their counters bleeding into each other.

The per-request series are plain Python numbers behind a collector: prometheus_client's
``inc``/``observe`` take a lock and validate on every call (1-2 µs each hot, several
times that with the caches cold between requests, and a request made ten of them). They
are updated only on the event-loop thread, so no lock is needed; a scrape (another
thread) reads them as they are, which at worst splits one request across two scrapes.
"""

from __future__ import annotations

from bisect import bisect_left
from collections.abc import Iterator, Sequence
from typing import Generic, TypeVar
from wsgiref.simple_server import WSGIServer

from prometheus_client import CollectorRegistry, Counter, Gauge, start_http_server
from prometheus_client.metrics_core import (
    CounterMetricFamily,
    HistogramMetricFamily,
    Metric,
)
from prometheus_client.registry import Collector
from prometheus_client.utils import floatToGoString

__all__ = ["LATENCY_BUCKETS", "LoopCounter", "LoopHistogram", "Metrics"]

# Seconds, from 10 µs (a cached small lookup) to 10 s (a queue backed up under overload).
LATENCY_BUCKETS = (1e-5, 2.5e-5, 5e-5, 1e-4, 2.5e-4, 5e-4, 1e-3, 2.5e-3, 5e-3, 1e-2,
                   2.5e-2, 5e-2, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)
_TOKEN_BUCKETS = (1, 4, 16, 64, 256, 1024, 4096, 16384, 65536, 262144)
_REQUEST_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256)


class _CounterChild:
    __slots__ = ("value",)

    def __init__(self) -> None:
        self.value = 0.0

    def inc(self, amount: float = 1.0) -> None:
        """Add ``amount`` (event-loop thread only)."""
        self.value += amount


class _HistogramChild:
    __slots__ = ("bounds", "counts", "sum")

    def __init__(self, bounds: tuple[float, ...]) -> None:
        self.bounds = bounds
        self.counts = [0] * (len(bounds) + 1)  # the last one is +Inf
        self.sum = 0.0

    def observe(self, value: float) -> None:
        """Count ``value`` in its bucket (event-loop thread only)."""
        self.counts[bisect_left(self.bounds, value)] += 1  # le: value <= bound
        self.sum += value


Child = TypeVar("Child", _CounterChild, _HistogramChild)


class _LoopMetric(Collector, Generic[Child]):
    """Children per label tuple; unlabelled metrics export zeros from the start."""

    def __init__(self, name: str, documentation: str, labelnames: Sequence[str],
                 registry: CollectorRegistry) -> None:
        self.name, self.documentation = name, documentation
        self.labelnames = tuple(labelnames)
        self._children: dict[tuple[str, ...], Child] = {}
        if not self.labelnames:
            self._children[()] = self._new_child()
        registry.register(self)

    def _new_child(self) -> Child:
        raise NotImplementedError

    def labels(self, *values: str) -> Child:
        """The child for these label values (created on first use)."""
        # One call, not two: several of these run per request.
        return self._children.get(values) or self._add(values)

    def _add(self, values: tuple[str, ...]) -> Child:
        """The child for label values seen for the first time."""
        if len(values) != len(self.labelnames):
            raise ValueError(f"{self.name}: expected labels {self.labelnames}, got {values}")
        child = self._children[values] = self._new_child()
        return child

    def _snapshot(self) -> list[tuple[tuple[str, ...], Child]]:
        return list(self._children.items())  # the dict may grow while a scrape reads it


class LoopCounter(_LoopMetric[_CounterChild]):
    """A counter updated from the event loop; exported as ``<name>_total``."""

    def _new_child(self) -> _CounterChild:
        return _CounterChild()

    def inc(self, amount: float = 1.0) -> None:
        """Add to the unlabelled counter."""
        self._children[()].value += amount

    def collect(self) -> Iterator[Metric]:
        """One counter family (the registry's scrape)."""
        family = CounterMetricFamily(self.name, self.documentation, labels=self.labelnames)
        for values, child in self._snapshot():
            family.add_metric(values, child.value)
        yield family


class LoopHistogram(_LoopMetric[_HistogramChild]):
    """A histogram updated from the event loop, with fixed upper bounds."""

    def __init__(self, name: str, documentation: str, labelnames: Sequence[str],
                 buckets: Sequence[float], registry: CollectorRegistry) -> None:
        self.bounds = tuple(float(b) for b in buckets)
        self._le = [floatToGoString(b) for b in self.bounds] + ["+Inf"]
        super().__init__(name, documentation, labelnames, registry)

    def _new_child(self) -> _HistogramChild:
        return _HistogramChild(self.bounds)

    def observe(self, value: float) -> None:
        """Observe into the unlabelled histogram (the child's ``observe``, inlined: three
        of these run per request)."""
        child = self._children[()]
        child.counts[bisect_left(self.bounds, value)] += 1  # le: value <= bound
        child.sum += value

    def collect(self) -> Iterator[Metric]:
        """One histogram family with cumulative buckets (the registry's scrape)."""
        family = HistogramMetricFamily(self.name, self.documentation, labels=self.labelnames)
        for values, child in self._snapshot():
            counts = list(child.counts)
            cumulative, buckets = 0, []
            for le, n in zip(self._le, counts):
                cumulative += n
                buckets.append((le, float(cumulative)))
            family.add_metric(values, buckets, child.sum)
        yield family


class Metrics:
    """Every metric the service exports. With ``counting`` False (``--metrics-port -1``:
    nothing can read them) the per-request series are never touched: the frame, admission
    and the batcher skip them, so metrics that are off cost a request nothing."""

    def __init__(self, counting: bool = True) -> None:
        self.counting = counting  # False: no request updates a series (metrics are off)
        self._http: WSGIServer | None = None  # the /metrics endpoint, once served
        r = self.registry = CollectorRegistry()
        self.requests = LoopCounter(
            "embed_requests", "RPCs finished, by status code.", ["rpc", "model", "code"], r)
        self.request_duration = LoopHistogram(
            "embed_request_duration_seconds", "RPC wall time in the server.",
            ["rpc", "model"], LATENCY_BUCKETS, r)
        self.queue_duration = LoopHistogram("embed_queue_duration_seconds",
                                            "Time a request waited for its batch.", [],
                                            LATENCY_BUCKETS, r)
        self.tokenize_duration = LoopHistogram("embed_tokenize_duration_seconds",
                                               "Time to tokenize one text.", [],
                                               LATENCY_BUCKETS, r)
        self.compute_duration = LoopHistogram(
            "embed_compute_duration_seconds", "Gather+add+encode time of one batch.",
            ["device"], LATENCY_BUCKETS, r)
        self.batch_tokens = LoopHistogram("embed_batch_tokens", "Tokens per batch.", [],
                                          _TOKEN_BUCKETS, r)
        self.batch_requests = LoopHistogram("embed_batch_requests", "Requests per batch.", [],
                                            _REQUEST_BUCKETS, r)
        self.tokens = LoopCounter("embed_tokens", "Token rows returned.", ["model"], r)
        self.output_bytes = LoopCounter(
            "embed_output_bytes", "Tensor bytes returned.", ["model", "dtype"], r)
        self.inflight = 0  # RPCs being handled now (event-loop thread only)
        Gauge("embed_inflight_requests", "RPCs being handled now.",
              registry=r).set_function(lambda: self.inflight)
        self.queue_tokens = Gauge("embed_queue_tokens", "Tokens waiting for compute.",
                                  registry=r)
        self.untrained_lookups = LoopCounter(
            "embed_untrained_token_lookups",
            "Looked-up token rows never updated in training.", ["model"], r)
        # Rare events, updated from the repository's thread: prometheus_client's locks.
        self.model_info = Gauge("embed_model_info", "Loaded model versions (value 1).",
                                ["model", "version", "checkpoint_id", "dim", "vocab_size",
                                 "max_seq_len", "position", "device"], registry=r)
        self.model_loads = Counter("embed_model_loads", "Model version load attempts.",
                                   ["model", "result"], registry=r)

    # A request reports to these once per stage (a finished RPC, a job's rows, a batch),
    # one call each: the frame and admission name what happened, not the series it feeds.

    def request_done(self, rpc: str, model: str, code: str, seconds: float) -> None:
        """Count a finished RPC by status and observe its wall time (event-loop thread)."""
        self.requests.labels(rpc, model, code).value += 1
        self.request_duration.labels(rpc, model).observe(seconds)

    def rows_returned(self, model: str, dtype: str, tokens: int, nbytes: int,
                      queue_seconds: float) -> None:
        """A job's token rows and output bytes, and the time it waited for its batch
        (event-loop thread)."""
        self.tokens.labels(model).value += tokens
        self.output_bytes.labels(model, dtype).value += nbytes
        self.queue_duration.observe(queue_seconds)

    def observe_batch(self, tokens: int, requests: int, seconds: float, device: str) -> None:
        """Record one batch (event-loop thread)."""
        self.batch_tokens.observe(tokens)
        self.batch_requests.observe(requests)
        self.compute_duration.labels(device).observe(seconds)

    def serve(self, host: str, port: int) -> int:
        """Expose /metrics over HTTP; returns the bound port (``port`` 0 picks one)."""
        server, _thread = start_http_server(port, addr=host, registry=self.registry)
        self._http = server
        return int(server.server_port)

    def close(self) -> None:
        """Stop the HTTP endpoint."""
        if self._http is not None:
            self._http.shutdown()
            self._http.server_close()
            self._http = None

"""Prometheus metrics (prefix ``embed_``), one registry per server instance.

A registry per instance (not the global default) lets tests run several servers in one
process without their counters bleeding into each other.
"""

from __future__ import annotations

from typing import Any, Generic, TypeVar

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, start_http_server
from prometheus_client.metrics import MetricWrapperBase

__all__ = ["LATENCY_BUCKETS", "Labelled", "Metrics"]

M = TypeVar("M", bound=MetricWrapperBase)

# Seconds, from 10 µs (a cached small lookup) to 10 s (a queue backed up under overload).
LATENCY_BUCKETS = (1e-5, 2.5e-5, 5e-5, 1e-4, 2.5e-4, 5e-4, 1e-3, 2.5e-3, 5e-3, 1e-2,
                   2.5e-2, 5e-2, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)
_TOKEN_BUCKETS = (1, 4, 16, 64, 256, 1024, 4096, 16384, 65536, 262144)
_REQUEST_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256)


class Labelled(Generic[M]):
    """A labelled metric whose children are looked up once per label tuple.

    ``Metric.labels()`` validates and locks on every call (~5 µs); on the request path that
    was a measurable share of a small request. Label values here are bounded (rpc names,
    loaded models, status codes), so the cache is too.
    """

    def __init__(self, metric: M) -> None:
        self.metric = metric
        self._children: dict[tuple[str, ...], Any] = {}

    def labels(self, *values: str) -> Any:
        """The child for these label values (created on first use)."""
        child = self._children.get(values)
        if child is None:
            child = self._children[values] = self.metric.labels(*values)
        return child


class Metrics:
    """Every metric the service exports."""

    def __init__(self) -> None:
        r = self.registry = CollectorRegistry()
        self.requests = Labelled(Counter(
            "embed_requests", "RPCs finished, by status code.", ["rpc", "model", "code"],
            registry=r))
        self.request_duration = Labelled(Histogram(
            "embed_request_duration_seconds", "RPC wall time in the server.",
            ["rpc", "model"], buckets=LATENCY_BUCKETS, registry=r))
        self.queue_duration = Histogram("embed_queue_duration_seconds",
                                        "Time a request waited for its batch.",
                                        buckets=LATENCY_BUCKETS, registry=r)
        self.tokenize_duration = Histogram("embed_tokenize_duration_seconds",
                                           "Time to tokenize one text.",
                                           buckets=LATENCY_BUCKETS, registry=r)
        self.compute_duration = Labelled(Histogram(
            "embed_compute_duration_seconds", "Gather+add+encode time of one batch.",
            ["device"], buckets=LATENCY_BUCKETS, registry=r))
        self.batch_tokens = Histogram("embed_batch_tokens", "Tokens per batch.",
                                      buckets=_TOKEN_BUCKETS, registry=r)
        self.batch_requests = Histogram("embed_batch_requests", "Requests per batch.",
                                        buckets=_REQUEST_BUCKETS, registry=r)
        self.tokens = Labelled(Counter(
            "embed_tokens", "Token rows returned.", ["model"], registry=r))
        self.output_bytes = Labelled(Counter(
            "embed_output_bytes", "Tensor bytes returned.", ["model", "dtype"], registry=r))
        self.inflight = Gauge("embed_inflight_requests", "RPCs being handled now.",
                              registry=r)
        self.queue_tokens = Gauge("embed_queue_tokens", "Tokens waiting for compute.",
                                  registry=r)
        self.untrained_lookups = Labelled(Counter(
            "embed_untrained_token_lookups", "Looked-up token rows never updated in training.",
            ["model"], registry=r))
        self.model_info = Gauge("embed_model_info", "Loaded model versions (value 1).",
                                ["model", "version", "checkpoint_id", "dim", "vocab_size",
                                 "max_seq_len", "position", "device"], registry=r)
        self.model_loads = Counter("embed_model_loads", "Model version load attempts.",
                                   ["model", "result"], registry=r)

    def observe_batch(self, tokens: int, requests: int, seconds: float, device: str) -> None:
        """Record one batch (called from the compute thread; prometheus_client is locked)."""
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
        http = getattr(self, "_http", None)
        if http is not None:
            http.shutdown()
            http.server_close()

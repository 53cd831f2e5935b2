"""Server configuration: one frozen dataclass, parsed once at start-up.

Every flag has an ``EMBED_*`` environment fallback (``--grpc-port`` ↔ ``EMBED_GRPC_PORT``);
a flag given on the command line wins. Nothing here reads the environment at import.
"""

from __future__ import annotations

import argparse
import os
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, fields
from pathlib import Path

from genproto.embedding.v1 import embedding_pb2 as pb

# The storage dtypes, named from the generated enum as service/dtypes.py names them (that
# module imports torch, which the workers' supervising parent never loads).
TABLE_DTYPE_NAMES = tuple(name.removeprefix("DTYPE_").lower() for name, _ in pb.DType.items())

__all__ = ["ServerConfig", "parse_config"]


@dataclass(frozen=True)
class ServerConfig:
    """Everything the server needs to know; defaults suit one CPU pod."""

    # Root of models/<model>/<version>/ directories.
    model_repository: Path = Path("models")
    # Model served when a request leaves `model` empty; "" = the first name in sorted order.
    default_model: str = ""
    # Pin versions: "name=3,other=1"; unpinned models serve their newest valid version.
    pin_versions: str = ""
    # Loopback by default: exposing the port is a deployment decision.
    host: str = "127.0.0.1"
    # 0 picks a free port (tests); the chosen port is logged and exposed on the handle.
    grpc_port: int = 50051
    # Prometheus /metrics; 0 picks a free port, -1 disables.
    metrics_port: int = 9464
    # auto = cuda when torch sees a GPU, else cpu; or cpu, cuda, cuda:N.
    device: str = "auto"
    # Dtype the tables are held in on the device: "stored" keeps the checkpoint's (a bf16
    # table stays a memory map, widened row by row as gathered); the add is always fp32.
    table_dtype: str = "stored"
    # Token budget of one gather+add: bounds per-batch memory ([tokens, C] floats).
    max_batch_tokens: int = 16384
    # 0 = take what is queued now (TEI's default): no latency added at low load.
    max_batch_delay_us: int = 0
    # Tokens waiting for compute before new work gets RESOURCE_EXHAUSTED.
    max_queue_tokens: int = 262144
    # Per-request token cap (also bounded by each model's max_seq_len).
    max_tokens_per_request: int = 8192
    # Text longer than this (UTF-8 bytes) is refused before tokenizing.
    max_text_bytes: int = 1 << 20
    # gRPC send/receive cap; a response that would exceed it is RESOURCE_EXHAUSTED.
    max_message_bytes: int = 64 << 20
    # Per-request cap on the [T, C] output bytes in the requested dtype, whichever way they
    # leave (response or shared memory); 0 = bounded by max_message_bytes (or the region).
    max_output_bytes: int = 0
    # How often the repository is re-scanned for new versions; 0 disables hot reload.
    poll_seconds: float = 5.0
    # SIGTERM: NOT_SERVING at once, then in-flight requests get this long to finish.
    shutdown_grace_seconds: float = 10.0
    # TLS: cert+key enable TLS; a client CA additionally requires client certificates.
    tls_cert: str = ""
    tls_key: str = ""
    tls_client_ca: str = ""
    # Shared secret for `authorization: Bearer <token>`; "" disables the check.
    auth_token: str = ""
    # json for log shippers, text for people.
    log_format: str = "text"
    # Tokenizer threads (tiktoken releases the GIL); 0 = one per core.
    tokenize_threads: int = 0
    # torch intra-op threads for CPU lookups. Parallelism comes from batching and gRPC's
    # own threads; OpenMP fork/join per add fights them for the cores (measured: 2 threads
    # on 2 cores halved T=1024 throughput). 0 = torch's default.
    torch_threads: int = 1
    # Server processes sharing the port (SO_REUSEPORT); each holds its own copy of the tables.
    workers: int = 1
    # --- request cost and memory bounds (docs/security.md) ---
    # Sequences in one request (EmbedBatch inputs, OIP B); refused from the count alone,
    # before anything is done per input. Each needs >= 1 token, so more than
    # max_tokens_per_request can never succeed anyway.
    max_inputs_per_request: int = 1024
    # UTF-8 bytes of text summed over a request's inputs, refused before any is tokenized
    # (tokenizing costs ~0.7 CPU-s per MiB): bounds one request's tokenizer time.
    max_request_text_bytes: int = 1 << 20
    # RPCs in flight (streams count once); past it gRPC core answers RESOURCE_EXHAUSTED
    # without running any Python. 0 = no cap.
    max_concurrent_rpcs: int = 512
    # Per EmbedStream: bytes of answers finished but not yet taken by the client. Past it
    # the stream stops reading requests until the client reads (one answer is always let
    # through, however large).
    max_stream_buffer_bytes: int = 16 << 20
    # The same, summed over every stream: past it each stream holds one answer at most, so
    # a few clients that never read cannot hold more than this between them. 0 = no cap.
    max_unsent_bytes: int = 256 << 20
    # --- tracing (service/tracing.py) ---
    # OTLP/gRPC collector for traces, e.g. http://otel-collector:4317; "" = tracing off:
    # no exporter, no interceptor, nothing per request. The standard OTEL_EXPORTER_OTLP_*
    # variables (headers, certificates, timeout, compression) still apply to the exporter.
    otlp_endpoint: str = ""
    # Fraction of new traces recorded; a client's sampled/unsampled traceparent is obeyed.
    trace_sample_ratio: float = 1.0
    # --- HTTP (service/rpc/http.py): the Open Inference Protocol's REST form, the page ---
    # REST port (KServe v2 / Triton HTTP), same loop, admission and batches as gRPC, same
    # TLS files and token; 0 picks a free port (tests), -1 turns HTTP off.
    http_port: int = 8000
    # The page at / on the HTTP port: --ui / --no-ui (EMBED_UI=1/0); unset = on unless
    # --auth-token is set (the page is for a person at a browser, not for a locked service).
    ui: bool | None = None
    # --- identities and shared memory (service/rpc/identity.py, service/engine/shm.py) ---
    # File of `name token` lines: one bearer token per client, whose name is the identity
    # that owns its shared-memory regions; re-read when it changes (looked at <= 1/s).
    auth_tokens: str = ""
    # Serve the shared-memory RPCs to non-loopback peers (refused: PERMISSION_DENIED).
    shm_allow_remote: bool = False
    # Regions one identity may hold at once, and all identities together (each region
    # holds one open descriptor; nothing is mapped); beyond: RESOURCE_EXHAUSTED.
    max_shm_regions_per_identity: int = 16
    max_shm_regions: int = 1024

    def __post_init__(self) -> None:
        if self.table_dtype not in ("stored", *TABLE_DTYPE_NAMES):
            raise ValueError(f"table_dtype {self.table_dtype!r}: "
                             f"stored|{'|'.join(TABLE_DTYPE_NAMES)}")
        if self.log_format not in ("json", "text"):
            raise ValueError(f"log_format {self.log_format!r}: json|text")
        if self.max_batch_tokens <= 0 or self.max_queue_tokens < self.max_batch_tokens:
            raise ValueError("need 0 < max_batch_tokens <= max_queue_tokens")
        if bool(self.tls_cert) != bool(self.tls_key):
            raise ValueError("tls_cert and tls_key go together")
        if self.max_output_bytes < 0:
            raise ValueError("max_output_bytes must be >= 0 (0 = no separate cap)")
        for name in ("max_inputs_per_request", "max_request_text_bytes",
                     "max_stream_buffer_bytes"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1")
        if self.max_concurrent_rpcs < 0 or self.max_unsent_bytes < 0:
            raise ValueError("max_concurrent_rpcs and max_unsent_bytes must be >= 0 (0 = no cap)")
        if self.workers < 1:
            raise ValueError("workers must be >= 1")
        if not 0.0 <= self.trace_sample_ratio <= 1.0:
            raise ValueError(f"trace_sample_ratio {self.trace_sample_ratio}: 0..1")
        if not 0 < self.max_shm_regions_per_identity <= self.max_shm_regions:
            raise ValueError("need 0 < max_shm_regions_per_identity <= max_shm_regions")


def _flag(name: str) -> str:
    return "--" + name.replace("_", "-")


def _is_bool(annotation: object) -> bool:
    return str(annotation).replace(" ", "") in ("bool", "bool|None")


def _env_bool(raw: str) -> bool:
    """An environment variable's truth: 1/true/yes/on or 0/false/no/off."""
    word = raw.strip().lower()
    if word in ("1", "true", "yes", "on"):
        return True
    if word in ("0", "false", "no", "off"):
        return False
    raise ValueError(raw)


def parse_config(argv: Sequence[str] | None = None,
                 environ: Mapping[str, str] | None = None) -> ServerConfig:
    """Flags, then ``EMBED_*`` environment variables, then the dataclass defaults."""
    env = os.environ if environ is None else environ
    parser = argparse.ArgumentParser(prog="python -m service",
                                     description="Serve input embeddings over gRPC and HTTP.")
    defaults = ServerConfig()
    for f in fields(ServerConfig):
        default = getattr(defaults, f.name)
        env_name = "EMBED_" + f.name.upper()
        if _is_bool(f.type):  # --x / --no-x; bool("0") would be True
            parser.add_argument(_flag(f.name), dest=f.name, default=None,
                                action=argparse.BooleanOptionalAction,
                                help=f"(env {env_name}=1|0; default {default!s})")
            continue
        parser.add_argument(_flag(f.name), dest=f.name, type=type(default), default=None,
                            help=f"(env {env_name}; default {default!s})")
    ns = parser.parse_args(argv)
    values: dict[str, object] = {}
    for f in fields(ServerConfig):
        kind: Callable[[str], object] = (_env_bool if _is_bool(f.type)
                                         else type(getattr(defaults, f.name)))
        value = getattr(ns, f.name)
        if value is None and ("EMBED_" + f.name.upper()) in env:
            raw = env["EMBED_" + f.name.upper()]
            try:
                value = kind(raw)
            except ValueError:
                name = getattr(kind, "__name__", "") if kind is not _env_bool else "bool (1|0)"
                parser.error(f"EMBED_{f.name.upper()}={raw!r} is not a valid {name}")
        if value is not None:
            values[f.name] = value
    try:
        return ServerConfig(**values)  # type: ignore[arg-type]
    except ValueError as e:
        parser.error(str(e))
        raise  # unreachable: parser.error exits

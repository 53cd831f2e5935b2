"""Server configuration: one frozen dataclass, parsed once at start-up.

Every flag has an ``EMBED_*`` environment fallback (``--grpc-port`` ↔ ``EMBED_GRPC_PORT``);
a flag given on the command line wins. Each field's ``help`` metadata is the one place a
knob is described: ``python -m service --help`` prints it with the flag's environment
variable and default, read from the same field. ``RULES`` (service/config_rules.py) says
what each field accepts: a flag or variable that cannot work is refused as it is parsed,
naming it, and a config built in code is checked by the same rules. What the filesystem must hold
(the repository, the TLS files) is checked by service/preflight.py before anything is
bound. Nothing here reads the environment at import.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import NoReturn

from client import flags
from client.flags import flag_name
from service.config_rules import RULES, TABLE_DTYPE_NAMES, parse_pins

__all__ = ["RULES", "ServerConfig", "env_name", "exit_with", "parse_config", "parse_pins"]


def _help(text: str) -> dict[str, str]:
    """A field's metadata: the help text ``--help`` prints for its flag."""
    return {"help": text}


def env_name(name: str) -> str:
    """``max_batch_tokens`` → ``EMBED_MAX_BATCH_TOKENS``."""
    return "EMBED_" + name.upper()


@dataclass(frozen=True)
class ServerConfig:
    """Everything the server needs to know; defaults suit one CPU pod."""

    model_repository: Path = field(default=Path("models"), metadata=_help(
        "root of models/<model>/<version>/ directories; must exist (it may be empty: the server "
        "then starts live but not ready, and loads what appears)"))
    default_model: str = field(default="", metadata=_help(
        "model served when a request leaves `model` empty; empty = the first loaded name in "
        "sorted order. Must name a model of a non-empty repository"))
    pin_versions: str = field(default="", metadata=_help(
        "pin versions, e.g. tiny=3,other=1; unpinned models serve their newest valid version. A "
        "pinned version must be in the repository"))
    host: str = field(default="127.0.0.1", metadata=_help(
        "address every listener binds; loopback by default: exposing the ports is a deployment "
        "decision (0.0.0.0 or :: for all)"))
    grpc_port: int = field(default=50051, metadata=_help(
        "gRPC port (native API and OIP); 0 picks a free port (logged and on the test handle)"))
    metrics_port: int = field(default=9464, metadata=_help(
        "Prometheus /metrics port (worker i uses this + i); 0 picks a free port, -1 turns "
        "metrics off"))
    device: str = field(default="auto", metadata=_help(
        "auto = cuda when torch sees a GPU, else cpu; or cpu, cuda, cuda:N"))
    table_dtype: str = field(default="stored", metadata=_help(
        "dtype the tables are held in on the device: stored keeps the checkpoint's (a bf16 "
        "table stays bf16 in memory, half the bytes of float32, and its rows are widened as "
        f"gathered), or {', '.join(TABLE_DTYPE_NAMES)} (converted at load); the position add "
        "is always fp32"))
    max_batch_tokens: int = field(default=16384, metadata=_help(
        "token budget of one gather+add: bounds per-batch memory ([tokens, C] floats)"))
    max_batch_delay_us: int = field(default=0, metadata=_help(
        "microseconds a batch waits for more work; 0 = take what is queued now (no latency "
        "added at low load)"))
    max_queue_tokens: int = field(default=262144, metadata=_help(
        "tokens waiting for compute before new work gets RESOURCE_EXHAUSTED"))
    max_tokens_per_request: int = field(default=8192, metadata=_help(
        "per-request token cap (also bounded by each model's max_seq_len)"))
    max_text_bytes: int = field(default=1 << 20, metadata=_help(
        "text longer than this (UTF-8 bytes) is refused before tokenizing"))
    max_message_bytes: int = field(default=64 << 20, metadata=_help(
        "gRPC send/receive cap; a response that would exceed it is RESOURCE_EXHAUSTED"))
    max_output_bytes: int = field(default=0, metadata=_help(
        "per-request cap on the [T, C] output bytes in the requested dtype, whichever way they "
        "leave (response or shared memory); 0 = bounded by --max-message-bytes"))
    poll_seconds: float = field(default=5.0, metadata=_help(
        "how often the repository is re-scanned for new, removed and repaired versions; 0 "
        "disables hot reload"))
    load_grace_seconds: float = field(default=30.0, metadata=_help(
        "a new version that fails to load is 'not ready yet' (still being copied in: logged, "
        "not counted as a failure) until it has stayed unchanged this long; then it is refused "
        'and counted in embed_model_loads_total{result="error"}'))
    shutdown_grace_seconds: float = field(default=10.0, metadata=_help(
        "on SIGTERM: NOT_SERVING at once, then in-flight requests get this long to finish"))
    tls_cert: str = field(default="", metadata=_help(
        "PEM certificate file: with --tls-key enables TLS on the gRPC and HTTP ports"))
    tls_key: str = field(default="", metadata=_help(
        "PEM private key file of --tls-cert"))
    tls_client_ca: str = field(default="", metadata=_help(
        "PEM CA file: clients must present a certificate it signed"))
    auth_token: str = field(default="", metadata=_help(
        "shared secret for `authorization: Bearer <token>` (identity `default`); empty disables "
        "the check"))
    log_format: str = field(default="text", metadata=_help(
        "json for log shippers, text for people"))
    tokenize_threads: int = field(default=0, metadata=_help(
        "tokenizer threads (tiktoken releases the GIL); 0 = one per core"))
    torch_threads: int = field(default=1, metadata=_help(
        "torch intra-op threads for CPU lookups; parallelism comes from batching and gRPC's "
        "threads, so more threads here compete with them for the cores; 0 = torch's default"))
    workers: int = field(default=1, metadata=_help(
        "server processes sharing the ports (SO_REUSEPORT); the tables present at start are "
        "read once and every worker maps that one sealed copy (a version loaded later is "
        "read by each worker); needs fixed --grpc-port and --http-port"))
    # --- request cost and memory bounds (docs/security.md) ---
    max_inputs_per_request: int = field(default=1024, metadata=_help(
        "sequences in one request (EmbedBatch inputs, OIP B), refused from the count alone, "
        "before anything is done per input"))
    max_request_text_bytes: int = field(default=1 << 20, metadata=_help(
        "UTF-8 bytes of text summed over a request's inputs, refused before any is tokenized "
        "(bounds one request's tokenizer time)"))
    max_concurrent_rpcs: int = field(default=512, metadata=_help(
        "RPCs in flight (streams count once); past it gRPC core answers RESOURCE_EXHAUSTED "
        "without running any Python; 0 = no cap"))
    max_stream_buffer_bytes: int = field(default=16 << 20, metadata=_help(
        "per EmbedStream: bytes of answers not yet taken by the client; past it the stream "
        "stops reading requests (one answer always passes)"))
    max_unsent_bytes: int = field(default=256 << 20, metadata=_help(
        "the same summed over every stream: past it each stream holds one answer at most; 0 = "
        "no cap"))
    # --- tracing (service/tracing.py) ---
    otlp_endpoint: str = field(default="", metadata=_help(
        "OTLP/gRPC trace collector, e.g. http://otel-collector:4317; empty = tracing off (the "
        "standard OTEL_EXPORTER_OTLP_* variables still apply)"))
    trace_sample_ratio: float = field(default=1.0, metadata=_help(
        "fraction of new traces recorded, 0..1; a client's sampled/unsampled traceparent is "
        "obeyed"))
    # --- HTTP (service/rpc/http.py): the Open Inference Protocol's REST form, the page ---
    http_port: int = field(default=8000, metadata=_help(
        "REST port (KServe v2 / Triton HTTP, and the page); same TLS files and token as gRPC; 0 "
        "picks a free port, -1 turns HTTP off"))
    ui: bool | None = field(default=None, metadata=_help(
        "the page at / on the HTTP port: --ui / --no-ui (EMBED_UI=1|0); unset = on unless a "
        "token is required"))
    # --- identities and shared memory (service/rpc/identity.py, service/engine/shm.py) ---
    auth_tokens: str = field(default="", metadata=_help(
        "file of `name token` lines: one bearer token per client, whose name is the identity "
        "owning its shared-memory regions; re-read when it changes"))
    shm_allow_remote: bool = field(default=False, metadata=_help(
        "serve the shared-memory RPCs to non-loopback peers (else PERMISSION_DENIED)"))
    max_shm_regions_per_identity: int = field(default=16, metadata=_help(
        "shared-memory regions one identity may hold at once"))
    max_shm_regions: int = field(default=1024, metadata=_help(
        "shared-memory regions all identities together may hold (one open descriptor each)"))

    def __post_init__(self) -> None:
        for message in self._problems():
            raise ValueError(message)

    def _problems(self) -> list[str]:
        """What makes this config unusable, each naming its flag and the accepted values:
        each field by its rule, then the rules between fields."""
        problems = []
        for f in fields(self):
            problem = RULES[f.name].problem(getattr(self, f.name))
            if problem is not None:
                problems.append(f"{flag_name(f.name)}: {problem}")
        if problems:
            return problems
        if self.max_queue_tokens < self.max_batch_tokens:
            problems.append(f"--max-batch-tokens {self.max_batch_tokens} and "
                            f"--max-queue-tokens {self.max_queue_tokens}: need "
                            f"--max-batch-tokens <= --max-queue-tokens")
        if bool(self.tls_cert) != bool(self.tls_key):
            problems.append("--tls-cert and --tls-key go together: give both or neither")
        if self.tls_client_ca and not self.tls_cert:
            problems.append("--tls-client-ca needs --tls-cert and --tls-key (TLS on)")
        if self.max_shm_regions_per_identity > self.max_shm_regions:
            problems.append("need --max-shm-regions-per-identity <= --max-shm-regions")
        if self.ui and self.http_port == -1:
            problems.append("--ui needs the HTTP port: --http-port is -1 (off)")
        problems.extend(self._port_problems())
        return problems

    def _port_problems(self) -> list[str]:
        problems = []
        last_metrics = self.metrics_port + self.workers - 1 if self.metrics_port > 0 else 0
        if last_metrics > 65535:
            problems.append(f"--metrics-port {self.metrics_port}: worker {self.workers - 1} "
                            f"would use {last_metrics}, past 65535")
        if self.workers > 1 and self.grpc_port == 0:
            problems.append("--workers > 1 needs a fixed --grpc-port (0 would differ per "
                            "worker)")
        if self.workers > 1 and self.http_port == 0:
            problems.append("--workers > 1 needs a fixed --http-port, or -1 for no HTTP (0 "
                            "would differ per worker)")
        taken: dict[int, str] = {}
        metrics = (range(self.metrics_port, last_metrics + 1) if self.metrics_port > 0
                   else range(0))
        for port, flag in ((self.grpc_port, "--grpc-port"), (self.http_port, "--http-port"),
                           *((p, "--metrics-port") for p in metrics)):
            if port > 0 and port in taken:
                problems.append(f"{flag} {port}: the same port as {taken[port]}; each "
                                f"listener needs its own port")
            taken.setdefault(port, flag)
        return problems


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


_ENV_BOOL = flags.Rule("1 or 0 (true/false, yes/no, on/off)", _env_bool)
_METAVARS: dict[type, str] = {str: "TEXT", int: "N", float: "X"}


def _shown(default: object) -> str:
    if default is None:
        return "unset"
    return repr(default) if isinstance(default, str) else str(default)


def _parser() -> argparse.ArgumentParser:
    parser = flags.OneLineParser(
        prog="python -m service",
        description="Serve input embeddings over gRPC (native and Open Inference Protocol) "
                    "and HTTP. Every flag also reads its EMBED_* environment variable; a "
                    "flag given here wins. A mistake at start-up is one line on stderr and "
                    "exit status 2.")
    for f in fields(ServerConfig):
        shown = f"(env {env_name(f.name)}; default {_shown(f.default)})"
        text = (f.metadata["help"] + " " + shown).replace("%", "%%")
        if _is_bool(f.type):  # --x / --no-x; bool("0") would be True
            parser.add_argument(flag_name(f.name), dest=f.name, default=None,
                                action=argparse.BooleanOptionalAction, help=text)
            continue
        kind = type(f.default)
        metavar = "PATH" if RULES[f.name].place is not None else _METAVARS[kind]
        parser.add_argument(flag_name(f.name), dest=f.name, default=None, metavar=metavar,
                            help=text)
    flags.install(parser, RULES)
    return parser


def parse_config(argv: Sequence[str] | None = None,
                 environ: Mapping[str, str] | None = None) -> ServerConfig:
    """Flags, then ``EMBED_*`` environment variables, then the dataclass defaults.

    A mistake exits with status 2 and one line naming the flag or variable."""
    env = os.environ if environ is None else environ
    parser = _parser()
    ns = parser.parse_args(argv)
    values: dict[str, object] = {}
    for f in fields(ServerConfig):
        # Every variable set is checked, also one a flag overrides: it is still a mistake
        # in the environment, waiting for the start without that flag.
        rule = _ENV_BOOL if _is_bool(f.type) else RULES[f.name]
        from_env = flags.from_env(parser, rule, env_name(f.name), env)
        value = getattr(ns, f.name)
        value = from_env if value is None else value
        if value is not None:
            values[f.name] = value
    try:
        return ServerConfig(**values)  # type: ignore[arg-type]
    except ValueError as e:
        parser.error(str(e))


def exit_with(message: str) -> NoReturn:
    """Refuse to start: one line on stderr, exit status 2 (as argparse does)."""
    print(f"python -m service: error: {message}", file=sys.stderr, flush=True)
    raise SystemExit(2)

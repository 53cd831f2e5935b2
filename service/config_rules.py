"""What each of the server's settings accepts: ``RULES``, one rule per ServerConfig field
(client/flags.py), read by service/config.py's parser and by ServerConfig itself."""

from __future__ import annotations

import ipaddress
import re
from pathlib import Path

from client import flags
from genproto.embedding.v1 import embedding_pb2 as pb

__all__ = ["RULES", "TABLE_DTYPE_NAMES", "parse_pins"]

# The storage dtypes, named from the generated enum as service/dtypes.py names them (that
# module imports torch, which the workers' supervising parent never loads).
TABLE_DTYPE_NAMES = tuple(name.removeprefix("DTYPE_").lower() for name, _ in pb.DType.items())


def parse_pins(spec: str) -> dict[str, int]:
    """``"a=3,b=1"`` → {"a": 3, "b": 1}; ValueError naming the bad part."""
    pins: dict[str, int] = {}
    for part in filter(None, (p.strip() for p in spec.split(","))):
        name, _, version = part.partition("=")
        name = name.strip()
        version = version.strip()
        if (re.fullmatch(flags.MODEL_NAME, name) is None or not version.isascii()
                or not version.isdigit() or int(version) < 1):
            raise ValueError(f"{part!r} is not <model>=<version> with a model name and a "
                             f"positive version, e.g. tiny=3,other=1")
        if name in pins:
            raise ValueError(f"model {name!r} is pinned twice")
        pins[name] = int(version)
    return pins


def _pins(spec: str) -> str:
    parse_pins(spec)
    return spec


def _host(value: str) -> bool:
    if re.fullmatch(r"[A-Za-z0-9._-]+", value):
        return True
    try:
        ipaddress.IPv6Address(value.removeprefix("[").removesuffix("]"))
    except ValueError:
        return False
    return True


_SECONDS = "a number of seconds"
_BYTES = "a size in bytes"
_FREE = "picks a free port"
_PEM = flags.input_file(optional=True, what="a PEM file")
# What each field accepts; parse_config refuses anything else, naming the flag or variable.
RULES: dict[str, flags.Rule] = {
    "model_repository": flags.input_dir(
        convert=Path, hint="; create it (an empty one is served once a version appears) or "
        "point --model-repository / EMBED_MODEL_REPOSITORY at the directory holding "
        "<model>/<version>/"),
    "default_model": flags.model_name(empty="the first loaded name in sorted order"),
    "pin_versions": flags.Rule("<model>=<version>[,...]", _pins, explains=True),
    "host": flags.Rule("a host name or an address of this machine (127.0.0.1, 0.0.0.0, ::), "
                       "without a port", test=_host),
    "grpc_port": flags.port(zero=_FREE),
    "metrics_port": flags.port(zero=_FREE, off=True),
    "device": flags.DEVICE,
    "table_dtype": flags.choice("stored", *TABLE_DTYPE_NAMES),
    "max_batch_tokens": flags.integer(1, what="a number of tokens"),
    "max_batch_delay_us": flags.integer(0, what="a number of microseconds"),
    "max_queue_tokens": flags.integer(1, what="a number of tokens"),
    "max_tokens_per_request": flags.integer(1, what="a number of tokens"),
    "max_text_bytes": flags.integer(1, what=_BYTES),
    # gRPC holds the message caps in a C int.
    "max_message_bytes": flags.integer(1, 2**31 - 1, what=_BYTES),
    "max_output_bytes": flags.integer(0, what=_BYTES, note="0 = --max-message-bytes"),
    "poll_seconds": flags.number(0, what=_SECONDS, note="0 = no hot reload"),
    "load_grace_seconds": flags.number(0, what=_SECONDS),
    "shutdown_grace_seconds": flags.number(0, what=_SECONDS),
    "tls_cert": _PEM,
    "tls_key": _PEM,
    "tls_client_ca": _PEM,
    "auth_token": flags.TOKEN,
    "log_format": flags.choice("json", "text"),
    "tokenize_threads": flags.integer(0, note="0 = one per core"),
    "torch_threads": flags.integer(0, note="0 = torch's default"),
    "workers": flags.integer(1, what="a number of processes"),
    "max_inputs_per_request": flags.integer(1),
    "max_request_text_bytes": flags.integer(1, what=_BYTES),
    "max_concurrent_rpcs": flags.integer(0, note="0 = no cap"),
    "max_stream_buffer_bytes": flags.integer(1, what=_BYTES),
    "max_unsent_bytes": flags.integer(0, what=_BYTES, note="0 = no cap"),
    "otlp_endpoint": flags.text(
        "'' (off) or a collector URL, http://host:port or https://host:port",
        r"https?://(?:[A-Za-z0-9._-]+|\[[0-9A-Fa-f:.]+\])(?::[0-9]{1,5})?/?", empty=True),
    "trace_sample_ratio": flags.number(0, 1),
    "http_port": flags.port(zero=_FREE, off=True),
    "ui": flags.SWITCH,
    "auth_tokens": flags.input_file(optional=True, what="a file of 'name token' lines"),
    "shm_allow_remote": flags.SWITCH,
    "max_shm_regions_per_identity": flags.integer(1),
    "max_shm_regions": flags.integer(1),
}

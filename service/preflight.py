"""Start-up checks: refuse, in one line, a configuration that cannot work.

Run once before anything is bound or loaded (``python -m service`` and the ``--workers``
parent, which never imports torch): what the filesystem must hold for each setting's rule
(the model repository is a directory, the TLS and token files are readable files:
``Rule.place`` in service/config_rules.py), the default model and every pin name something
in a non-empty repository, and every listener's port is free on ``--host``. Each refusal
is a :class:`StartupError` whose message names the flag, path or port and what to do;
``__main__`` prints it as one line and exits 2.

An existing but empty repository is accepted on purpose: a training job or an init
container may still be filling it, and the server starts live but not ready (health
NOT_SERVING) and loads what appears at the next poll. A default model or pin that names
nothing then is only checked against what loads (one warning line), not refused.
"""

from __future__ import annotations

import errno
import re
import socket
from collections.abc import Iterator
from pathlib import Path

from client import flags
from service.config import RULES, ServerConfig, parse_pins
from service.rpc.identity import parse_tokens

__all__ = ["StartupError", "bind_refusal", "check_config", "check_device", "check_ports",
           "check_tls", "check_tokens_file", "listeners"]

# A version folder's name, as service/format/checkpoint.py's _VERSION (which imports
# torch; the workers' parent never does). tests/service/test_startup.py checks they agree.
VERSION_NAME = re.compile(r"[1-9][0-9]{0,17}")


class StartupError(Exception):
    """A configuration the server cannot start with; the message is one line for people."""


def check_config(config: ServerConfig) -> None:
    """The repository, default model, pins and files: StartupError on the first problem."""
    root = config.model_repository
    refusal = flags.check_places(RULES, vars(config))  # the repository, the TLS and token files
    if refusal is not None:
        raise StartupError(refusal)
    check_tls(config)
    check_tokens_file(config.auth_tokens)
    try:
        models = _models(root)
    except OSError as e:
        raise StartupError(f"--model-repository {root}: cannot be listed ({e.strerror}); "
                           f"make it readable by this user (chmod a+rX)") from None
    if models:  # an empty repository is being filled: what loads is checked then
        known = ", ".join(sorted(models)) or "none"
        if config.default_model and config.default_model not in models:
            raise StartupError(
                f"--default-model {config.default_model!r}: no such model in {root} (models: "
                f"{known}); name one of them, or leave it empty for the first in sorted order")
        for name, version in parse_pins(config.pin_versions).items():
            if name not in models:
                raise StartupError(f"--pin-versions {name}={version}: no model {name!r} in "
                                   f"{root} (models: {known})")
            if version not in models[name]:
                have = ", ".join(map(str, sorted(models[name]))) or "none"
                raise StartupError(
                    f"--pin-versions {name}={version}: {root / name} has no version "
                    f"{version} (versions: {have}); pin one that is there, or remove the pin")


def check_tls(config: ServerConfig) -> None:
    """The TLS files are what they are named (client/flags.py's tls_problem)."""
    problem = flags.tls_problem(config.tls_cert, config.tls_key, config.tls_client_ca,
                                "--tls-client-ca")
    if problem is not None:
        raise StartupError(problem)


def check_tokens_file(path: str) -> None:
    """``--auth-tokens`` holds ``name token`` lines as the server reads them (it re-reads the
    file when it changes; a bad edit then is logged and the old table kept)."""
    if not path:
        return
    try:
        parse_tokens(Path(path).read_bytes().decode("utf-8"), path)
    except UnicodeDecodeError as e:
        raise StartupError(f"--auth-tokens {path}: not UTF-8 text (byte {e.start})") from None
    except ValueError as e:  # names the line: "<path>:<line>: expected 'name token'"
        raise StartupError(f"--auth-tokens {e}") from None


def _models(root: Path) -> dict[str, set[int]]:
    """Model folders of the repository and the version folders each holds."""
    models: dict[str, set[int]] = {}
    for entry in root.iterdir():
        if entry.name.startswith(".") or not entry.is_dir():
            continue
        try:
            versions = {int(p.name) for p in entry.iterdir()
                        if VERSION_NAME.fullmatch(p.name) and p.is_dir()}
        except OSError:
            versions = set()
        models[entry.name] = versions
    return models


def listeners(config: ServerConfig) -> Iterator[tuple[str, int]]:
    """(flag, port) of every fixed port the server (and each worker) will listen on."""
    if config.grpc_port > 0:
        yield "--grpc-port", config.grpc_port
    if config.http_port > 0:
        yield "--http-port", config.http_port
    if config.metrics_port > 0:
        for i in range(config.workers):
            yield "--metrics-port", config.metrics_port + i


def check_ports(config: ServerConfig) -> None:
    """Every listener's port can be bound on ``--host`` now (probed, then released)."""
    try:
        addresses = {info[4][:2]: info[0] for info in socket.getaddrinfo(
            config.host.strip("[]"), None, type=socket.SOCK_STREAM)}
    except socket.gaierror as e:
        raise StartupError(f"--host {config.host}: cannot be resolved ({e.strerror}); give "
                           f"an address of this machine, e.g. 127.0.0.1 or 0.0.0.0") from None
    for flag, port in listeners(config):
        for (address, _), family in addresses.items():
            with socket.socket(family, socket.SOCK_STREAM) as probe:
                # As gRPC, aiohttp and the metrics server bind: TIME_WAIT is no conflict.
                probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
                try:
                    probe.bind((address, port))
                except OSError as e:
                    raise StartupError(bind_refusal(flag, config.host, port, e)) from None


def bind_refusal(flag: str, host: str, port: int, e: BaseException) -> str:
    """One line saying why ``flag``'s port cannot be bound, and what to do."""
    code = getattr(e, "errno", None)
    if code == errno.EADDRINUSE or "in use" in str(e) or "Failed to bind" in str(e):
        return (f"{flag} {port}: port {port} on {host} is already in use (another server "
                f"or a previous instance still running); stop it or choose another port "
                f"with {flag}")
    if code == errno.EADDRNOTAVAIL:
        return (f"--host {host}: not an address of this machine, so {flag} {port} cannot "
                f"be bound; use 127.0.0.1, 0.0.0.0 or one of this host's addresses")
    if code == errno.EACCES:
        return (f"{flag} {port}: binding a port below 1024 needs privileges; choose a port "
                f">= 1024 with {flag}")
    reason = getattr(e, "strerror", None) or str(e).splitlines()[0]
    return f"{flag} {port}: cannot listen on {host}:{port} ({reason})"


def check_device(spec: str) -> None:
    """``--device`` names a device torch has (imports torch: the one-process path only)."""
    import torch

    from service.engine.tables import resolve_device

    try:
        device = resolve_device(spec)
    except (RuntimeError, ValueError) as e:
        if "no CUDA" in str(e):
            raise StartupError(f"--device {spec}: torch sees no CUDA device on this machine; "
                               f"use --device cpu, or auto to take a GPU when there is one"
                               ) from None
        raise StartupError(f"--device {spec!r}: not a device torch knows; use auto, cpu, "
                           f"cuda or cuda:N") from None
    if device.type == "cuda" and device.index is not None:
        count = torch.cuda.device_count()
        if device.index >= count:
            raise StartupError(f"--device {spec}: torch sees {count} CUDA device(s), "
                               f"cuda:0..cuda:{count - 1}; choose one of them")
    elif device.type not in ("cpu", "cuda"):
        raise StartupError(f"--device {spec}: the server runs on cpu or cuda[:N]")

"""Why a connection to a target failed, told apart by looking at what listens there.

grpc reports most connection failures as UNAVAILABLE with wording that varies by release
(a plaintext call to a TLS server is only "Socket closed"). ``probe`` asks the listener
itself, with plain sockets and at most three short connections: does anything accept a
TCP connection, does it complete a TLS handshake, and what does it answer to an HTTP/2
preface (an HTTP/2 SETTINGS frame: a gRPC server; "HTTP/1.1 400 ...": a web server).
``explain`` turns that into one line saying what to try. embedctl uses both.
"""

from __future__ import annotations

import re
import socket
import ssl
from dataclasses import dataclass

from client.grammar import split_target

__all__ = ["Listener", "explain", "probe", "split_target"]

# The client connection preface of HTTP/2 (RFC 9113 §3.4) and an empty SETTINGS frame.
_H2_PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n" + b"\x00\x00\x00\x04\x00\x00\x00\x00\x00"
_SETTINGS = 0x4
# grpc's wording for a TLS failure, e.g. "...OPENSSL_internal:CERTIFICATE_VERIFY_FAILED:
# unable to get local issuer certificate: OK": keep the reason, drop the plumbing.
_TLS_REASON = re.compile(r"OPENSSL_internal:([A-Z_]+)(?:: ([^:]+))?")


@dataclass(frozen=True)
class Listener:
    """What was found at a target: ``kind`` and, for some kinds, a detail."""

    kind: str  # refused | unresolved | timeout | error | tls | grpc | http1 | other
    detail: str = ""


def _connect(host: str, port: int, timeout: float) -> socket.socket:
    return socket.create_connection((host, port), timeout=timeout)


def probe(host: str, port: int, timeout: float = 3.0) -> Listener:
    """Look at what listens at host:port (never raises; ``timeout`` per step)."""
    try:
        sock = _connect(host, port, timeout)
    except ConnectionRefusedError:
        return Listener("refused")
    except socket.gaierror as err:
        return Listener("unresolved", str(err.strerror))
    except TimeoutError:
        return Listener("timeout")
    except OSError as err:
        return Listener("error", err.strerror or str(err))
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    context.check_hostname = False  # only: does it speak TLS at all? (trust is grpc's job)
    context.verify_mode = ssl.CERT_NONE
    try:
        with context.wrap_socket(sock, server_hostname=host):
            return Listener("tls")
    except (ssl.SSLError, OSError):
        pass  # not TLS (or it hung up): ask in plaintext
    try:
        with _connect(host, port, timeout) as plain:
            plain.sendall(_H2_PREFACE)
            answer = plain.recv(64)
    except ConnectionError:  # reset or broken pipe: it hung up on us
        answer = b""
    except OSError as err:
        return Listener("other", err.strerror or str(err))
    if answer.startswith(b"HTTP/"):
        return Listener("http1", answer.split(b"\r\n", 1)[0].decode("ascii", "replace"))
    if len(answer) >= 9 and answer[3] == _SETTINGS:
        return Listener("grpc")
    return Listener("other", "closed the connection" if not answer else "answered bytes "
                    "that are neither HTTP/2 nor HTTP/1.x")


def explain(target: str, listener: Listener, client_tls: bool, details: str) -> str:
    """One line: what is at ``target``, given how the client connected, and what to try."""
    kind = listener.kind
    if kind == "refused":
        return (f"nothing is listening at {target} (connection refused): start the server, "
                f"or point --target (or $EMBED_TARGET) at its gRPC port")
    if kind == "unresolved":
        return f"cannot resolve the host of {target} ({listener.detail}): check --target"
    if kind == "timeout":
        return (f"no TCP answer from {target} (connection timed out): check the host and "
                f"port in --target, and any firewall on the way")
    if kind == "error":
        return f"cannot connect to {target} ({listener.detail}): check --target"
    if kind == "http1":
        return (f"{target} is an HTTP/1.x server, not gRPC (it answered "
                f"'{listener.detail}'): point --target at the gRPC port; the service's "
                f"REST API and page are on another port")
    if kind == "tls" and not client_tls:
        return (f"{target} speaks TLS but embedctl connected in plaintext: add --tls "
                f"(system roots) or --tls-ca CA.pem")
    if kind == "tls":
        reason = _TLS_REASON.search(details)
        why = ": ".join(g for g in reason.groups() if g) if reason else "handshake failed"
        return (f"TLS with {target} failed ({why}): give the CA that signed the server's "
                f"certificate with --tls-ca, use a --target host the certificate names, and "
                f"for mutual TLS --tls-cert and --tls-key")
    if kind == "grpc" and client_tls:
        return (f"{target} speaks plaintext gRPC but embedctl used TLS: drop --tls, "
                f"--tls-ca, --tls-cert and --tls-key")
    if kind == "other":
        return (f"{target} accepted the connection but does not speak gRPC "
                f"({listener.detail}): check the port in --target")
    return f"server not reachable at {target}: {details}"

"""embedctl tells apart why there was no answer, each against a real listener: nothing
listening, a port that is HTTP/1.x (the service's own REST port), a port that accepts and
hangs up, TLS on one side only (both ways), an untrusted certificate, a refused token.
Each is one line on stderr with what to try, exit status 1, no traceback."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from client.diagnose import Listener, probe, split_target
from service.local import ServerHandle
from tests.client.conftest import TOKEN
from tests.tiny_model import start

ROOT = Path(__file__).resolve().parents[2]


def embedctl(*args: str) -> tuple[int, str, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("EMBED_TARGET", "EMBED_TOKEN")}
    proc = subprocess.run([sys.executable, "-m", "client.cli", "--timeout", "10", *args],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=60,
                          check=False)
    return proc.returncode, proc.stdout, proc.stderr


@pytest.fixture(scope="module")
def tls_server(tiny_repo: Path, certs: Path) -> Iterator[ServerHandle]:
    """TLS without client certificates: a server certificate signed by the test CA."""
    handle = start(tiny_repo, tls_cert=str(certs / "server.pem"),
                   tls_key=str(certs / "server.key"))
    yield handle
    handle.stop(grace=0.5)


@pytest.fixture
def closed_port() -> int:
    """A port nothing listens on: bound by the kernel's choice, then released."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
    return port


@pytest.fixture
def hang_up_port() -> Iterator[int]:
    """A TCP listener that accepts every connection and closes it at once."""
    listener = socket.create_server(("127.0.0.1", 0))
    stop = threading.Event()

    def serve() -> None:
        listener.settimeout(0.2)
        while not stop.is_set():
            try:
                conn, _ = listener.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            conn.close()

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    yield listener.getsockname()[1]
    stop.set()
    thread.join(timeout=5)
    listener.close()


def one_line(result: tuple[int, str, str]) -> str:
    code, out, err = result
    assert (code, out) == (1, ""), err
    assert err.count("\n") == 1, err  # one line: no traceback, no grpc log lines
    assert err.startswith("embedctl: ")
    return err.removeprefix("embedctl: ").rstrip("\n")


@pytest.fixture
def targets(server: ServerHandle, tls_server: ServerHandle, closed_port: int,
            hang_up_port: int) -> dict[str, str]:
    """The target of each kind of listener."""
    return {"closed": f"127.0.0.1:{closed_port}", "hangs up": f"127.0.0.1:{hang_up_port}",
            "REST": f"127.0.0.1:{server.http_port}",  # the service's own REST port
            "plaintext": server.target, "TLS": tls_server.target}


# The listener, embedctl's arguments after its --target ({ca}: the test CA), and the one
# line it says ({target}: the listener's).
NO_ANSWER = {
    "nothing listening": ("closed", ["models"],
                          "nothing is listening at {target} (connection refused): start the "
                          "server, or point --target (or $EMBED_TARGET) at its gRPC port"),
    "an HTTP port is not gRPC": ("REST", ["embed", "hello"],
                                 "{target} is an HTTP/1.x server, not gRPC (it answered "
                                 "'HTTP/1.0 400 Bad Request'): point --target at the gRPC "
                                 "port; the service's REST API and page are on another port"),
    "a port that hangs up": ("hangs up", ["models"],
                             "{target} accepted the connection but does not speak gRPC "
                             "(closed the connection): check the port in --target"),
    "plaintext client, TLS server": ("TLS", ["models"],
                                     "{target} speaks TLS but embedctl connected in "
                                     "plaintext: add --tls (system roots) or --tls-ca CA.pem"),
    "TLS client, plaintext server": ("plaintext", ["--tls-ca", "{ca}", "models"],
                                     "{target} speaks plaintext gRPC but embedctl used TLS: "
                                     "drop --tls, --tls-ca, --tls-cert and --tls-key"),
    # --tls: the system roots, which do not hold the test CA.
    "TLS with an untrusted certificate": (
        "TLS", ["--tls", "models"],
        "TLS with {target} failed (CERTIFICATE_VERIFY_FAILED: unable to get local issuer "
        "certificate): give the CA that signed the server's certificate with --tls-ca, use a "
        "--target host the certificate names, and for mutual TLS --tls-cert and --tls-key"),
}


@pytest.mark.parametrize("case", list(NO_ANSWER))
def test_why_there_was_no_answer(targets: dict[str, str], certs: Path, case: str) -> None:
    listener, args, message = NO_ANSWER[case]
    target = targets[listener]
    args = [a.format(ca=certs / "ca.pem") for a in args]
    assert one_line(embedctl("--target", target, *args)) == message.format(target=target)


def test_tls_both_sides_works(tls_server: ServerHandle, certs: Path) -> None:
    code, out, err = embedctl("--target", tls_server.target, "--tls-ca",
                              str(certs / "ca.pem"), "detokenize", "31373,995")
    assert (code, out, err) == (0, "hello world\n", "")


def test_token_missing_or_refused(token_server: ServerHandle) -> None:
    missing = one_line(embedctl("--target", token_server.target, "models"))
    assert missing.startswith("UNAUTHENTICATED: ")
    assert missing.endswith(": the server wants a bearer token; pass it with --token (or "
                            "$EMBED_TOKEN)")
    wrong = one_line(embedctl("--target", token_server.target, "--token", "nope", "models"))
    assert wrong.startswith("UNAUTHENTICATED: ")
    assert wrong.endswith(": the server refused this token; check --token (or $EMBED_TOKEN)")
    code, out, err = embedctl("--target", token_server.target, "--token", TOKEN,
                              "detokenize", "31373")
    assert (code, out, err) == (0, "hello\n", "")


def test_probe_kinds(server: ServerHandle, tls_server: ServerHandle, closed_port: int,
                     hang_up_port: int) -> None:
    assert probe("127.0.0.1", closed_port) == Listener("refused")
    assert probe("127.0.0.1", server.grpc_port) == Listener("grpc")
    assert probe("127.0.0.1", tls_server.grpc_port) == Listener("tls")
    assert probe("127.0.0.1", server.http_port) == Listener("http1", "HTTP/1.0 400 Bad Request")
    assert probe("127.0.0.1", hang_up_port) == Listener("other", "closed the connection")
    assert probe("no-such-host.invalid", 80).kind == "unresolved"


@pytest.mark.parametrize(("target", "split"), [
    ("127.0.0.1:50051", ("127.0.0.1", 50051)),
    ("localhost:1", ("localhost", 1)),
    ("[::1]:50051", ("::1", 50051)),
    ("dns:///svc.ns:443", ("svc.ns", 443)),
    ("unix:/tmp/s.sock", None),
    ("host", None),
    ("host:99999", None),
])
def test_split_target(target: str, split: tuple[str, int] | None) -> None:
    assert split_target(target) == split

"""embedctl tells apart why there was no answer, each against a real listener: nothing
listening, a port that is HTTP/1.x (the service's own REST port), a port that accepts and
hangs up, TLS on one side only (both ways), an untrusted certificate, a refused token.
Each is one line on stderr with what to try, exit status 1, no traceback."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from client.diagnose import Listener, probe, split_target
from service.local import ServerHandle
from tests.client.conftest import TOKEN

ROOT = Path(__file__).resolve().parents[2]


def embedctl(*args: str) -> tuple[int, str, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("EMBED_TARGET", "EMBED_TOKEN")}
    proc = subprocess.run([sys.executable, "-m", "client.cli", "--timeout", "10", *args],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=60,
                          check=False)
    return proc.returncode, proc.stdout, proc.stderr


def one_line(result: tuple[int, str, str]) -> str:
    code, out, err = result
    assert (code, out) == (1, ""), err
    assert err.count("\n") == 1, err  # one line: no traceback, no grpc log lines
    assert err.startswith("embedctl: ")
    return err.removeprefix("embedctl: ").rstrip("\n")


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

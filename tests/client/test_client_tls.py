"""TLS and mutual TLS: certificates made by openssl, a real server with tls_* set."""

from __future__ import annotations

import subprocess
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest

from client import EmbeddingClient, EmbeddingError
from client.cli import main
from service.server import ServerHandle
from tests.tiny_model import start


def _openssl(*args: str, cwd: Path) -> None:
    subprocess.run(["openssl", *args], cwd=cwd, check=True, capture_output=True, timeout=60)


def _signed(name: str, cn: str, d: Path, ext: str) -> None:
    _openssl("req", "-newkey", "rsa:2048", "-nodes", "-keyout", f"{name}.key",
             "-out", f"{name}.csr", "-subj", f"/CN={cn}", cwd=d)
    (d / f"{name}.ext").write_text(ext)
    _openssl("x509", "-req", "-in", f"{name}.csr", "-CA", "ca.pem", "-CAkey", "ca.key",
             "-CAcreateserial", "-days", "2", "-out", f"{name}.pem", "-extfile", f"{name}.ext",
             cwd=d)


@pytest.fixture(scope="module")
def certs(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """ca.pem; server.pem/key for IP 127.0.0.1; client.pem/key; all signed by the CA."""
    d = tmp_path_factory.mktemp("tls")
    _openssl("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", "ca.key",
             "-out", "ca.pem", "-days", "2", "-subj", "/CN=test-ca", cwd=d)
    _signed("server", "localhost", d, "subjectAltName=IP:127.0.0.1,DNS:localhost\n")
    _signed("client", "embed-client", d, "extendedKeyUsage=clientAuth\n")
    return d


@pytest.fixture(scope="module")
def mtls_server(tiny_repo: Path, certs: Path) -> Iterator[ServerHandle]:
    """A server that requires a client certificate signed by the test CA."""
    handle = start(tiny_repo, tls_cert=str(certs / "server.pem"),
                   tls_key=str(certs / "server.key"), tls_client_ca=str(certs / "ca.pem"))
    yield handle
    handle.stop(grace=0.5)


def test_mutual_tls_from_paths_and_bytes(mtls_server: ServerHandle, certs: Path) -> None:
    with EmbeddingClient(mtls_server.target, timeout=30, root_certificates=certs / "ca.pem",
                         client_certificate=certs / "client.pem",
                         client_key=str(certs / "client.key")) as c:
        assert c.embed("hello world").token_ids == [31373, 995]
    with EmbeddingClient(mtls_server.target, timeout=30,
                         root_certificates=(certs / "ca.pem").read_bytes(),
                         client_certificate=(certs / "client.pem").read_bytes(),
                         client_key=(certs / "client.key").read_bytes()) as c:
        assert c.tokenize("hello")[0] == [31373]


def test_without_client_certificate_or_over_plaintext_fails(mtls_server: ServerHandle,
                                                            certs: Path) -> None:
    for kwargs in ({"root_certificates": certs / "ca.pem"}, {}):
        with EmbeddingClient(mtls_server.target, timeout=10, **kwargs) as c, \
                pytest.raises(EmbeddingError) as info:
            c.embed("hello world")
        assert info.value.code == grpc.StatusCode.UNAVAILABLE
        assert info.value.unreachable  # grpc only says "Socket closed" for a TLS mismatch


def test_embedctl_tls_flags(mtls_server: ServerHandle, certs: Path,
                            capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--target", mtls_server.target, "--tls-ca", str(certs / "ca.pem"),
                 "--tls-cert", str(certs / "client.pem"), "--tls-key",
                 str(certs / "client.key"), "detokenize", "31373,995"]) == 0
    assert capsys.readouterr() == ("hello world\n", "")
    assert main(["--target", mtls_server.target, "--tls-ca", str(certs / "missing.pem"),
                 "models"]) == 1
    err = capsys.readouterr().err
    assert err == f"embedctl: cannot read {certs / 'missing.pem'}: No such file or directory\n"

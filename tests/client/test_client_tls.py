"""TLS and mutual TLS: certificates made by openssl, a real server with tls_* set."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest

from client import EmbeddingClient, EmbeddingError
from client.cli import main
from service.local import ServerHandle
from tests.tiny_model import start


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
    with pytest.raises(SystemExit) as e:  # a usage error, before any connection
        main(["--target", mtls_server.target, "--tls-ca", str(certs / "missing.pem"), "models"])
    assert e.value.code == 2
    err = capsys.readouterr().err
    assert err == f"embedctl: error: --tls-ca {certs / 'missing.pem'}: no such file (see --help)\n"

"""TLS and mutual TLS on the HTTP port, from the gRPC port's --tls-* files."""

from __future__ import annotations

import ssl
from collections.abc import Iterator
from pathlib import Path

import pytest

from service.local import ServerHandle
from tests.client.conftest import certs  # noqa: F401  (the openssl-made CA and certs)
from tests.service.rpc.http.conftest import infer_body, request
from tests.tiny_model import start


@pytest.fixture(scope="module")
def mtls(tiny_repo: Path, certs: Path) -> Iterator[ServerHandle]:  # noqa: F811
    handle = start(tiny_repo, tls_cert=str(certs / "server.pem"),
                   tls_key=str(certs / "server.key"), tls_client_ca=str(certs / "ca.pem"))
    yield handle
    handle.stop(grace=0.5)


def test_mutual_tls(mtls: ServerHandle, certs: Path) -> None:  # noqa: F811
    context = ssl.create_default_context(cafile=str(certs / "ca.pem"))
    context.load_cert_chain(str(certs / "client.pem"), str(certs / "client.key"))
    reply = request(mtls.http_port, "POST", "/v2/models/tiny/infer",
                    infer_body(texts=["hello world"]), context=context)
    assert reply.status == 200
    assert reply.json()["outputs"][1]["data"] == [2]


def test_without_client_certificate_or_in_plaintext_fails(mtls: ServerHandle,
                                                          certs: Path) -> None:  # noqa: F811
    no_cert = ssl.create_default_context(cafile=str(certs / "ca.pem"))
    with pytest.raises((ssl.SSLError, ConnectionError)):
        request(mtls.http_port, "GET", "/v2/health/ready", context=no_cert)
    with pytest.raises(ConnectionError):
        request(mtls.http_port, "GET", "/v2/health/ready")

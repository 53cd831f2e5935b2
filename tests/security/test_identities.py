"""Identities: a token file (``name token`` lines, re-read when it changes), the one
``--auth-token`` ("default"), a client certificate's subject under mutual TLS, and one
shared namespace when auth is off."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import grpc
import pytest

from genproto.embedding.v1 import embedding_pb2 as pb
from service.config import ServerConfig
from service.local import ServerHandle
from service.rpc import identity
from service.rpc.identity import Identities, parse_tokens
from tests.security.shm_helpers import As, MakeObject, channel
from tests.tiny_model import start


def _write(path: Path, text: str) -> None:
    """Replace the file's content and make sure its stat stamp changes."""
    path.write_text(text)
    st = path.stat()
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns + 1_000_000_000))


def test_token_file_is_reloaded_when_it_changes(
        tiny_repo: Path, tmp_path: Path, objects: MakeObject,
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(identity, "RELOAD_CHECK_S", 0.0)  # look at the file on every call
    tokens = tmp_path / "tokens"
    tokens.write_text("# clients\nalice token-a\n\nbob   token-b\n")
    obj = objects(64)
    with start(tiny_repo, auth_tokens=str(tokens)) as handle, channel(handle.target) as ch:
        alice, bob, carol = As(ch, "token-a"), As(ch, "token-b"), As(ch, "token-c")
        alice.register("mine", obj)
        assert (alice.names(), bob.names()) == (["mine"], [])
        assert carol.status("native", "ListSharedMemory", pb.ListSharedMemoryRequest())[0] == \
            grpc.StatusCode.UNAUTHENTICATED
        _write(tokens, "alice token-a\ncarol token-c\n")  # carol added, bob revoked
        assert carol.names() == []
        assert bob.status("native", "ListSharedMemory", pb.ListSharedMemoryRequest())[0] == \
            grpc.StatusCode.UNAUTHENTICATED
        _write(tokens, "alice token-a\nthis line is broken\n")  # keeps the last good table
        assert carol.names() == []
        assert alice.names() == ["mine"]
        _write(tokens, "alice2 token-a\n")  # the same token under a new name: a new identity
        assert alice.names() == []


def test_reload_is_looked_at_no_more_than_once_a_second(tmp_path: Path) -> None:
    tokens = tmp_path / "tokens"
    tokens.write_text("alice token-a\n")
    ids = Identities(tokens_file=str(tokens))
    assert ids.resolve("Bearer token-a") == "alice"
    _write(tokens, "bob token-b\n")
    assert ids.resolve("Bearer token-b") in ("", "bob")  # within the second: maybe not yet
    ids._checked -= identity.RELOAD_CHECK_S  # a second later
    assert (ids.resolve("Bearer token-b"), ids.resolve("Bearer token-a")) == ("bob", "")


def test_token_file_errors() -> None:
    with pytest.raises(ValueError, match="f:2: expected 'name token'"):
        parse_tokens("a t1\nb\n", "f")
    with pytest.raises(ValueError, match="already given to 'a'"):
        parse_tokens("a t1\nb t1\n", "f")
    with pytest.raises(ValueError, match="auth_tokens"):
        Identities(tokens_file="/nonexistent/tokens")


def test_bad_token_file_stops_the_start(tiny_repo: Path, tmp_path: Path) -> None:
    tokens = tmp_path / "tokens"
    tokens.write_text("just-a-name\n")
    with pytest.raises(ValueError, match="expected 'name token'"):
        start(tiny_repo, auth_tokens=str(tokens))


def test_single_token_is_the_default_identity_and_file_tokens_join_it(
        tiny_repo: Path, tmp_path: Path, objects: MakeObject) -> None:
    tokens = tmp_path / "tokens"
    tokens.write_text("ops token-ops\n")
    with start(tiny_repo, auth_token="shared", auth_tokens=str(tokens)) as handle, \
            channel(handle.target) as ch:
        shared, ops = As(ch, "shared"), As(ch, "token-ops")
        shared.register("r", objects(64))
        assert (shared.names(), ops.names()) == (["r"], [])
        assert As(ch, "wrong").status("native", "ListSharedMemory",
                                      pb.ListSharedMemoryRequest())[0] == \
            grpc.StatusCode.UNAUTHENTICATED


def test_auth_off_is_one_namespace(server: ServerHandle,
                                   objects: MakeObject) -> None:
    """Documented: without auth every client is the same identity ("")."""
    with channel(server.target) as a, channel(server.target) as b:
        As(a).register("one-ns", objects(64))
        try:
            assert "one-ns" in As(b).names()
        finally:
            As(b)("native", "UnregisterSharedMemory",
                  pb.UnregisterSharedMemoryRequest(name="one-ns"))


def _openssl(*args: str, cwd: Path) -> None:
    subprocess.run(["openssl", *args], cwd=cwd, check=True, capture_output=True, timeout=60)


@pytest.fixture(scope="module")
def certs(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A CA, a server certificate for 127.0.0.1 and two client certificates (EC keys)."""
    d = tmp_path_factory.mktemp("mtls")
    ec = ("-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes")
    _openssl("req", "-x509", *ec, "-keyout", "ca.key", "-out", "ca.pem", "-days", "2",
             "-subj", "/CN=test-ca", cwd=d)
    for name, cn, ext in (("server", "localhost", "subjectAltName=IP:127.0.0.1\n"),
                          ("alice", "alice", "extendedKeyUsage=clientAuth\n"),
                          ("bob", "bob", "extendedKeyUsage=clientAuth\n")):
        _openssl("req", *ec, "-keyout", f"{name}.key", "-out", f"{name}.csr",
                 "-subj", f"/O=embed/CN={cn}", cwd=d)
        (d / f"{name}.ext").write_text(ext)
        _openssl("x509", "-req", "-in", f"{name}.csr", "-CA", "ca.pem", "-CAkey", "ca.key",
                 "-CAcreateserial", "-days", "2", "-out", f"{name}.pem", "-extfile",
                 f"{name}.ext", cwd=d)
    return d


def test_client_certificate_subject_is_the_identity(
        tiny_repo: Path, certs: Path, objects: MakeObject) -> None:
    config = {"tls_cert": str(certs / "server.pem"), "tls_key": str(certs / "server.key"),
              "tls_client_ca": str(certs / "ca.pem")}
    ServerConfig(**config)  # type: ignore[arg-type]  # the three settings go together

    def secure(name: str) -> grpc.Channel:
        creds = grpc.ssl_channel_credentials(
            (certs / "ca.pem").read_bytes(), (certs / f"{name}.key").read_bytes(),
            (certs / f"{name}.pem").read_bytes())
        return grpc.secure_channel(f"127.0.0.1:{handle.grpc_port}", creds)

    with start(tiny_repo, **config) as handle, secure("alice") as a, secure("bob") as b:
        alice, bob = As(a), As(b)
        alice.register("cert-region", objects(64))
        assert (alice.names(), bob.names()) == (["cert-region"], [])
        bob("native", "UnregisterSharedMemory", pb.UnregisterSharedMemoryRequest())
        assert alice.names() == ["cert-region"]

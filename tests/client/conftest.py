"""Client fixtures on top of tests/conftest.py's real server: the tables, read back, a
server that asks for a token, certificates made by openssl for the TLS tests, and the
listeners a client gets no answer from (embedctl's and the Node.js CLI's diagnoses)."""

from __future__ import annotations

import socket
import subprocess
import threading
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path

import numpy as np
import pytest
import torch

from service.format.checkpoint import Checkpoint, read_checkpoint
from service.local import ServerHandle
from tests.tiny_model import start

Reference = Callable[..., np.ndarray]
TOKEN = "s3cret-token"


@pytest.fixture(scope="session")
def tiny_checkpoint(tiny_repo: Path) -> Checkpoint:
    """The checkpoint `server` serves as "tiny", read by the real reader: the oracle."""
    return read_checkpoint(tiny_repo / "tiny" / "1")


@pytest.fixture(scope="session")
def reference(tiny_checkpoint: Checkpoint) -> Reference:
    """reference(ids, start=0, compose="token+position") -> the exact float32 rows (T, C)."""
    token_table = tiny_checkpoint.token_table.float()
    assert tiny_checkpoint.position_table is not None
    position_table = tiny_checkpoint.position_table.float()

    def rows(ids: Sequence[int], start: int = 0, compose: str = "token+position") -> np.ndarray:
        tok = token_table[torch.tensor(list(ids), dtype=torch.long)]  # (T, C)
        pos = position_table[start:start + len(ids)]  # (T, C)
        out = {"token+position": tok + pos, "token": tok, "position": pos}[compose]
        return out.numpy()

    return rows


@pytest.fixture(scope="module")
def token_server(tiny_repo: Path) -> Iterator[ServerHandle]:
    """A second server over the same repository that requires ``Bearer TOKEN``."""
    with start(tiny_repo, auth_token=TOKEN) as handle:
        yield handle


def _openssl(*args: str, cwd: Path) -> None:
    subprocess.run(["openssl", *args], cwd=cwd, check=True, capture_output=True, timeout=60)


def _signed(name: str, cn: str, d: Path, ext: str) -> None:
    _openssl("req", "-newkey", "rsa:2048", "-nodes", "-keyout", f"{name}.key",
             "-out", f"{name}.csr", "-subj", f"/CN={cn}", cwd=d)
    (d / f"{name}.ext").write_text(ext)
    _openssl("x509", "-req", "-in", f"{name}.csr", "-CA", "ca.pem", "-CAkey", "ca.key",
             "-CAcreateserial", "-days", "2", "-out", f"{name}.pem", "-extfile", f"{name}.ext",
             cwd=d)


@pytest.fixture(scope="session")
def certs(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """ca.pem; server.pem/key for IP 127.0.0.1; client.pem/key; all signed by the CA."""
    d = tmp_path_factory.mktemp("tls")
    _openssl("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", "ca.key",
             "-out", "ca.pem", "-days", "2", "-subj", "/CN=test-ca", cwd=d)
    _signed("server", "localhost", d, "subjectAltName=IP:127.0.0.1,DNS:localhost\n")
    _signed("client", "embed-client", d, "extendedKeyUsage=clientAuth\n")
    return d


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


@pytest.fixture
def targets(server: ServerHandle, tls_server: ServerHandle, closed_port: int,
            hang_up_port: int, tmp_path: Path) -> dict[str, str]:
    """The target of each kind of listener, and of two places where none can be."""
    return {"closed": f"127.0.0.1:{closed_port}", "hangs up": f"127.0.0.1:{hang_up_port}",
            "REST": f"127.0.0.1:{server.http_port}",  # the service's own REST port
            "plaintext": server.target, "TLS": tls_server.target,
            "no socket file": f"unix:{tmp_path / 'embed.sock'}",
            "no such host": "no-such-host.invalid:50051"}

"""``--workers N`` share one sealed copy of each table (service/format/shared_tables.py):
the bytes are the file's as hashed at start-up, immutable, and what happens to the file on
disk afterwards reaches no worker."""

from __future__ import annotations

import fcntl
import json
import os
import shutil
import signal
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest

from genproto.embedding.v1 import embedding_pb2 as pb
from genproto.embedding.v1 import embedding_pb2_grpc as pb_grpc
from service.format import shared_tables
from service.format.tensorfile import read_private
from tests.service.test_workers import worker_pids, workers_server

TABLE = "embeddings.safetensors"


@pytest.fixture
def repo(tiny_repo: Path, tmp_path: Path) -> Path:
    copy = tmp_path / "models"
    shutil.copytree(tiny_repo, copy)
    return copy


@pytest.fixture
def published(repo: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[dict[str, int]]:
    monkeypatch.delenv(shared_tables.ENV, raising=False)
    shared = shared_tables.publish(repo)
    yield shared
    for fd in shared.values():
        os.close(fd)


def _sha(repo: Path, model: str) -> str:
    manifest = json.loads((repo / model / "1" / "manifest.json").read_text())
    sha: str = manifest["files"][TABLE]
    return sha


def test_each_models_table_is_sealed_and_served_from_the_copy(
        repo: Path, published: dict[str, int]) -> None:
    assert set(published) == {_sha(repo, "tiny"), _sha(repo, "rope")}
    fd = published[_sha(repo, "tiny")]
    seals = fcntl.fcntl(fd, fcntl.F_GET_SEALS)
    want = fcntl.F_SEAL_SHRINK | fcntl.F_SEAL_GROW | fcntl.F_SEAL_WRITE | fcntl.F_SEAL_SEAL
    assert seals & want == want
    with pytest.raises(PermissionError):
        os.pwrite(fd, b"x", 0)  # nobody can change it, its maker included
    with pytest.raises(PermissionError):
        os.ftruncate(fd, 8)
    path = repo / "tiny" / "1" / TABLE
    original = path.read_bytes()
    path.write_bytes(b"\0" * 16)  # rewritten on disk: what is served does not change
    served = read_private(path, _sha(repo, "tiny"))
    assert served.tobytes() == original
    served[:4] = 7  # a stray store copies that page into this process only
    assert read_private(path, _sha(repo, "tiny")).tobytes() == original


def test_a_file_that_does_not_hash_to_its_manifest_is_not_shared(
        repo: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(shared_tables.ENV, raising=False)
    path = repo / "rope" / "1" / TABLE
    data = bytearray(path.read_bytes())
    data[-1] ^= 1
    path.write_bytes(bytes(data))
    shared = shared_tables.publish(repo)
    try:
        assert set(shared) == {_sha(repo, "tiny")}
        assert shared_tables.lookup(_sha(repo, "rope")) is None  # read (and refused) as before
    finally:
        for fd in shared.values():
            os.close(fd)


def test_workers_map_one_copy_and_answer_exactly(repo: Path) -> None:
    request = pb.EmbedRequest(token_ids=pb.TokenIds(ids=[5, 6, 7]))
    with workers_server(repo, "--workers", "1") as (server, target):
        server.wait_until(lambda: server.count(" serving ") == 1, 90, "one worker serving")
        with grpc.insecure_channel(target) as channel:
            alone = pb_grpc.EmbeddingServiceStub(channel).Embed(request, timeout=20)
        server.proc.send_signal(signal.SIGTERM)
        server.proc.wait(30)
    with workers_server(repo, "--workers", "2") as (server, target):
        server.wait_until(lambda: server.count(" serving ") == 2, 90, "two workers serving")
        assert server.count("shared 2 table file(s) with the workers") == 1
        (repo / "tiny" / "1" / TABLE).write_bytes(b"")  # truncated on disk: no effect
        for pid in worker_pids(server.proc.pid):
            maps = Path(f"/proc/{pid}/maps").read_text()
            assert "memfd:embed-table-" in maps
        for _ in range(4):
            with grpc.insecure_channel(target) as channel:
                got = pb_grpc.EmbeddingServiceStub(channel).Embed(request, timeout=20)
            assert got.embeddings.data == alone.embeddings.data
        server.proc.send_signal(signal.SIGTERM)
        assert server.proc.wait(30) == 0

"""The repository as docs/deploy.md describes it, against a real server polling every
0.1 s: removing the served version's folder rolls back within a poll; a version copied in
file by file is "not ready yet" (INFO, not counted as a failure) until it loads, and only
one that stays broken past the grace time is refused and counted."""

from __future__ import annotations

import logging
import shutil
import time
import urllib.request
from collections.abc import Callable
from pathlib import Path

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from genproto.embedding.v1 import embedding_pb2 as pb
from genproto.embedding.v1 import embedding_pb2_grpc as pb_grpc
from service.format.manifest import EMBEDDINGS_FILE, MANIFEST_FILE
from service.local import ServerHandle
from tests.tiny_model import MakeCheckpoint, start

LOGGER = "service.engine.repository"
POLL = 0.1
GOOD = pb.EmbedRequest(text="hello world")


def wait_for(predicate: Callable[[], bool], timeout: float = 10.0) -> float:
    """Seconds until ``predicate`` held."""
    t0 = time.monotonic()
    while not predicate():
        if time.monotonic() - t0 > timeout:
            raise AssertionError("condition not met in time")
        time.sleep(0.02)
    return time.monotonic() - t0


def scrape(handle: ServerHandle) -> str:
    url = f"http://127.0.0.1:{handle.metrics_port}/metrics"
    with urllib.request.urlopen(url, timeout=5) as response:
        return str(response.read().decode())


def loads(handle: ServerHandle, result: str) -> float | None:
    prefix = f'embed_model_loads_total{{model="tiny",result="{result}"}} '
    for line in scrape(handle).splitlines():
        if line.startswith(prefix):
            return float(line.removeprefix(prefix))
    return None


def messages(caplog: pytest.LogCaptureFixture) -> list[tuple[str, str]]:
    return [(r.levelname, r.getMessage()) for r in caplog.records if r.name == LOGGER]


def test_removing_the_served_version_rolls_back(tmp_path: Path,
                                                make_checkpoint: MakeCheckpoint,
                                                caplog: pytest.LogCaptureFixture) -> None:
    repo = tmp_path / "repo"
    make_checkpoint(repo, version=1)
    make_checkpoint(repo, version=2, seed=2)
    caplog.set_level(logging.INFO, logger=LOGGER)
    with start(repo, poll_seconds=POLL) as handle, \
            grpc.insecure_channel(handle.target) as channel:
        stub = pb_grpc.EmbeddingServiceStub(channel)
        assert stub.Embed(GOOD).version == 2
        shutil.rmtree(repo / "tiny" / "2")
        took = wait_for(lambda: stub.Embed(GOOD).version == 1)
        assert took < 3 * POLL + 1.0  # one poll, plus a loaded CI machine's slack
        assert ("WARNING", "rolled back model=tiny from version 2 (removed) to version 1") \
            in messages(caplog)
        assert 'version="1"' in scrape(handle).split("embed_model_info{", 1)[1].split("\n")[0]
        # Nothing valid left: the model is no longer served, and health says so.
        shutil.rmtree(repo / "tiny" / "1")
        wait_for(lambda: not handle.server.repo.models)
        assert ("WARNING", "model=tiny version=1 is no longer served: its version 1 was "
                "removed and no valid version is left to roll back to") in messages(caplog)
        with pytest.raises(grpc.RpcError) as e:
            stub.Embed(GOOD)
        assert e.value.code() == grpc.StatusCode.UNAVAILABLE
        health = health_pb2_grpc.HealthStub(channel)
        wait_for(lambda: health.Check(health_pb2.HealthCheckRequest()).status
                 == health_pb2.HealthCheckResponse.NOT_SERVING)  # set right after the scan
        assert "embed_model_info{" not in scrape(handle)
        # And a version copied back in is served again.
        make_checkpoint(repo, version=3, seed=3)
        wait_for(lambda: bool(handle.server.repo.models))
        assert stub.Embed(GOOD).version == 3


@pytest.fixture
def staged(tmp_path: Path, make_checkpoint: MakeCheckpoint) -> tuple[Path, Path]:
    """A repository holding version 1 of tiny, and a version 2 written outside it, to be
    brought in while the server runs."""
    repo = tmp_path / "repo"
    make_checkpoint(repo, version=1)
    return repo, make_checkpoint(tmp_path / "staging", version=2, seed=2)


def test_version_copied_in_file_by_file_is_not_a_failure(
        staged: tuple[Path, Path], caplog: pytest.LogCaptureFixture) -> None:
    repo, source = staged
    caplog.set_level(logging.INFO, logger=LOGGER)
    with start(repo, poll_seconds=POLL, load_grace_seconds=30) as handle, \
            grpc.insecure_channel(handle.target) as channel:
        stub = pb_grpc.EmbeddingServiceStub(channel)
        target = repo / "tiny" / "2"
        target.mkdir()
        names = sorted(p.name for p in source.iterdir())
        assert names[0] == EMBEDDINGS_FILE
        assert MANIFEST_FILE in names
        # The manifest first (the wrong order), then the rest one poll apart each.
        for name in [MANIFEST_FILE, *(n for n in names if n != MANIFEST_FILE)][:-1]:
            shutil.copy(source / name, target / name)
            time.sleep(3 * POLL)
            assert stub.Embed(GOOD).version == 1  # still being copied: 1 keeps serving
        pending = [m for level, m in messages(caplog) if "not ready yet" in m]
        assert len(pending) == 1, messages(caplog)  # one line for the whole copy
        assert pending[0].startswith("model=tiny version=2 not ready yet (still being copied "
                                     "in?): ")
        assert pending[0].endswith("; retried every poll, refused if it stays so for 30s "
                                   "(write manifest.json last, or copy to a temporary name "
                                   "and rename)")
        assert [lv for lv, m in messages(caplog) if "not ready yet" in m] == ["INFO"]
        assert not [m for level, m in messages(caplog) if level == "ERROR"]
        assert loads(handle, "error") is None  # not counted: the alert stays quiet
        row = [r for r in handle.server.repo.index() if r[1] == 2]
        assert row[0][2] == "UNAVAILABLE"
        assert row[0][3].startswith("not ready yet (still being copied in?): ")
        last = [n for n in names if n != MANIFEST_FILE][-1]
        shutil.copy(source / last, target / last)
        wait_for(lambda: stub.Embed(GOOD).version == 2)
        assert loads(handle, "error") is None
        assert loads(handle, "ok") == 2.0


def test_version_that_stays_broken_is_refused_after_the_grace(
        staged: tuple[Path, Path], caplog: pytest.LogCaptureFixture) -> None:
    repo, bad = staged
    data = bytearray((bad / EMBEDDINGS_FILE).read_bytes())
    data[len(data) // 2] ^= 0xFF  # one changed byte: the sha256 check fails
    (bad / EMBEDDINGS_FILE).write_bytes(bytes(data))
    caplog.set_level(logging.INFO, logger=LOGGER)
    grace = 1.0
    with start(repo, poll_seconds=POLL, load_grace_seconds=grace) as handle, \
            grpc.insecure_channel(handle.target) as channel:
        stub = pb_grpc.EmbeddingServiceStub(channel)
        t0 = time.monotonic()
        shutil.move(str(bad), repo / "tiny" / "2")
        wait_for(lambda: any("not ready yet" in m for _, m in messages(caplog)))
        assert loads(handle, "error") is None
        wait_for(lambda: any(lv == "ERROR" for lv, _ in messages(caplog)))
        assert time.monotonic() - t0 >= grace  # not before the grace time
        errors = [m for lv, m in messages(caplog) if lv == "ERROR"]
        assert len(errors) == 1
        assert errors[0].startswith("refused model=tiny version=2: ")
        assert "does not match" in errors[0]
        time.sleep(5 * POLL)  # refused once: not retried, not counted again
        assert loads(handle, "error") == 1.0
        assert len([m for lv, m in messages(caplog) if lv == "ERROR"]) == 1
        assert stub.Embed(GOOD).version == 1  # the previous version keeps serving


def test_old_broken_version_at_start_is_refused_at_once(
        tmp_path: Path, make_checkpoint: MakeCheckpoint,
        caplog: pytest.LogCaptureFixture) -> None:
    """A version that was broken before the server started (unchanged for longer than the
    grace) is refused at the first scan, as before."""
    repo = tmp_path / "repo"
    make_checkpoint(repo, version=1)
    make_checkpoint(repo, version=2, seed=2)
    (repo / "tiny" / "2" / EMBEDDINGS_FILE).unlink()
    time.sleep(1.1)
    caplog.set_level(logging.INFO, logger=LOGGER)
    with start(repo, poll_seconds=POLL, load_grace_seconds=1.0) as handle:
        assert handle.server.repo.models["tiny"].version == 1
        assert next(m for lv, m in messages(caplog) if lv == "ERROR").startswith(
            "refused model=tiny version=2: ")
        assert loads(handle, "error") == 1.0


def test_pin_to_a_version_not_there_is_logged(tmp_path: Path, make_checkpoint: MakeCheckpoint,
                                              caplog: pytest.LogCaptureFixture) -> None:
    """Pins into an empty repository are accepted at start; when the model arrives without
    the pinned version, one line says it is not served and why."""
    caplog.set_level(logging.WARNING, logger=LOGGER)
    with start(tmp_path, pin_versions="tiny=9") as handle:
        make_checkpoint(tmp_path, version=1)
        handle.refresh()
        handle.refresh()
        assert not handle.server.repo.models
        lines = [m for _, m in messages(caplog) if "pinned" in m]
        assert len(lines) == 1
        assert lines[0].endswith("model 'tiny' is pinned to version 9 (--pin-versions), which "
                                 "is not in the repository (versions: 1); not serving it")

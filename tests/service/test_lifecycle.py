"""Start-up, health, hot reload, refused versions, metrics and SIGTERM draining."""

from __future__ import annotations

import contextlib
import logging
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from genproto.embedding.v1 import embedding_pb2 as pb
from genproto.embedding.v1 import embedding_pb2_grpc as pb_grpc
from service.format.manifest import EMBEDDINGS_FILE
from service.local import ServerHandle
from tests.tiny_model import MakeCheckpoint, start

ROOT = Path(__file__).resolve().parents[2]
GOOD = pb.EmbedRequest(text="hello world")


def wait_for(predicate, timeout: float = 10.0) -> None:  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError("condition not met in time")
        time.sleep(0.05)


def health(target: str, service: str = "") -> int:
    with grpc.insecure_channel(target) as channel:
        stub = health_pb2_grpc.HealthStub(channel)
        return stub.Check(health_pb2.HealthCheckRequest(service=service)).status


def test_health_not_serving_until_a_model_loads(tmp_path: Path,
                                                make_checkpoint: MakeCheckpoint) -> None:
    handle = start(tmp_path)
    try:
        NOT_SERVING, SERVING = (health_pb2.HealthCheckResponse.NOT_SERVING,
                                health_pb2.HealthCheckResponse.SERVING)
        assert health(handle.target) == NOT_SERVING
        assert health(handle.target, "embedding.v1.EmbeddingService") == NOT_SERVING
        make_checkpoint(tmp_path)
        handle.refresh()
        assert health(handle.target) == SERVING
        assert health(handle.target, "embedding.v1.EmbeddingService") == SERVING
    finally:
        handle.stop()


def test_bad_version_refused_previous_keeps_serving(tmp_path: Path,
                                                   make_checkpoint: MakeCheckpoint,
                                                   caplog: pytest.LogCaptureFixture) -> None:
    repo, staging = tmp_path / "repo", tmp_path / "staging"
    make_checkpoint(repo, version=1)
    handle = start(repo, poll_seconds=0.1)
    try:
        with grpc.insecure_channel(handle.target) as channel:
            stub = pb_grpc.EmbeddingServiceStub(channel)
            assert stub.Embed(GOOD).version == 1
            bad = make_checkpoint(staging, version=2, seed=5)
            data = bytearray((bad / EMBEDDINGS_FILE).read_bytes())
            data[len(data) // 2] ^= 0xFF  # one changed byte
            (bad / EMBEDDINGS_FILE).write_bytes(bytes(data))
            with caplog.at_level(logging.ERROR, logger="service.engine.repository"):
                shutil.move(str(bad), repo / "tiny" / "2")
                wait_for(lambda: any("refused model=tiny version=2" in r.getMessage()
                                     for r in caplog.records))
            line = next(r.getMessage() for r in caplog.records if "version=2" in r.getMessage())
            assert "embeddings.safetensors: sha256" in line
            assert "does not match" in line
            assert stub.Embed(GOOD).version == 1  # the previous version keeps serving
            shutil.move(str(make_checkpoint(staging, version=3, seed=6)), repo / "tiny" / "3")
            wait_for(lambda: stub.Embed(GOOD).version == 3)
        # The gauges are published on the loop just after the swap, which requests can
        # already see: wait for them rather than race them under load.
        wait_for(lambda: 'version="3"' in scrape(handle))
        metrics = scrape(handle)
        assert 'embed_model_loads_total{model="tiny",result="error"} 1.0' in metrics
        assert 'embed_model_loads_total{model="tiny",result="ok"} 2.0' in metrics
        assert 'embed_model_info{' in metrics
        assert 'version="3"' in metrics
        assert 'version="1"' not in metrics.split("embed_model_info{", 1)[1]
    finally:
        handle.stop()


def scrape(handle: ServerHandle) -> str:
    url = f"http://127.0.0.1:{handle.metrics_port}/metrics"
    with urllib.request.urlopen(url, timeout=5) as response:
        return response.read().decode()


def sample(text: str, prefix: str) -> float:
    for line in text.splitlines():
        if line.startswith(prefix):
            return float(line.rsplit(" ", 1)[1])
    return 0.0


def test_metrics_move_with_requests(tiny_repo: Path) -> None:
    server = start(tiny_repo)  # its own server: no other test's traffic in the counters
    try:
        check_metrics_move(server)
    finally:
        server.stop()


def check_metrics_move(server: ServerHandle) -> None:
    ok = 'embed_requests_total{code="OK",model="tiny",rpc="Embed"}'
    bad = 'embed_requests_total{code="INVALID_ARGUMENT",model="tiny",rpc="Embed"}'
    tokens = 'embed_tokens_total{model="tiny"}'
    before = scrape(server)
    with grpc.insecure_channel(server.target) as channel:
        stub = pb_grpc.EmbeddingServiceStub(channel)
        for _ in range(3):
            stub.Embed(GOOD)
        with pytest.raises(grpc.RpcError):
            stub.Embed(pb.EmbedRequest(token_ids=pb.TokenIds(ids=[-1])))
        for name in ("nope", "x" * 200):  # unknown names must not mint new series
            with pytest.raises(grpc.RpcError):
                stub.Embed(pb.EmbedRequest(model=name, text="hi"))
    after = scrape(server)
    assert 'embed_requests_total{code="NOT_FOUND",model="_unknown",rpc="Embed"} 2.0' in after
    assert 'model="nope"' not in after
    assert sample(after, ok) - sample(before, ok) == 3
    assert sample(after, bad) - sample(before, bad) == 1
    assert sample(after, tokens) - sample(before, tokens) == 6
    for name in ("embed_request_duration_seconds_bucket", "embed_queue_duration_seconds_count",
                 "embed_compute_duration_seconds_count", "embed_batch_tokens_bucket",
                 "embed_output_bytes_total", "embed_inflight_requests", "embed_queue_tokens",
                 "embed_untrained_token_lookups_total", "embed_model_info",
                 "embed_tokenize_duration_seconds_count", "embed_batch_requests_bucket"):
        assert name in after, name


def test_promtool_accepts_metrics(server: ServerHandle, tmp_path: Path) -> None:
    promtool = shutil.which("promtool")
    if promtool is None:
        pytest.fail("promtool not found: run scripts/install_promtool.sh (make test does)")
    with grpc.insecure_channel(server.target) as channel:
        pb_grpc.EmbeddingServiceStub(channel).Embed(GOOD)
    result = subprocess.run([promtool, "check", "metrics"], input=scrape(server),
                            capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stdout + result.stderr


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@contextlib.contextmanager
def server_process(repo: Path, *flags: str, serving_lines: int = 1
                   ) -> Iterator[tuple[subprocess.Popen[str], pb_grpc.EmbeddingServiceStub]]:
    """``python -m service`` on a free port, once it has logged ``serving_lines`` times."""
    port = free_port()
    proc = subprocess.Popen(
        [sys.executable, "-m", "service", "--model-repository", str(repo), "--grpc-port",
         str(port), "--http-port", "0", "--metrics-port", "-1", "--default-model", "tiny",
         *flags],
        cwd=ROOT, stderr=subprocess.PIPE, text=True, env={**os.environ, "PYTHONPATH": str(ROOT)})
    try:
        assert proc.stderr is not None
        serving = 0
        for line in proc.stderr:
            serving += " serving " in line
            if serving == serving_lines:
                break
        assert serving == serving_lines, "server exited before serving"
        with grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
            yield proc, pb_grpc.EmbeddingServiceStub(channel)
    finally:
        if proc.poll() is None:
            proc.kill()


def test_sigterm_drains_in_flight_request_and_exits_zero(tiny_repo: Path) -> None:
    # A 1.5 s batch delay holds the request in flight while SIGTERM arrives.
    with server_process(tiny_repo, "--max-batch-delay-us", "1500000",
                        "--shutdown-grace-seconds", "10") as (proc, stub):
        in_flight = stub.Embed.future(GOOD, timeout=30)
        time.sleep(0.3)
        proc.send_signal(signal.SIGTERM)
        assert list(in_flight.result().token_ids) == [31373, 995]
        assert proc.wait(timeout=20) == 0
        assert proc.stderr is not None
        rest = proc.stderr.read()
        assert "draining" in rest
        assert "stopped" in rest


def test_workers_share_one_port_and_stop_on_sigterm(tiny_repo: Path) -> None:
    # Both fronts share their ports across workers (SO_REUSEPORT): each needs a fixed one.
    with server_process(tiny_repo, "--workers", "2", "--shutdown-grace-seconds", "2",
                        "--http-port", str(free_port()), serving_lines=2) as (proc, stub):
        assert list(stub.Embed(GOOD, timeout=10).token_ids) == [31373, 995]
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=30) == 0

"""``--workers``: a worker killed by SIGKILL is replaced and serves; crash loops are bounded."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import grpc
import pytest

from genproto.embedding.v1 import embedding_pb2 as pb
from genproto.embedding.v1 import embedding_pb2_grpc as pb_grpc
from service.workers import RestartBudget, RestartPolicy, describe_exit

ROOT = Path(__file__).resolve().parents[2]
GOOD = pb.EmbedRequest(text="hello world")


class _Server:
    """``python -m service`` with its stderr collected line by line on a thread."""

    def __init__(self, argv: list[str]) -> None:
        self.proc = subprocess.Popen(argv, cwd=ROOT, stderr=subprocess.PIPE, text=True,
                                     env={**os.environ, "PYTHONPATH": str(ROOT)})
        self.lines: list[str] = []
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        assert self.proc.stderr is not None
        for line in self.proc.stderr:
            self.lines.append(line)

    def count(self, text: str) -> int:
        return sum(text in line for line in list(self.lines))

    def wait_until(self, predicate: Callable[[], bool], timeout: float, what: str) -> None:
        deadline = time.monotonic() + timeout
        while not predicate():
            if time.monotonic() > deadline or (self.proc.poll() is not None
                                               and not predicate()):
                raise AssertionError(f"{what}: not seen in {timeout}s; log:\n"
                                     + "".join(self.lines[-40:]))
            time.sleep(0.05)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def worker_pids(parent: int) -> set[int]:
    """The parent's spawned server processes (not multiprocessing's resource tracker)."""
    children = Path(f"/proc/{parent}/task/{parent}/children").read_text().split()
    pids = set()
    for pid in map(int, children):
        try:
            cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
        except OSError:
            continue  # exited in between
        if b"spawn_main" in cmdline:
            pids.add(pid)
    return pids


@contextmanager
def workers_server(repo: Path, *flags: str) -> Iterator[tuple[_Server, str]]:
    port = _free_port()
    server = _Server([sys.executable, "-m", "service", "--model-repository", str(repo),
                      "--grpc-port", str(port), "--http-port", "-1", "--metrics-port", "-1",
                      "--default-model", "tiny", "--poll-seconds", "0", *flags])
    try:
        yield server, f"127.0.0.1:{port}"
    finally:
        if server.proc.poll() is None:
            server.proc.kill()
            server.proc.wait(10)


def _embed_on_new_connections(target: str, n: int) -> None:
    """n requests, each on its own channel (so the kernel may pick any worker's socket)."""
    for _ in range(n):
        with grpc.insecure_channel(target) as channel:
            stub = pb_grpc.EmbeddingServiceStub(channel)
            assert list(stub.Embed(GOOD, timeout=20).token_ids) == [31373, 995]


def test_sigkilled_worker_is_replaced_and_serves(tiny_repo: Path) -> None:
    with workers_server(tiny_repo, "--workers", "2", "--shutdown-grace-seconds", "2") as (
            server, target):
        server.wait_until(lambda: server.count(" serving ") == 2, 90, "two workers serving")
        first = worker_pids(server.proc.pid)
        assert len(first) == 2
        victim, survivor = sorted(first)
        os.kill(victim, signal.SIGKILL)
        server.wait_until(lambda: server.count(" serving ") == 3, 90, "replacement serving")
        assert server.count(f"(pid {victim}) killed by SIGKILL; restarting it in 0.0s "
                            "(restart 1 of this server)") == 1
        second = worker_pids(server.proc.pid)
        assert survivor in second
        assert victim not in second
        assert len(second) == 2
        (replacement,) = second - {survivor}
        # Now the other original goes too: from here only replacements can answer.
        os.kill(survivor, signal.SIGKILL)
        server.wait_until(lambda: server.count("restart 2 of this server") == 1, 30,
                          "second restart")
        _embed_on_new_connections(target, 4)
        assert replacement in worker_pids(server.proc.pid)
        server.wait_until(lambda: server.count(" serving ") == 4, 90, "second replacement")
        assert survivor not in worker_pids(server.proc.pid)
        _embed_on_new_connections(target, 4)
        server.proc.send_signal(signal.SIGTERM)  # still drains and exits cleanly
        assert server.proc.wait(timeout=30) == 0
        assert server.count("restarting it in") == 2  # none during shutdown


def test_crash_loop_stops_the_server(tiny_repo: Path, tmp_path: Path) -> None:
    # A TLS key that does not exist: every worker start fails (exit 1) after importing.
    policy = "RestartPolicy(max_restarts=1, window_s=60)"
    code = ("import sys; from service.logs import setup_logging; "
            "from service.config import parse_config; "
            "from service.workers import RestartPolicy, run_workers; "
            "c = parse_config(sys.argv[1:]); setup_logging(c); "
            f"run_workers(c, {policy})")
    port = _free_port()
    missing = str(tmp_path / "missing.pem")
    t0 = time.monotonic()
    result = subprocess.run(
        [sys.executable, "-c", code, "--model-repository", str(tiny_repo), "--grpc-port",
         str(port), "--http-port", "-1", "--metrics-port", "-1", "--workers", "1",
         "--tls-cert", missing,
         "--tls-key", missing], cwd=ROOT, capture_output=True, text=True, timeout=120,
        env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert result.returncode == 1, result.stderr[-3000:]
    log = result.stderr
    assert "worker 0 (pid" in log
    assert "exit status 1; restarting it in 0.0s (restart 1 of this server)" in log
    assert "exit status 1: more than 1 restarts in 60s; stopping the server" in log
    assert log.count("restarting it in") == 1
    assert time.monotonic() - t0 < 110


def test_restart_budget_backs_off_then_gives_up() -> None:
    budget = RestartBudget(RestartPolicy(max_restarts=4, window_s=10, backoff_s=0.5,
                                         max_backoff_s=1.5))
    assert [budget.next_delay(t) for t in (0.0, 1.0, 2.0, 3.0)] == [0.0, 0.5, 1.0, 1.5]
    assert budget.next_delay(4.0) is None  # a fifth restart within 10 s: give up
    assert budget.next_delay(10.5) == 1.5  # the restart at t=0 left the window
    assert budget.next_delay(25.0) == 0.0  # all of them did: a fresh crash restarts at once


@pytest.mark.parametrize(("code", "text"), [(-9, "killed by SIGKILL"),
                                           (-15, "killed by SIGTERM"),
                                           (3, "exit status 3"), (None, "running")])
def test_describe_exit(code: int | None, text: str) -> None:
    assert describe_exit(code) == text

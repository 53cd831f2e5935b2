"""The one launcher: every server a benchmark runs starts, waits and stops here.

Each server is its own process (so no two share a GIL), started with this checkout first
on PYTHONPATH and scripts/serve.sh's glibc malloc tunables, its output in a log file; it is
ready once its gRPC health says SERVING. Also what the suites read of a running server
from /proc: its CPU time, its memory and its worker processes.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

__all__ = ["GLIBC_TUNABLES", "MAX_MESSAGE_BYTES", "ROOT", "ServerProcess", "child_env",
           "cpu_seconds", "free_port", "launch", "memory_mb", "process_tree", "service_argv",
           "start", "stop", "wait_listening", "wait_serving", "worker_pids"]

ROOT = Path(__file__).resolve().parents[2]
# The service's default --max-message-bytes: every reference server and client here uses it.
MAX_MESSAGE_BYTES = 64 << 20
# Kept equal to scripts/serve.sh's default.
GLIBC_TUNABLES = "glibc.malloc.mmap_threshold=268435456:glibc.malloc.trim_threshold=536870912"


@dataclass
class ServerProcess:
    """A server subprocess: its name, gRPC target (and REST port), process and log."""

    name: str
    target: str
    proc: subprocess.Popen[bytes]
    log: Path
    http_port: int = -1
    started: float = field(default_factory=time.monotonic)

    @property
    def port(self) -> int:
        """The gRPC port."""
        return int(self.target.rsplit(":", 1)[1])

    def tail(self) -> str:
        """The end of the log, for an error message."""
        return self.log.read_text(errors="replace")[-3000:]


def free_port() -> int:
    """A port nothing listens on right now (bound to 0, read, released)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def child_env() -> dict[str, str]:
    """A bench child's environment: this checkout first on PYTHONPATH, the caller's after
    (that keeps the wheels scripts/gpu.sh installs beside a GPU image's own packages)."""
    env = dict(os.environ)
    env.setdefault("GLIBC_TUNABLES", GLIBC_TUNABLES)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(ROOT), env.get("PYTHONPATH")) if p)
    env["PYTHON"] = sys.executable  # scripts/serve.sh runs the service with this interpreter
    return env


def service_argv(repo: Path, port: int, *extra: str, http_port: int = -1,
                 device: str = "cpu") -> list[str]:
    """``scripts/serve.sh`` serving ``repo/models`` on 127.0.0.1:``port`` (REST on
    ``http_port``, -1: off), no metrics port, no repository polling, then ``extra``."""
    return [str(ROOT / "scripts" / "serve.sh"), "--model-repository", str(repo / "models"),
            "--host", "127.0.0.1", "--grpc-port", str(port), "--http-port", str(http_port),
            "--metrics-port", "-1", "--device", device, "--poll-seconds", "0", *extra]


def launch(name: str, argv: Sequence[str], port: int, log_dir: Path,
           http_port: int = -1) -> ServerProcess:
    """Start one server process, its output into ``log_dir/<name>.log``."""
    log_dir.mkdir(parents=True, exist_ok=True)
    log = log_dir / f"{name}.log"
    with log.open("wb") as fh:
        proc = subprocess.Popen(list(argv), cwd=ROOT, env=child_env(), stdout=fh,
                                stderr=subprocess.STDOUT)
    return ServerProcess(name, f"127.0.0.1:{port}", proc, log, http_port)


def _check_alive(server: ServerProcess, deadline: float, what: str) -> None:
    if server.proc.poll() is not None:
        raise RuntimeError(f"{server.name} exited with {server.proc.returncode}; "
                           f"log:\n{server.tail()}")
    if time.monotonic() > deadline:
        raise TimeoutError(f"{server.name} not {what} in time; log:\n{server.tail()}")


def wait_listening(server: ServerProcess, timeout_s: float = 120.0) -> float:
    """Seconds from launch until the gRPC port accepts connections (polled every 5 ms)."""
    deadline = time.monotonic() + timeout_s
    while True:
        with socket.socket() as s:
            if s.connect_ex(("127.0.0.1", server.port)) == 0:
                return time.monotonic() - server.started
        _check_alive(server, deadline, "listening")
        time.sleep(0.005)


def wait_serving(server: ServerProcess, timeout_s: float = 120.0) -> float:
    """Seconds from launch until grpc.health says SERVING (polled every 10 ms); raises with
    the log's tail if the server exits or the time runs out."""
    deadline = time.monotonic() + timeout_s
    with grpc.insecure_channel(server.target) as channel:
        stub = health_pb2_grpc.HealthStub(channel)
        while True:
            try:
                status = stub.Check(health_pb2.HealthCheckRequest(), timeout=1.0).status
                if status == health_pb2.HealthCheckResponse.SERVING:
                    return time.monotonic() - server.started
            except grpc.RpcError:
                pass  # not listening yet
            _check_alive(server, deadline, "SERVING")
            time.sleep(0.01)


def start(argvs: dict[str, tuple[list[str], int, int]], log_dir: Path,
          timeout_s: float = 120.0) -> dict[str, ServerProcess]:
    """Launch every ``name: (argv, port, http_port)`` at once; return when all are SERVING."""
    servers = {name: launch(name, argv, port, log_dir, http_port)
               for name, (argv, port, http_port) in argvs.items()}
    try:
        for server in servers.values():
            wait_serving(server, timeout_s)
    except BaseException:
        stop(servers.values())
        raise
    return servers


def stop(servers: Iterable[ServerProcess]) -> list[int | None]:
    """SIGTERM each server, SIGKILL what has not exited in 30 s; their exit statuses."""
    servers = list(servers)
    for server in servers:
        if server.proc.poll() is None:
            server.proc.terminate()
    codes: list[int | None] = []
    for server in servers:
        try:
            codes.append(server.proc.wait(timeout=30))
        except subprocess.TimeoutExpired:
            server.proc.kill()
            server.proc.wait()
            codes.append(None)
    return codes


# -- what /proc says about a running server ----------------------------------------------

def process_tree(pid: int) -> list[int]:
    """``pid`` and its children (a ``--workers`` server's workers, its resource tracker)."""
    try:
        children = Path(f"/proc/{pid}/task/{pid}/children").read_text().split()
    except OSError:
        children = []
    return [pid, *(int(p) for p in children)]


def worker_pids(parent: int) -> list[int]:
    """A ``--workers N`` server's spawned workers (not multiprocessing's resource tracker)."""
    pids = []
    for pid in process_tree(parent)[1:]:
        try:
            if b"spawn_main" in Path(f"/proc/{pid}/cmdline").read_bytes():
                pids.append(pid)
        except OSError:
            continue  # exited in between
    return sorted(pids)


def cpu_seconds(pid: int) -> float:
    """User + system CPU seconds of ``pid`` and its children so far (every thread)."""
    total = 0
    for p in process_tree(pid):
        try:
            fields = Path(f"/proc/{p}/stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        total += int(fields[11]) + int(fields[12])  # utime, stime
    return total / os.sysconf("SC_CLK_TCK")


def memory_mb(pid: int, key: str = "VmRSS") -> float:
    """``VmRSS`` (from /proc/PID/status) or ``Pss`` (smaps_rollup) of one process, in MiB;
    0 once it is gone."""
    file = "smaps_rollup" if key == "Pss" else "status"
    try:
        for line in Path(f"/proc/{pid}/{file}").read_text().splitlines():
            if line.startswith(key + ":"):
                return int(line.split()[1]) / 1024
    except OSError:
        pass
    return 0.0

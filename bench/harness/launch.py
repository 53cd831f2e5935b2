"""The one launcher: every server a benchmark runs starts (its own process, this checkout
first on PYTHONPATH, scripts/serve.sh's malloc tunables, a log file), waits for gRPC health
SERVING and stops here; and what /proc says of it (CPU time, memory, workers).
"""

from __future__ import annotations

import os
import re
import socket
import subprocess
import sys
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

__all__ = ["GLIBC_TUNABLES", "MAX_MESSAGE_BYTES", "ROOT", "ServerProcess", "cpu_seconds",
           "free_port", "launch", "launch_service", "memory_mb", "process_tree", "service_argv",
           "start", "stop", "tree_rss_mb", "wait_listening", "wait_serving", "worker_pids"]

ROOT = Path(__file__).resolve().parents[2]
# The service's default --max-message-bytes: every reference server and client here uses it.
MAX_MESSAGE_BYTES = 64 << 20
# scripts/serve.sh's default, read from it: the service runs as it is deployed.
_SERVE_SH = re.search(r'GLIBC_TUNABLES:-([^}"]+)', (ROOT / "scripts" / "serve.sh").read_text())
assert _SERVE_SH is not None, "scripts/serve.sh sets no default GLIBC_TUNABLES"
GLIBC_TUNABLES = _SERVE_SH.group(1)


@dataclass
class ServerProcess:
    """A server subprocess: its name, gRPC target (and REST port), process and log."""

    name: str
    target: str
    proc: subprocess.Popen[bytes]
    log: Path
    http_port: int = -1
    started: float = field(default_factory=time.monotonic)

    def tail(self) -> str:
        return self.log.read_text(errors="replace")[-3000:]


_HANDED_OUT: set[int] = set()  # ports free_port gave this process: never given twice


def free_port() -> int:
    """A port nothing listens on right now (bound to 0, read, released), and not one this
    process handed out before: the kernel may give a released port again at once, and two
    servers launched on the same port before either binds it would collide."""
    while True:
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
            s.bind(("127.0.0.1", 0))
            port = int(s.getsockname()[1])
        if port not in _HANDED_OUT:
            _HANDED_OUT.add(port)
            return port


def service_argv(repo: Path, port: int, *extra: str, http_port: int = -1,
                 device: str = "cpu") -> list[str]:
    """``scripts/serve.sh`` serving ``repo/models`` on 127.0.0.1:``port`` (REST on
    ``http_port``, -1: off), no metrics port, no repository polling, then ``extra``."""
    return [str(ROOT / "scripts" / "serve.sh"), "--model-repository", str(repo / "models"),
            "--host", "127.0.0.1", "--grpc-port", str(port), "--http-port", str(http_port),
            "--metrics-port", "-1", "--device", device, "--poll-seconds", "0", *extra]


def launch(name: str, argv: Sequence[str], port: int, log_dir: Path,
           http_port: int = -1) -> ServerProcess:
    """Start one server process, its output into ``log_dir/<name>.log``. Its environment:
    this checkout first on PYTHONPATH, the caller's after (that keeps the wheels
    scripts/gpu.sh installs beside a GPU image's own packages)."""
    log_dir.mkdir(parents=True, exist_ok=True)
    log = log_dir / f"{name}.log"
    env = dict(os.environ)
    env.setdefault("GLIBC_TUNABLES", GLIBC_TUNABLES)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(ROOT), env.get("PYTHONPATH")) if p)
    env["PYTHON"] = sys.executable  # scripts/serve.sh runs the service with this interpreter
    with log.open("wb") as fh:
        proc = subprocess.Popen(list(argv), cwd=ROOT, env=env, stdout=fh,
                                stderr=subprocess.STDOUT)
    return ServerProcess(name, f"127.0.0.1:{port}", proc, log, http_port)


def launch_service(name: str, repo: Path, log_dir: Path, *extra: str, http_port: int = -1,
                   device: str = "cpu") -> ServerProcess:
    """The service (``service_argv``) on a free port."""
    port = free_port()
    argv = service_argv(repo, port, *extra, http_port=http_port, device=device)
    return launch(name, argv, port, log_dir, http_port)


def _check_alive(server: ServerProcess, deadline: float, what: str) -> None:
    if server.proc.poll() is not None:
        raise RuntimeError(f"{server.name} exited with {server.proc.returncode}; "
                           f"log:\n{server.tail()}")
    if time.monotonic() > deadline:
        raise TimeoutError(f"{server.name} not {what} in time; log:\n{server.tail()}")


def wait_listening(server: ServerProcess, timeout_s: float = 120.0) -> float:
    """Seconds from launch until the gRPC port accepts connections (polled every 5 ms)."""
    deadline, port = time.monotonic() + timeout_s, int(server.target.rsplit(":", 1)[1])
    while True:
        with socket.socket() as s:
            if s.connect_ex(("127.0.0.1", port)) == 0:
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


def start(servers: Iterable[ServerProcess], timeout_s: float = 120.0
          ) -> dict[str, ServerProcess]:
    """``servers``, launched, by name once all are SERVING (all stopped if one fails)."""
    by_name = {s.name: s for s in servers}
    try:
        for server in by_name.values():
            wait_serving(server, timeout_s)
    except BaseException:
        stop(by_name.values())
        raise
    return by_name


def stop(servers: Iterable[ServerProcess], timeout_s: float = 30.0) -> list[int | None]:
    """SIGTERM each server, SIGKILL what has not exited in ``timeout_s``; their exit
    statuses (None: killed)."""
    servers = list(servers)
    for server in servers:
        if server.proc.poll() is None:
            server.proc.terminate()
    codes: list[int | None] = []
    for server in servers:
        try:
            codes.append(server.proc.wait(timeout=timeout_s))
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


def tree_rss_mb(parent: int) -> tuple[float, dict[int, float]]:
    """RSS of a server: parent + every child (workers, resource tracker), in MiB."""
    each = {pid: memory_mb(pid) for pid in process_tree(parent)}
    return sum(each.values()), each

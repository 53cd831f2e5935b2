"""Start the three benchmark servers, each in its own process, and wait until SERVING.

Separate processes keep the load generator and each server off one another's GIL. All
three get the same glibc malloc tunables as scripts/serve.sh, so none of them pays the
page-fault cost of multi-MB buffers that the others are spared.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

from bench.config import BenchConfig
from bench.model import MODEL_NAME

__all__ = ["GLIBC_TUNABLES", "ROOT", "ServerProcess", "child_env", "free_port", "launch",
           "service_argv", "start_servers", "stop_servers", "wait_serving"]

ROOT = Path(__file__).resolve().parent.parent
# Kept equal to scripts/serve.sh's default.
GLIBC_TUNABLES = "glibc.malloc.mmap_threshold=268435456:glibc.malloc.trim_threshold=536870912"


@dataclass
class ServerProcess:
    """A server subprocess: its name, gRPC target, process and log file."""

    name: str
    target: str
    proc: subprocess.Popen[bytes]
    log: Path


def free_port() -> int:
    """A port nothing listens on right now (bound to 0, read, released)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def child_env(tunables: str | None = GLIBC_TUNABLES) -> dict[str, str]:
    """The environment for a bench child: this checkout first on PYTHONPATH, the caller's after.

    Keeping the caller's PYTHONPATH is what lets a child import the wheels that scripts/gpu.sh
    installs beside the GPU image's own packages. ``tunables=None`` runs the child with
    glibc's default malloc (bench.footprint's comparison).
    """
    env = dict(os.environ)
    if tunables is None:
        env.pop("GLIBC_TUNABLES", None)
    else:
        env.setdefault("GLIBC_TUNABLES", tunables)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(ROOT), env.get("PYTHONPATH")) if p)
    env["PYTHON"] = sys.executable  # scripts/serve.sh runs the service with this interpreter
    return env


def launch(name: str, argv: list[str], port: int, log_dir: Path) -> ServerProcess:
    """Start one server process, its output into ``log_dir/<name>.log``."""
    log_dir.mkdir(parents=True, exist_ok=True)
    log = log_dir / f"{name}.log"
    with log.open("wb") as fh:
        proc = subprocess.Popen(argv, cwd=ROOT, env=child_env(), stdout=fh,
                                stderr=subprocess.STDOUT)
    return ServerProcess(name, f"127.0.0.1:{port}", proc, log)


def wait_serving(server: ServerProcess, timeout_s: float) -> None:
    """Poll grpc.health until SERVING; raise with the log's tail if it exits or times out."""
    deadline = time.monotonic() + timeout_s
    with grpc.insecure_channel(server.target) as channel:
        stub = health_pb2_grpc.HealthStub(channel)
        while True:
            if server.proc.poll() is not None:
                raise RuntimeError(f"{server.name} exited with {server.proc.returncode}; "
                                   f"log:\n{server.log.read_text()[-3000:]}")
            try:
                status = stub.Check(health_pb2.HealthCheckRequest(service=""), timeout=1.0).status
                if status == health_pb2.HealthCheckResponse.SERVING:
                    return
            except grpc.RpcError:
                pass
            if time.monotonic() > deadline:
                raise TimeoutError(f"{server.name} not SERVING after {timeout_s:.0f}s; "
                                   f"log:\n{server.log.read_text()[-3000:]}")
            time.sleep(0.1)


def service_argv(repo: Path, port: int, *extra: str, http_port: int = -1,
                 device: str = "cpu") -> list[str]:
    """``scripts/serve.sh`` and the flags every bench gives the service: ``repo``'s models
    on 127.0.0.1:``port``, no metrics port, no repository polling, then ``extra``."""
    return [str(ROOT / "scripts" / "serve.sh"), "--model-repository", str(repo / "models"),
            "--host", "127.0.0.1", "--grpc-port", str(port), "--http-port", str(http_port),
            "--metrics-port", "-1", "--device", device, "--poll-seconds", "0", *extra]


def _argv(name: str, port: int, cfg: BenchConfig, repo: Path) -> list[str]:
    py = sys.executable
    if name == "ceiling":
        return [py, "-m", "bench.ceiling_server", "--port", str(port), "--dim", str(cfg.dim),
                "--ts", ",".join(map(str, cfg.ts)), "--dtypes", ",".join(cfg.dtypes)]
    if name == "naive":
        return [py, "-m", "bench.naive_server", "--port", str(port),
                "--checkpoint", str(repo / "models" / MODEL_NAME / "1")]
    return service_argv(repo, port, *cfg.extra_server_args, device=cfg.device)


def start_servers(cfg: BenchConfig, repo: Path, log_dir: Path,
                  timeout_s: float = 120.0) -> dict[str, ServerProcess]:
    """Launch the chosen backends (in parallel), return once all are SERVING."""
    log_dir.mkdir(parents=True, exist_ok=True)
    servers = {}
    for name in cfg.backends:
        port = free_port()
        servers[name] = launch(name, _argv(name, port, cfg, repo), port, log_dir)
    try:
        for server in servers.values():
            wait_serving(server, timeout_s)
    except BaseException:
        stop_servers(servers)
        raise
    return servers


def stop_servers(servers: dict[str, ServerProcess]) -> None:
    """SIGTERM each server, then SIGKILL whatever has not exited within a few seconds."""
    for server in servers.values():
        if server.proc.poll() is None:
            server.proc.terminate()
    for server in servers.values():
        try:
            server.proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            server.proc.kill()
            server.proc.wait()

"""A real server with its tables on the GPU, in its own process (``python -m service``).

A CUDA IPC handle cannot be opened by the process that exported it, so the gpu-marked CUDA
shared-memory tests allocate their regions here and talk to a server in a child process,
as a consumer on the same node does.
"""

from __future__ import annotations

import contextlib
import os
import socket
import subprocess
import sys
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

__all__ = ["ChildServer", "child_server"]

ROOT = Path(__file__).resolve().parents[3]


@dataclass(frozen=True)
class ChildServer:
    """Where the child serves."""

    target: str  # gRPC host:port
    http_port: int
    proc: subprocess.Popen[str]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@contextlib.contextmanager
def child_server(repo: Path, *flags: str, device: str = "cuda",
                 default_model: str = "tiny") -> Iterator[ChildServer]:
    """``python -m service --device cuda`` over ``repo`` on free ports, once it serves."""
    grpc_port, http_port = _free_port(), _free_port()
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(
        p for p in (str(ROOT), os.environ.get("PYTHONPATH")) if p)}
    proc = subprocess.Popen(
        [sys.executable, "-m", "service", "--model-repository", str(repo), "--host",
         "127.0.0.1", "--grpc-port", str(grpc_port), "--http-port", str(http_port),
         "--metrics-port", "-1", "--poll-seconds", "0", "--device", device,
         "--default-model", default_model, *flags],
        cwd=ROOT, stderr=subprocess.PIPE, text=True, env=env)
    try:
        assert proc.stderr is not None
        seen = []
        for line in proc.stderr:
            seen.append(line)
            if " serving " in line:
                break
        else:
            raise AssertionError("server exited before serving:\n" + "".join(seen[-30:]))
        # keep reading its log: a full pipe would stop the server mid-request
        threading.Thread(target=seen.extend, args=(proc.stderr,), daemon=True).start()
        yield ChildServer(f"127.0.0.1:{grpc_port}", http_port, proc)
    finally:
        if proc.poll() is None:
            proc.terminate()
            try:
                proc.wait(20)
            except subprocess.TimeoutExpired:
                proc.kill()

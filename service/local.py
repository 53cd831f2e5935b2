"""An in-process server on its own event-loop thread: for tests, benchmarks, examples and
notebooks (``python -m service`` is the production entry point).

``start_in_thread`` starts an ``EmbeddingServer`` on a new thread's loop and returns a
``ServerHandle``, a context manager that drains and stops it; ``start_local`` is the same on
loopback, free ports and the CPU.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
from dataclasses import dataclass
from pathlib import Path

from service.config import ServerConfig
from service.server import EmbeddingServer

__all__ = ["ServerHandle", "start_in_thread", "start_local"]


@dataclass
class ServerHandle:
    """A server running on its own event-loop thread (tests, benchmarks, examples); a
    context manager that drains and stops it on exit."""

    server: EmbeddingServer
    loop: asyncio.AbstractEventLoop
    thread: threading.Thread

    @property
    def grpc_port(self) -> int:
        """Bound gRPC port."""
        return self.server.grpc_port

    @property
    def http_port(self) -> int:
        """Bound HTTP port (0 when HTTP is off)."""
        return self.server.http_port

    @property
    def metrics_port(self) -> int:
        """Bound metrics port."""
        return self.server.metrics_port

    @property
    def target(self) -> str:
        """``host:port`` for a client channel."""
        return f"127.0.0.1:{self.grpc_port}"

    def refresh(self) -> None:
        """Rescan the repository now (instead of waiting for the poll)."""
        asyncio.run_coroutine_threadsafe(self.server.refresh(), self.loop).result(60)

    def __enter__(self) -> ServerHandle:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def stop(self, grace: float = 1.0) -> None:
        """Drain and stop; joins the thread."""
        if self.thread.is_alive():
            fut = asyncio.run_coroutine_threadsafe(self.server.drain(grace), self.loop)
            with contextlib.suppress(Exception):
                fut.result(grace + 30)
            self.loop.call_soon_threadsafe(self.loop.stop)
            self.thread.join(30)


def start_in_thread(config: ServerConfig) -> ServerHandle:
    """Start a server on a new thread's event loop; returns once it is started."""
    loop = asyncio.new_event_loop()
    thread = threading.Thread(target=loop.run_forever, name="embed-server", daemon=True)
    thread.start()

    async def started() -> EmbeddingServer:
        server = EmbeddingServer(config)
        await server.start()
        return server

    try:
        server = asyncio.run_coroutine_threadsafe(started(), loop).result(120)
    except BaseException:
        loop.call_soon_threadsafe(loop.stop)
        raise
    return ServerHandle(server, loop, thread)


def start_local(model_repository: Path, default_model: str = "") -> ServerHandle:
    """An in-process server on loopback and free ports, on CPU, without hot reload (examples,
    notebooks); use it as a context manager."""
    return start_in_thread(ServerConfig(
        model_repository=model_repository, default_model=default_model, host="127.0.0.1",
        grpc_port=0, http_port=0, metrics_port=0, poll_seconds=0, device="cpu"))

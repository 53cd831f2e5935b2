"""``--workers N``: N server processes on one port (SO_REUSEPORT), one page cache.

Each worker is a fresh interpreter (spawn, not fork: gRPC's threads do not survive fork)
that memory-maps the same safetensors files, so the tables' pages are shared and the
proportional set size (PSS) per worker is ~table bytes / N. The kernel spreads incoming
connections across the workers' listening sockets. Worker i serves metrics on
``metrics_port + i``. SIGTERM to the parent is forwarded; each worker drains as usual.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import multiprocessing as mp
import signal
import sys
from types import FrameType

from service.config import ServerConfig

__all__ = ["run_workers"]

log = logging.getLogger("service.workers")


def _worker(config: ServerConfig, index: int) -> None:
    from service.__main__ import setup_logging
    from service.server import serve

    setup_logging(config)
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the parent decides when to stop
    asyncio.run(serve(config))


def run_workers(config: ServerConfig) -> None:
    """Start ``config.workers`` servers sharing the gRPC port; exit with the worst status."""
    if config.grpc_port == 0:
        raise SystemExit("--workers > 1 needs a fixed --grpc-port (0 would differ per worker)")
    ctx = mp.get_context("spawn")
    procs = []
    for i in range(config.workers):
        metrics_port = config.metrics_port + i if config.metrics_port > 0 else config.metrics_port
        worker_config = dataclasses.replace(config, metrics_port=metrics_port)
        proc = ctx.Process(target=_worker, args=(worker_config, i), name=f"embed-worker-{i}")
        proc.start()
        procs.append(proc)
    log.info("started %d workers on port %d: pids %s", len(procs), config.grpc_port,
             [p.pid for p in procs])

    def forward(signum: int, _frame: FrameType | None) -> None:
        for p in procs:
            if p.is_alive() and p.pid is not None:
                p.terminate() if signum == signal.SIGTERM else p.kill()

    signal.signal(signal.SIGTERM, forward)
    signal.signal(signal.SIGINT, lambda s, f: forward(signal.SIGTERM, f))
    for p in procs:
        p.join()
    sys.exit(max((p.exitcode or 0) for p in procs))

"""``--workers N``: N server processes on one port (SO_REUSEPORT), supervised.

Each worker is a fresh interpreter (spawn, not fork: gRPC's threads do not survive fork).
Before spawning them, the parent reads each model's newest table file once into a sealed
memfd (``format/shared_tables``: hashed as read, then immutable; a file truncated or
rewritten in place cannot crash or change a worker), and every worker maps that one copy:
N workers hold the table once. A version loaded later (hot reload, a pin) is read into the
worker's private memory as with one worker. The kernel spreads incoming
connections across the workers' listening sockets. Worker i serves metrics on
``metrics_port + i``.

The parent supervises: a worker that dies by a signal or exits non-zero while the server
is not shutting down is started again with the same config and index (one log line with
the running restart count). Restarts are rate-bounded per worker (``RestartPolicy``): the
first one is immediate, the next ones back off exponentially, and more than
``max_restarts`` within ``window_s`` stops the whole server with exit status 1, so a
crash loop neither spins nor hides (the orchestrator then sees a failed pod). A worker
that refuses to start (exit status 2: a device torch does not see, a port taken) stops the
server with status 2 at once, without restarts. SIGTERM
to the parent is forwarded; each worker drains as usual and the parent exits with the
worst final status. SIGINT is treated as SIGTERM.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import multiprocessing as mp
import multiprocessing.connection
import signal
import sys
import time
from collections import deque
from dataclasses import dataclass, field
from multiprocessing.process import BaseProcess
from types import FrameType

from service.config import ServerConfig, exit_with
from service.format import shared_tables
from service.logs import setup_logging

__all__ = ["RestartBudget", "RestartPolicy", "describe_exit", "run_workers"]

log = logging.getLogger("service.workers")
# A worker's exit status when its config cannot work here (service/preflight.py): the
# server stops with it instead of restarting the worker into the same refusal.
REFUSED = 2


@dataclass(frozen=True)
class RestartPolicy:
    """How often a dead worker may be restarted before the server gives up."""

    max_restarts: int = 5  # per worker, within window_s
    window_s: float = 60.0
    backoff_s: float = 0.5  # delay before the 2nd restart in the window; doubles after
    max_backoff_s: float = 8.0


@dataclass
class RestartBudget:
    """Restart times of one worker index; decides the delay before the next restart."""

    policy: RestartPolicy
    times: deque[float] = field(default_factory=deque)

    def next_delay(self, now: float) -> float | None:
        """Seconds to wait before restarting now, or None when the budget is spent.

        Records the restart: call once per restart.
        """
        while self.times and now - self.times[0] > self.policy.window_s:
            self.times.popleft()
        if len(self.times) >= self.policy.max_restarts:
            return None
        recent = len(self.times)
        self.times.append(now)
        if recent == 0:
            return 0.0  # one crash: back at once, the other workers carry the load meanwhile
        return min(self.policy.max_backoff_s, self.policy.backoff_s * 2 ** (recent - 1))


def describe_exit(exitcode: int | None) -> str:
    """``"killed by SIGKILL"`` / ``"exit status 3"`` for a multiprocessing exitcode."""
    if exitcode is None:
        return "running"
    if exitcode < 0:
        try:
            return f"killed by {signal.Signals(-exitcode).name}"
        except ValueError:
            return f"killed by signal {-exitcode}"
    return f"exit status {exitcode}"


def _worker(config: ServerConfig, index: int) -> None:
    # Imported here, in the worker: the parent supervises and never loads torch (~250 MB).
    from service.preflight import StartupError, check_device
    from service.server import serve

    setup_logging(config)
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the parent decides when to stop
    try:
        check_device(config.device)
        asyncio.run(serve(config))
    except StartupError as e:  # no such device, or a port taken after the parent's check
        exit_with(str(e))  # status REFUSED: the parent stops, restarting cannot help


class _Supervisor:
    """The parent's state: one process per index, restarts, and the shutdown flag."""

    def __init__(self, config: ServerConfig, policy: RestartPolicy) -> None:
        self.config = config
        self.ctx = mp.get_context("spawn")
        self.procs: dict[int, BaseProcess] = {}
        self.budgets = {i: RestartBudget(policy) for i in range(config.workers)}
        self.pending: dict[int, float] = {}  # index -> monotonic time of a delayed restart
        self.restarts = 0
        self.stopping = False
        self.gave_up = False
        self.refused = False

    def spawn(self, index: int) -> None:
        c = self.config
        metrics_port = c.metrics_port + index if c.metrics_port > 0 else c.metrics_port
        worker_config = dataclasses.replace(c, metrics_port=metrics_port)
        proc = self.ctx.Process(target=_worker, args=(worker_config, index),
                                name=f"embed-worker-{index}")
        proc.start()
        self.procs[index] = proc

    def stop(self) -> None:
        """SIGTERM every live worker (each drains); no restarts from here on."""
        self.stopping = True
        self.pending.clear()
        for p in self.procs.values():
            if p.is_alive():
                p.terminate()

    def on_exit(self, index: int, proc: BaseProcess) -> None:
        code = proc.exitcode
        if self.stopping:
            return
        if code == REFUSED:  # the worker said why on stderr; a restart would say it again
            log.error("worker %d (pid %s) refused to start; stopping the server", index,
                      proc.pid)
            self.refused = True
            self.stop()
            return
        if code == 0:  # a clean exit (e.g. its own SIGTERM drain) is not a crash
            log.info("worker %d (pid %s) exited cleanly; not restarting it", index, proc.pid)
            return
        delay = self.budgets[index].next_delay(time.monotonic())
        if delay is None:
            p = self.budgets[index].policy
            log.error("worker %d (pid %s) %s: more than %d restarts in %.0fs; stopping the "
                      "server", index, proc.pid, describe_exit(code), p.max_restarts,
                      p.window_s)
            self.gave_up = True
            self.stop()
            return
        self.restarts += 1
        log.warning("worker %d (pid %s) %s; restarting it in %.1fs (restart %d of this "
                    "server)", index, proc.pid, describe_exit(code), delay, self.restarts)
        self.pending[index] = time.monotonic() + delay

    def loop(self) -> int:
        """Supervise until every worker has exited with no restart due; the exit status."""
        live = dict(self.procs)
        while live or self.pending:
            now = time.monotonic()
            for index, due in list(self.pending.items()):
                if due <= now and not self.stopping:
                    del self.pending[index]
                    self.spawn(index)
                    live[index] = self.procs[index]
                    log.info("worker %d restarted: pid %s", index, self.procs[index].pid)
            timeout = min([0.5, *(max(0.0, d - now) for d in self.pending.values())])
            sentinels = {p.sentinel: i for i, p in live.items()}
            # Wakes on a worker's death or after the timeout (signals run between waits).
            for ready in mp.connection.wait(list(sentinels), timeout):
                index = sentinels[ready]  # type: ignore[index]
                proc = live.pop(index)
                proc.join()
                self.on_exit(index, proc)
        if self.refused:
            return REFUSED
        if self.gave_up:
            return 1
        return max((p.exitcode or 0) for p in self.procs.values())


def _share_tables(config: ServerConfig) -> None:
    """Read each model's newest table once, sealed, for every worker to map
    (``shared_tables``); a table that cannot be shared is read by each worker as before."""
    start = time.monotonic()
    shared = shared_tables.publish(config.model_repository)
    log.info("shared %d table file(s) with the workers in %.2f s", len(shared),
             time.monotonic() - start)


def run_workers(config: ServerConfig, policy: RestartPolicy | None = None) -> None:
    """Start ``config.workers`` servers sharing the gRPC port, supervise, exit with status."""
    _share_tables(config)
    sup = _Supervisor(config, policy or RestartPolicy())
    for i in range(config.workers):
        sup.spawn(i)
    log.info("started %d workers on port %d: pids %s", config.workers, config.grpc_port,
             [p.pid for p in sup.procs.values()])

    def forward(_signum: int, _frame: FrameType | None) -> None:
        sup.stop()

    signal.signal(signal.SIGTERM, forward)
    signal.signal(signal.SIGINT, forward)
    sys.exit(sup.loop())

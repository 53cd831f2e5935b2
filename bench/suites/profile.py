"""Where a small request's server CPU goes: a sampling profile of the running service.

``python -m bench --suites profile`` (``make profile``): the service alone, as ``make bench``
starts it, driven at T=16 fp32 over each wire (gRPC ``unary``, OIP ``oip``, REST binary
``rest`` and JSON ``json``) at each concurrency. Each cell runs twice: once alone, for the
server's CPU per reply (from /proc), and once while ``py-spy`` samples every thread of it
from outside, for the shares. A sample whose innermost frame is the event loop waiting
(``select``) is idle, as is one of another thread with no frame of the service (a pool's
worker or grpcio's poller waiting): neither is counted. One whose innermost frame is in a
transport library (grpcio, aiohttp, asyncio, the socket) is the transport's, as is one on
the loop with no frame of the service; any other is charged to the innermost frame of the
service's own code on its stack, by module (``STAGES``). A stage's share times the CPU per
reply of the unsampled run is that stage's microseconds per reply.

py-spy pauses the server for each sample (its default): a sample read without pausing
(``--nonblocking``) is dropped when the stack changed under the read, which happens to a
thread running Python and not to one waiting in a system call, so those samples charged a
socket send several times its cost (about 60 % of the loop's samples at REST c=16, where
``perf`` puts all the server's kernel time at 13 %). Pausing slows the server while it is
sampled, hence the separate run for the CPU figure, and the low rate.
"""

from __future__ import annotations

import collections
import shutil
import subprocess
import sys
import tempfile
from dataclasses import replace
from pathlib import Path
from typing import Any

from bench.harness.checkpoint import MODEL_NAME, VOCAB_SIZE, Shape, ensure_model
from bench.harness.config import BenchConfig
from bench.harness.launch import stop
from bench.harness.report import SuiteResult
from bench.suites import in_context
from bench.suites.serving import Cell, measure_cell, request_ids, start_servers

__all__ = ["STAGES", "WIRES", "run", "stage_of", "tally"]

WIRES = ("unary", "oip", "rest", "json")
# (stage, path fragments), the more specific first: a frame's file is matched in order.
# frame: the per-RPC frame (status map, deadline, in-flight); front: the rest of service/rpc,
# reading the wire; hand-off: the request to the lookup and back; lookup: gather, rule,
# cast; response: the answer laid out and sent.
STAGES: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("auth", ("service/rpc/identity.py",)),
    ("metrics", ("service/metrics.py", "prometheus_client/")),
    ("tracing", ("service/tracing.py", "opentelemetry/")),
    ("frame", ("service/rpc/frame.py", "service/errors.py")),
    ("lookup", ("service/engine/tables.py", "service/engine/kernel.py",
                "service/engine/rules.py")),
    ("response", ("service/engine/replies.py", "service/engine/rest_reply.py",
                  "service/engine/message.py", "service/engine/shm", "service/engine/regions.py",
                  "service/engine/cuda_plan.py", "service/engine/cuda_shm.py",
                  "service/rpc/http/send.py")),
    ("hand-off", ("service/engine/engine.py", "service/engine/batcher.py",
                  "service/engine/budgets.py")),
    ("admission", ("service/engine/admission.py", "service/engine/validation.py",
                   "service/engine/repository.py", "service/format/", "tiktoken/",
                   "tokenizers/")),
    ("front", ("service/rpc/",)),
)
TRANSPORT = "transport"
ORDER = [name for name, _ in STAGES] + [TRANSPORT]
_TRANSPORT_LIBS = ("grpc/", "aiohttp/", "asyncio/", "selectors.py", "socket.py", "ssl.py")
_IDLE = ("select (selectors.py", "EpollSelector.select (")  # the loop waiting for work
_LOOP = "_run_once ("  # a frame of the event loop's thread at work
_SERVICE = "service/"  # a frame of the service's own code
_RATE = 200  # samples per second: each pauses the server


def stage_of(stack: str) -> str | None:
    """The stage of one collapsed stack (``outer;...;inner``, each frame ``fn (file:line)``);
    None for the loop waiting for work, or another thread waiting (no frame of the
    service's)."""
    frames = stack.split(";")
    leaf = frames[-1]
    if leaf.startswith(_IDLE):
        return None
    if _LOOP not in stack and _SERVICE not in stack:
        return None
    if any(lib in leaf for lib in _TRANSPORT_LIBS):
        return TRANSPORT
    for frame in reversed(frames):
        for name, fragments in STAGES:
            if any(f in frame for f in fragments):
                return name
    return TRANSPORT


def tally(raw: str) -> dict[str, int]:
    """Samples per stage of py-spy's ``--format raw`` output (``stack count`` lines)."""
    counts: collections.Counter[str] = collections.Counter()
    for line in raw.splitlines():
        stack, _, n = line.rpartition(" ")
        stage = stage_of(stack) if stack and n.isdigit() else None
        if stage is not None:
            counts[stage] += int(n)
    return {name: counts.get(name, 0) for name in ORDER}


def _profile(cfg: BenchConfig, cell: Cell, server: Any, ids: dict[int, list[list[int]]],
             out: Path) -> dict[str, Any]:
    """One cell measured alone, then again while py-spy samples the server; its stages."""
    m = measure_cell(cfg, cell, server, ids)
    # The sampled run, longer: at _RATE a stage's share is read from some thousand samples.
    cfg = replace(cfg, duration_s=4 * cfg.duration_s)
    seconds = int(cfg.warmup_s + cfg.duration_s + 1)
    py_spy = shutil.which("py-spy") or str(Path(sys.executable).with_name("py-spy"))
    if not Path(py_spy).exists():
        raise RuntimeError("profile: py-spy is not installed (make setup installs it)")
    spy = subprocess.Popen([py_spy, "record", "--pid", str(server.proc.pid), "--rate",
                            str(_RATE), "--duration", str(seconds),
                            "--format", "raw", "--output", str(out)],
                           stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        measure_cell(cfg, cell, server, ids)
    finally:
        _, err = spy.communicate(timeout=seconds + 60)
    if spy.returncode != 0 or not out.exists():
        raise RuntimeError(f"profile: py-spy failed ({spy.returncode}): {err.decode()[-500:]}")
    samples = tally(out.read_text())
    total = sum(samples.values()) or 1
    cpu_us = m.cpu_s / m.requests * 1e6
    return {"key": cell.key, "mode": cell.mode, "c": cell.c, "req_s": m.requests / m.seconds,
            "cpu_us": cpu_us, "samples": samples,
            "us": {k: round(v / total * cpu_us, 1) for k, v in samples.items()}}


def _table(rows: list[dict[str, Any]]) -> str:
    cols = [f"{r['mode']} c={r['c']}" for r in rows]
    head = f"{'µs of server CPU per reply':28}" + "".join(f"{c:>12}" for c in cols)
    lines = [head, "-" * len(head)]
    for stage in ORDER:
        lines.append(f"{stage:28}" + "".join(f"{r['us'][stage]:>12.1f}" for r in rows))
    lines.append(f"{'all (from /proc)':28}" + "".join(f"{r['cpu_us']:>12.1f}" for r in rows))
    lines.append(f"{'req/s':28}" + "".join(f"{r['req_s']:>12.0f}" for r in rows))
    lines.append(f"{'samples (the shares)':28}"
                 + "".join(f"{sum(r['samples'].values()):>12}" for r in rows))
    return "\n".join(lines)


def run(cfg: BenchConfig, log: Any = print) -> SuiteResult:
    T = min(cfg.ts)
    cfg = replace(cfg, backends=("service",), modes=WIRES, ts=(T,), dtypes=("float32",))
    repo = ensure_model(cfg.model_cache, Shape(VOCAB_SIZE, cfg.dim, cfg.max_seq_len))
    ids = request_ids(cfg)
    servers = start_servers(cfg, repo, cfg.out / "captured")
    rows = []
    try:
        with tempfile.TemporaryDirectory(prefix="bench-profile-") as tmp:
            for mode in WIRES:
                for c in cfg.concurrencies:
                    cell = Cell("service", mode, T, "float32", c)
                    rows.append(_profile(cfg, cell, servers["service"], ids,
                                         Path(tmp) / f"{mode}-{c}.txt"))
                    log(f"profile: {cell.key}: {rows[-1]['cpu_us']:.0f} µs of CPU per reply")
    finally:
        stop(servers.values())
    context = _in_context(cfg, repo, ids[T][0])
    log(f"profile: a REST T={T} request in context, in-process: service "
        f"{context['service_us']:.0f} µs (metrics on: {context['service_metrics_us']:.0f}), "
        f"lookup floor {context['floor_us']:.0f} µs")
    text = _table(rows) + (f"\n\nA REST binary T={T} request in context, in-process (no sockets;"
                           f" bench/suites/in_context.py): service "
                           f"{context['service_us']:.1f} µs (with its metrics on: "
                           f"{context['service_metrics_us']:.1f}), lookup floor "
                           f"{context['floor_us']:.1f} µs")
    return SuiteResult("profile", {"T": T, "rate": _RATE, "cells": rows,
                                   "in_context": context}, text)


def _in_context(cfg: BenchConfig, repo: Path, ids: list[int]) -> dict[str, float]:
    """``in_context.measure`` on in-process services of the serving configuration (metrics
    off, as the grid runs it) and with its metrics on, in alternating rounds; the minimum
    of each."""
    from service.config import ServerConfig
    from service.local import ServerHandle, start_in_thread

    handles: dict[str, ServerHandle] = {}
    try:
        for key, port in (("service_us", -1), ("service_metrics_us", 0)):
            handles[key] = start_in_thread(ServerConfig(
                model_repository=repo / "models", host="127.0.0.1", grpc_port=0, http_port=0,
                metrics_port=port, poll_seconds=0, device="cpu"))
        n = 300 if cfg.quick else 3000
        best: dict[str, float] = {}
        for _ in range(5):
            for key, handle in handles.items():
                r = in_context.measure(handle, repo / "models" / MODEL_NAME / "1", ids, n=n,
                                       rounds=1)
                best[key] = min(best.get(key, r["service_us"]), r["service_us"])
                best["floor_us"] = min(best.get("floor_us", r["floor_us"]), r["floor_us"])
        return best
    finally:
        for handle in handles.values():
            handle.stop()

"""Soak: N clients for M minutes against ``python -m service --workers W``, with reloads and a kill.

    python -m bench.soak --clients 4 --minutes 3 --workers 2 --seed 0

Loopback only, bounded in time. The clients (bench/soak/traffic.py) send random valid and
invalid Embed, EmbedBatch and EmbedStream requests back to back, with client.retry's
policy on their channels; every valid answer is checked bit for bit against the tables of
the version it names (bench/soak/oracle.py). Meanwhile, at fixed fractions of the run:
new versions are published (``--versions``), a version with a corrupted file is dropped
in (``--bad``), and one worker is SIGKILLed (``--kill-at``) for the parent to restart.
The server polls the repository every ``--poll-seconds``. ``--slow-readers`` clients
(bench/soak/slow.py) hold EmbedStreams of 1 MiB answers unread for long stretches beside
them: their answers must still all arrive exact, and the server's RSS stay within what
its stream budget allows. ``--rest-clients`` send the same kinds of requests as OIP REST
infer on the server's HTTP port (bench/soak/rest.py), checked by the same oracle and
tallied with everyone else's, and ``--rest-slow-readers`` hold one large REST answer
unread per stretch beside the gRPC slow readers. For its first ``--shm-seconds`` (before
the kill), clients write into shared-memory regions while a careless one truncates its own
under load (bench/soak/shm_truncate.py).

Prints progress every ``--progress`` seconds, then the summary; writes
``<out>/soak.json``, ``<out>/soak.png`` (p50/p99 and server RSS over time) and the
server's log ``<out>/soak-server.log``; the temporary model repository is removed. Exits 1
unless lost = corrupted = wrong codes = failed valid requests = 0 (for the slow readers
too), no bad version was served, the last good version is served at the end, the killed
worker came back, no clean slow-reader stretch grew the RSS past its bound, and the
shared-memory scenario lost and corrupted nothing.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import random
import signal
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import grpc

from bench.harness.checkpoint import VOCAB_SIZE
from bench.harness.launch import (
    ROOT,
    free_port,
    launch_service,
    tree_rss_mb,
    worker_pids,
)
from bench.soak import shm_truncate
from bench.soak import slow as slowly
from bench.soak.oracle import Oracle, Publisher
from bench.soak.requests import MODEL, RequestMaker
from bench.soak.rest import RestClient, RestSlowReader
from bench.soak.traffic import AttemptCounter, SoakClient, Tally
from client.retry import RetryPolicy
from genproto.embedding.v1 import embedding_pb2 as pb
from genproto.embedding.v1 import embedding_pb2_grpc as pb_grpc
from service.format.tokenizer import default_ranks_path, gpt2_spec, load_tokenizer

__all__ = ["Soak", "drive", "final_versions", "parse_args"]


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m bench.soak", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--clients", type=int, default=4)
    p.add_argument("--minutes", type=float, default=3.0)
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--versions", type=int, default=2, help="good versions published midway")
    p.add_argument("--bad", type=int, default=1, help="corrupted versions dropped in")
    p.add_argument("--kill-at", type=float, default=0.5,
                   help="fraction of the run at which a worker is SIGKILLed; 0 = never")
    p.add_argument("--poll-seconds", type=float, default=1.0)
    p.add_argument("--invalid", type=float, default=0.15, help="share of invalid requests")
    p.add_argument("--dim", type=int, default=32)
    p.add_argument("--max-seq-len", type=int, default=128)
    p.add_argument("--window", type=float, default=5.0, help="seconds per latency window")
    p.add_argument("--progress", type=float, default=10.0)
    p.add_argument("--out", type=Path, default=ROOT / "bench" / "results")
    p.add_argument("--server-arg", action="append", default=[],
                   help="extra flag for python -m service (repeatable)")
    slowly.add_slow_args(p)
    p.add_argument("--rest-clients", type=int, default=2,
                   help="clients sending OIP REST infer on the HTTP port; 0 = none")
    p.add_argument("--rest-slow-readers", type=int, default=1,
                   help="REST clients holding one large answer unread per stretch; 0 = none")
    p.add_argument("--rest-slow-batch", type=int, default=8,
                   help="B of their requests (T = --slow-tokens on the wide model)")
    p.add_argument("--shm-seconds", type=float,
                   help="seconds of the shared-memory scenario from the start; 0 = none "
                   "(default: 20, ending 5 s before the kill at the latest)")
    p.add_argument("--shm-clients", type=int, default=2,
                   help="its good clients (beside one careless client)")
    args = p.parse_args(argv)
    if args.kill_at and args.workers < 2:
        p.error("--kill-at needs --workers >= 2 (the parent restarts a killed worker)")
    # Its regions are registered with one worker each: the kill would take them along.
    end = args.kill_at * args.minutes * 60 - 5 if args.kill_at else args.minutes * 60
    if args.shm_seconds is None:
        args.shm_seconds = max(0.0, min(20.0, end))
    elif args.shm_seconds > end:
        p.error(f"--shm-seconds {args.shm_seconds:g} must end by {end:g} s into the run "
                "(5 s before --kill-at, within --minutes)")
    return args


def _schedule(args: argparse.Namespace) -> list[tuple[float, str]]:
    """(fraction of the run, event): good versions spread over 20..80 %, bad ones between."""
    events = [(0.2 + 0.6 * i / max(1, args.versions - 1) if args.versions > 1 else 0.3,
               "publish") for i in range(args.versions)]
    events += [(0.35 + 0.1 * i, "bad") for i in range(args.bad)]
    if args.kill_at:
        events.append((args.kill_at, "kill"))
    return sorted(events)


class Soak:
    """The live state of one soak: server, publisher, tally, samples and events."""

    def __init__(self, args: argparse.Namespace, root: Path) -> None:
        self.args, self.root = args, root
        self.encode = load_tokenizer(gpt2_spec(), default_ranks_path()).encode
        self.oracle = Oracle(args.max_seq_len, self.encode)
        self.publisher = Publisher(root, self.oracle, args.dim, args.max_seq_len)
        self.publisher.publish()  # version 1, before the server starts
        # The slow readers' model: ids only, wide rows and long sequences (large answers).
        self.wide_oracle = Oracle(args.slow_tokens, self.encode, slowly.WIDE_MODEL)
        if args.slow_readers or args.rest_slow_readers:
            Publisher(root, self.wide_oracle, args.slow_dim, args.slow_tokens,
                      slowly.WIDE_VOCAB, tokenizer=False).publish()
        if args.shm_seconds:
            shm_truncate.write_model(root / "models", args.seed)
        self.slow, self.tally = slowly.SlowTally(), Tally()
        self.shm: shm_truncate.Outcome | None = None
        rest = args.rest_clients or args.rest_slow_readers
        self.server = launch_service(
            "server", root, root, "--default-model", MODEL, "--workers", str(args.workers),
            "--poll-seconds", str(args.poll_seconds), *args.server_arg,
            http_port=free_port() if rest else -1)
        self.events: list[dict[str, Any]] = []
        self.rss: list[dict[str, Any]] = []
        self.killed: int | None = None
        self.counter = AttemptCounter(self.server.target)
        self.serving_before = 0
        self.rest_clients: list[RestClient] = []

    def log_count(self, text: str) -> int:
        return sum(text in line for line in self.server.log.read_text().splitlines())

    def event(self, kind: str, label: str) -> None:
        t = time.monotonic() - self.tally.t0
        self.events.append({"t": round(t, 2), "kind": kind, "label": label})
        print(f"[{t:6.1f}s] {label}", flush=True)

    async def fire(self, kind: str) -> None:
        if kind == "publish":
            version, cid = await asyncio.to_thread(self.publisher.publish)
            self.event(kind, f"published v{version} ({cid[:12]})")
        elif kind == "bad":
            version = await asyncio.to_thread(self.publisher.publish_bad)
            self.event(kind, f"dropped in bad v{version} (one byte flipped)")
        elif kind == "kill":
            pids = worker_pids(self.server.proc.pid)
            self.killed = random.Random(self.args.seed).choice(pids)
            self.serving_before = self.log_count(" serving ")
            self.counter.sample()  # the killed connection's subchannel counts go with it
            os.kill(self.killed, signal.SIGKILL)
            self.event(kind, f"SIGKILL worker pid {self.killed} (of {pids})")

    def watch_restart(self) -> None:
        """Record when the parent restarted the killed worker and when it served again."""
        kinds = {e["kind"] for e in self.events}
        if self.killed is None or "serving_again" in kinds:
            return
        if "restarted" not in kinds and self.log_count("restarted: pid"):
            self.event("restarted", "parent restarted the worker")
        if "restarted" in {e["kind"] for e in self.events} and \
                self.log_count(" serving ") > self.serving_before:
            self.event("serving_again", "replacement worker serving")

    def sample(self) -> None:
        total, each = tree_rss_mb(self.server.proc.pid)
        self.rss.append({"t": round(time.monotonic() - self.tally.t0, 2),
                         "total_mb": round(total, 1),
                         "processes": {str(k): round(v, 1) for k, v in each.items()}})

    def progress(self) -> None:
        t = self.tally
        print(f"[{time.monotonic() - t.t0:6.1f}s] requests {sum(t.requests.values())} "
              f"answered {t.answered} failed {sum(t.failures.values())} wrong-code "
              f"{t.wrong_code} lost {t.lost} corrupted {t.corrupted} retries "
              f"{self.counter.retries} "
              f"resumes {t.stream_resumes} slow answered {self.slow.answered}/"
              f"{self.slow.requests} versions {dict(sorted(t.versions.items()))} "
              f"rss {self.rss[-1]['total_mb'] if self.rss else 0:.0f} MB", flush=True)


async def drive(run: Soak) -> None:
    args, target, port = run.args, run.server.target, run.server.http_port
    duration = args.minutes * 60
    run.tally.t0 = run.slow.t0 = time.monotonic()
    until = run.tally.t0 + duration

    def maker(seed: int) -> RequestMaker:
        return RequestMaker(random.Random(seed), VOCAB_SIZE, args.max_seq_len, run.encode)

    clients = [SoakClient(i, target, RetryPolicy(), run.oracle, maker(args.seed * 1000 + i),
                          run.tally, args.invalid) for i in range(args.clients)]
    run.sample()  # t = 0: a baseline before any traffic
    readers = [slowly.SlowReader(i, target, RetryPolicy(), run.wide_oracle, run.slow, args,
                                 random.Random(args.seed * 31 + i))
               for i in range(args.slow_readers)]
    run.rest_clients = [RestClient(i, port, run.oracle, maker(args.seed * 1000 + 500 + i),
                                   run.tally, args.invalid) for i in range(args.rest_clients)]
    rest_readers = [RestSlowReader(i, port, run.wide_oracle, run.slow, args.rest_slow_batch,
                                   args.slow_tokens, args.slow_hold,
                                   random.Random(args.seed * 37 + i))
                    for i in range(args.rest_slow_readers)]
    tasks: list[asyncio.Task[Any]] = [
        asyncio.create_task(c.run(until, random.Random(args.seed * 7919 + i)))
        for i, c in enumerate(clients)]
    others: list[Any] = [*readers, *run.rest_clients]  # closed at the end, as the clients
    tasks += [asyncio.create_task(r.run(until)) for r in [*others, *rest_readers]]
    if args.shm_seconds:
        shm = asyncio.create_task(shm_truncate.run_truncate_scenario(
            target, args.shm_seconds, args.shm_clients, args.seed, args.seed))
        tasks.append(shm)
    pending = _schedule(args)
    next_progress = args.progress
    while not all(t.done() for t in tasks):
        await asyncio.sleep(0.5)
        elapsed = time.monotonic() - run.tally.t0
        while pending and pending[0][0] * duration <= elapsed:
            await run.fire(pending.pop(0)[1])
        run.watch_restart()
        run.counter.sample()
        if not run.rss or elapsed - run.rss[-1]["t"] >= 1.0:
            run.sample()
        if elapsed >= next_progress:
            run.progress()
            next_progress += args.progress
    await asyncio.gather(*tasks)  # re-raise a client's crash, if any
    if args.shm_seconds:
        run.shm = shm.result()
    run.counter.sample()
    for c in [*clients, *others]:
        await c.close()


def final_versions(target: str, n: int = 4) -> list[int]:
    """The version each of ``n`` fresh connections is served (any worker may answer)."""
    out = []
    for _ in range(n):
        with grpc.insecure_channel(target) as channel:
            stub = pb_grpc.EmbeddingServiceStub(channel)
            out.append(stub.Embed(pb.EmbedRequest(token_ids=pb.TokenIds(ids=[1])),
                                  timeout=30).version)
    return out

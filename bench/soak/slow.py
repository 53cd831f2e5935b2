"""The soak's slow readers: EmbedStreams of large answers left unread for long stretches.

A stretch: an EmbedStream on the wide model (ids only) of ``--slow-requests`` requests of
T = ``--slow-tokens`` (1 MiB answers at the defaults: more than the stream's window of 64
answers can hold within its 16 MiB budget), nothing read for ``--slow-hold`` seconds, then
the answers read slowly, each checked bit for bit. The server paces such a stream
(service/engine/budgets.py), so every answer still arrives, exact. Their figures
(``SlowTally``, the REST slow readers' too) are kept apart from the other clients', and
``rss_during`` sets the server's RSS beside each stretch against what the budget allows.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import random
import time
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import grpc
import grpc.aio

from bench.soak.oracle import Oracle
from bench.soak.requests import Expected, Item
from bench.soak.traffic import Problems, retry_channel
from client.retry import RetryPolicy
from genproto.embedding.v1 import embedding_pb2 as pb

__all__ = ["WIDE_MODEL", "WIDE_VOCAB", "SlowReader", "SlowTally", "add_slow_args",
           "rss_during", "slow_summary"]

WIDE_MODEL = "soak-wide"
WIDE_VOCAB = 4096  # ids only: a small table, the answers are large through T and C
OK = grpc.StatusCode.OK
_MAX_STRETCHES = 1000
_MAX_RESUMES = 3
_READ_SLACK_S = 60.0  # deadline beyond hold + trickle: a loaded machine, a restarted worker


def add_slow_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--slow-readers", type=int, default=1,
                   help="clients that hold EmbedStreams of large answers unread; 0 = none")
    p.add_argument("--slow-tokens", type=int, default=1024, help="T of their requests")
    p.add_argument("--slow-dim", type=int, default=256, help="C of their (wide) model")
    p.add_argument("--slow-requests", type=int, default=96, help="requests per stretch")
    p.add_argument("--slow-hold", type=float, default=10.0,
                   help="seconds a stretch reads nothing")
    p.add_argument("--slow-trickle", type=float, default=0.02,
                   help="seconds between answers once it reads")


@dataclass
class SlowTally(Problems):
    """What the slow readers saw, and each stretch's record."""

    requests: int = 0
    answered: int = 0
    corrupted: int = 0
    lost: int = 0
    resumes: int = 0
    failures: Counter[str] = field(default_factory=Counter)  # code of a failed request
    stretches: list[dict[str, Any]] = field(default_factory=list)
    prefix = "slow: "

    def begin(self, reader: int | str, requests: int) -> dict[str, Any]:
        """A stretch of ``requests`` starts: its record."""
        self.requests += requests
        return {"reader": reader, "start": time.monotonic() - self.t0, "requests": requests,
                "answered": 0, "resumes": 0}

    def held(self, rec: dict[str, Any], hold: float) -> None:
        if hold:
            rec["hold_end"] = time.monotonic() - self.t0

    def end(self, rec: dict[str, Any]) -> None:
        rec["end"] = time.monotonic() - self.t0
        self.stretches.append({k: round(v, 2) if isinstance(v, float) else v
                               for k, v in rec.items()})


async def first_wait(until: float, first_s: float = 3.0) -> None:
    """The wait before a slow reader's first stretch: the other clients warm the server up,
    so the RSS before it is a fair baseline."""
    await asyncio.sleep(max(0.0, min(first_s, until - time.monotonic())))


class SlowReader:
    """One slow reader: its own channel, stretches until ``until`` (``run``), then ``close``."""

    def __init__(self, index: int, target: str, retry: RetryPolicy, oracle: Oracle,
                 tally: SlowTally, args: argparse.Namespace, rng: random.Random) -> None:
        self.channel, self.stub = retry_channel(target, retry)
        self.index, self.oracle, self.tally, self.rng = index, oracle, tally, rng
        self.tokens, self.n_requests = args.slow_tokens, args.slow_requests
        self.hold_s, self.trickle_s = args.slow_hold, args.slow_trickle
        self.n = 0

    def _pair(self) -> tuple[pb.EmbedRequest, Expected]:
        self.n += 1
        ids = tuple(self.rng.randrange(WIDE_VOCAB) for _ in range(self.tokens))
        req = pb.EmbedRequest(model=WIDE_MODEL, token_ids=pb.TokenIds(ids=ids),
                              request_id=f"slow{self.index}-{self.n}", dtype=pb.DTYPE_FLOAT32)
        return req, Expected(OK, (Item(ids, None, 0),), dtype=pb.DTYPE_FLOAT32)

    async def run(self, until: float) -> None:
        """Stretches back to back, after ``first_wait``, while one can still finish before
        ``until``."""
        await first_wait(until)
        for _ in range(_MAX_STRETCHES):
            if time.monotonic() + self.hold_s + self.trickle_s * self.n_requests + 5 > until:
                return
            await self.stretch()
            await asyncio.sleep(1.0)

    async def stretch(self) -> None:
        """One stream of ``n_requests`` held unread for ``hold_s``, then read slowly."""
        t = self.tally
        pairs = [self._pair() for _ in range(self.n_requests)]
        rec = t.begin(self.index, len(pairs))
        hold = self.hold_s
        for _ in range(_MAX_RESUMES + 1):
            done, code, details = await self._one_stream(pairs, hold, rec)
            hold = 0.0  # a resumed stream reads at once
            pairs = pairs[done:]
            rec["answered"] += done
            if not pairs:
                break
            if code == grpc.StatusCode.UNAVAILABLE and rec["resumes"] < _MAX_RESUMES:
                rec["resumes"] += 1  # a worker went away (the kill): resume the rest
                t.resumes += 1
                continue
            t.failures[code.name] += len(pairs)
            if code in (OK, grpc.StatusCode.DEADLINE_EXCEEDED):
                t.lost += len(pairs)  # sent and never answered
            t.problem(f"stream ended {code.name} with {len(pairs)} unanswered: {details}")
            break
        t.end(rec)

    async def _one_stream(self, pairs: Sequence[tuple[pb.EmbedRequest, Expected]],
                          hold: float, rec: dict[str, Any]) -> tuple[int, grpc.StatusCode, str]:
        """Write ``pairs``, read nothing for ``hold`` s, then read every answer slowly."""
        call = self.stub.EmbedStream(
            timeout=hold + self.hold_s + self.trickle_s * self.n_requests + _READ_SLACK_S)

        async def write() -> None:
            # Blocks once the server stops reading (HTTP/2 flow control): that is the point.
            # A call that ended under it says why through its status, read below.
            with contextlib.suppress(grpc.RpcError, asyncio.InvalidStateError):
                for req, _ in pairs:
                    await call.write(req)
                await call.done_writing()

        writer = asyncio.ensure_future(write())
        done, t = 0, self.tally
        try:
            await asyncio.sleep(hold)  # not reading: the server's budget holds the answers
            t.held(rec, hold)
            for _ in range(len(pairs) + 1):  # one more read sees the end of the stream
                resp = await call.read()
                if resp is grpc.aio.EOF:
                    break
                if done == len(pairs):
                    t.corrupted += 1
                    t.problem("an answer beyond the requests sent")
                    break
                wrong = self.oracle.check_embed(resp, pairs[done][1])
                t.answered += 1
                if wrong is not None:
                    t.corrupted += 1
                    t.problem(f"{resp.request_id}: {wrong}")
                done += 1
                await asyncio.sleep(self.trickle_s)
            return done, await call.code(), str(await call.details())
        except grpc.RpcError as e:
            return done, e.code(), str(e.details())
        finally:
            call.cancel()
            writer.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await writer

    async def close(self) -> None:
        await self.channel.close()


def rss_during(stretches: Sequence[Mapping[str, Any]], rss: Sequence[Mapping[str, Any]],
               events: Sequence[Mapping[str, Any]], settle_s: float = 5.0
               ) -> list[dict[str, Any]]:
    """Per stretch: server RSS just before it, its peak while it ran, the growth, and whether
    it is *clean*: no event (a version loading, the kill) from 2 s before it to
    ``settle_s`` after it, and not between a kill and the replacement serving again
    (+ ``settle_s``: it warms up). Only clean stretches measure what the slow reader costs."""
    busy = [(e["t"] - 2.0, e["t"] + settle_s) for e in events]
    kill = next((e["t"] for e in events if e["kind"] == "kill"), None)
    if kill is not None:
        back = next((e["t"] for e in events if e["kind"] == "serving_again"), float("inf"))
        busy.append((kill, back + settle_s))
    out = []
    for s in stretches:
        start, end = s["start"], s.get("end", s["start"])
        before = [r["total_mb"] for r in rss if r["t"] <= start]
        during = [r["total_mb"] for r in rss if start <= r["t"] <= end]
        if not before or not during:
            continue
        clean = not any(lo <= end and start <= hi for lo, hi in busy)
        out.append({"start": start, "end": end, "before_mb": before[-1],
                    "peak_mb": max(during), "growth_mb": round(max(during) - before[-1], 1),
                    "clean": clean})
    return out


def slow_summary(tally: SlowTally, per_stream: int, total: int, readers: int,
                 answer_bytes: int, rss: list[dict[str, Any]],
                 rest_answers: int = 0) -> dict[str, Any]:
    """The slow readers' figures and the RSS bound: what their budget lets the server hold
    (per stream, capped by the total), one answer more, 8 MiB of transport buffers per
    stream (the client's HTTP/2 window) and 16 MiB of noise; without pacing a stream holds
    its whole window of 64 answers. ``rest_answers``: the bytes of the REST slow readers'
    answers (one each: an HTTP/1.1 connection holds one answer, until sent)."""
    budget = min(readers * per_stream, total) if total else readers * per_stream
    bound_mb = (budget + readers * (answer_bytes + (8 << 20)) + rest_answers) / 2**20 + 16
    clean = [r for r in rss if r["clean"]]
    growth = max((r["growth_mb"] for r in clean), default=None)
    return {"readers": readers, "requests": tally.requests, "answered": tally.answered,
            "corrupted": tally.corrupted, "lost": tally.lost, "resumes": tally.resumes,
            "failed": sum(tally.failures.values()), "failures_by_code": dict(tally.failures),
            "stretches": len(tally.stretches), "answer_mib": answer_bytes / 2**20,
            "per_stream_budget_mib": per_stream / 2**20, "total_budget_mib": total / 2**20,
            "unpaced_mib": readers * 64 * answer_bytes / 2**20,
            "rss_max_mb": max((r["peak_mb"] for r in rss), default=None),
            "clean_stretches": len(clean), "max_growth_mb": growth,
            "bound_mb": round(bound_mb, 1), "rest_answers_mib": rest_answers / 2**20,
            "within_bound": None if growth is None else growth <= bound_mb,
            "rss": rss, "detail": tally.stretches}

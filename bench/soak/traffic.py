"""The soak's clients: random Embed / EmbedBatch / EmbedStream calls, every outcome tallied.

Per request message: valid and answered: checked by the oracle, else *corrupted*; valid
and refused: a *failure*; invalid: must get its expected code, else *wrong_code*; *lost*:
valid and never answered (its deadline expired, or its stream ended OK short). A stream
broken after an answer (gRPC does not retry it then) is resumed from its first unanswered
request (``stream_resumes``).
"""

from __future__ import annotations

import json
import random
import time
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import grpc
import grpc.aio

from bench.soak.oracle import Oracle
from bench.soak.requests import Expected, RequestMaker
from client.retry import RetryPolicy
from genproto.embedding.v1 import embedding_pb2 as pb
from genproto.embedding.v1 import embedding_pb2_grpc as pb_grpc

__all__ = ["AttemptCounter", "Problems", "SoakClient", "Tally", "retry_channel"]

OK = grpc.StatusCode.OK
_DEADLINE_S = 30.0
_MAX_RESUMES = 3


def retry_channel(target: str, retry: RetryPolicy) -> tuple[grpc.aio.Channel,
                                                            pb_grpc.EmbeddingServiceStub]:
    """A channel with ``retry``'s policy and its stub. A local subchannel pool: its attempts
    are counted on its own subchannels (channelz), not on ones shared with other channels."""
    options = [*retry.channel_options(), ("grpc.use_local_subchannel_pool", 1)]
    channel = grpc.aio.insecure_channel(target, options=options)
    return channel, pb_grpc.EmbeddingServiceStub(channel)


@dataclass
class Problems:
    """The first few problems, verbatim, timed from ``t0`` (one event loop, no locks)."""

    t0: float = field(default_factory=time.monotonic)
    problems: list[str] = field(default_factory=list)
    prefix = ""

    def problem(self, text: str) -> None:
        if len(self.problems) < 20:
            self.problems.append(f"t={time.monotonic() - self.t0:.1f}s {self.prefix}{text}")


@dataclass
class Tally(Problems):
    """Everything the clients saw; shared by all clients."""

    requests: Counter[str] = field(default_factory=Counter)  # rpc -> request messages
    codes: Counter[tuple[str, str, bool]] = field(default_factory=Counter)  # rpc, code, valid
    answered: int = 0
    failures: Counter[str] = field(default_factory=Counter)  # code of a refused valid request
    wrong_code: int = 0
    corrupted: int = 0
    lost: int = 0
    stream_resumes: int = 0
    versions: Counter[int] = field(default_factory=Counter)  # version named by answers
    latencies: list[tuple[float, float, str]] = field(default_factory=list)  # t, s, rpc

    def outcome(self, rpc: str, exp: Expected, code: grpc.StatusCode, details: str = "") -> None:
        """Tally a request that got ``code`` (answers are tallied by ``answer``)."""
        valid = exp.code == OK
        self.requests[rpc] += 1
        self.codes[(rpc, code.name, valid)] += 1
        if valid and code != OK:
            self.failures[code.name] += 1
            if code == grpc.StatusCode.DEADLINE_EXCEEDED:
                self.lost += 1  # sent, and no answer came within the deadline
            self.problem(f"{rpc}: valid request got {code.name}: {details}")
        elif not valid and code != exp.code:
            self.wrong_code += 1
            self.problem(f"{rpc}: invalid ({exp.why}) got {code.name}, expected "
                         f"{exp.code.name}: {details}")

    def answer(self, rpc: str, exp: Expected, resp: Any, wrong: str | None, sent: float) -> None:
        """Tally an answer and the oracle's verdict on it."""
        now = time.monotonic()
        self.outcome(rpc, exp, OK)
        if exp.code != OK:
            return  # counted as wrong_code already
        self.answered += 1
        self.versions[int(resp.version)] += 1
        self.latencies.append((now - self.t0, now - sent, rpc))
        if wrong is not None:
            self.corrupted += 1
            self.problem(f"{rpc} {resp.request_id}: {wrong}")


class SoakClient:
    """One client: its own channel, random calls back to back (``run``), then ``close``."""

    def __init__(self, index: int, target: str, retry: RetryPolicy, oracle: Oracle,
                 maker: RequestMaker, tally: Tally, invalid_share: float) -> None:
        self.channel, self.stub = retry_channel(target, retry)
        self.index, self.oracle, self.maker, self.tally = index, oracle, maker, tally
        self.invalid_share = invalid_share
        self.n = 0

    def _rid(self) -> str:
        self.n += 1
        return f"c{self.index}-{self.n}"

    async def _unary(self, rpc: str, make: Any, make_bad: Any, call: Any, check: Any) -> None:
        bad = self.maker.rng.random() < self.invalid_share
        req, exp = (make_bad if bad else make)(self._rid())
        sent = time.monotonic()
        try:
            resp = await call(req, timeout=_DEADLINE_S)
        except grpc.RpcError as e:
            self.tally.outcome(rpc, exp, e.code(), str(e.details()))
            return
        self.tally.answer(rpc, exp, resp, check(resp, exp) if exp.code == OK else None, sent)

    async def embed(self) -> None:
        await self._unary("Embed", self.maker.embed, self.maker.bad_embed, self.stub.Embed,
                          self.oracle.check_embed)

    async def batch(self) -> None:
        await self._unary("EmbedBatch", self.maker.batch, self.maker.bad_batch,
                          self.stub.EmbedBatch, self.oracle.check_batch)

    async def stream(self) -> None:
        """1..8 requests on one stream; with invalid_share, the last one is invalid."""
        pairs = [self.maker.embed(self._rid()) for _ in range(self.maker.rng.randint(1, 8))]
        if self.maker.rng.random() < self.invalid_share:
            pairs[-1] = self.maker.bad_embed(self._rid())
        resumes = 0
        while pairs:
            done, code, details = await self._one_stream(pairs)
            pairs = pairs[done:]
            if code == OK:
                if pairs:  # the stream ended cleanly without answering everything
                    self.tally.lost += len(pairs)
                    self.tally.problem(f"EmbedStream ended OK with {len(pairs)} unanswered")
                return
            if code == grpc.StatusCode.UNAVAILABLE and done > 0 and resumes < _MAX_RESUMES:
                # Broken after an answer (a worker killed): gRPC will not retry it; we
                # resume, the invalid one too (it was never read, so it has no status yet).
                resumes += 1
                self.tally.stream_resumes += 1
                continue
            if pairs and pairs[0][1].code != OK:  # the invalid one: its status ends it
                self.tally.outcome("EmbedStream", pairs[0][1], code, details)
                return
            for _, exp in pairs:
                self.tally.outcome("EmbedStream", exp, code, details)
            return

    async def _one_stream(self, pairs: Sequence[tuple[pb.EmbedRequest, Expected]]
                          ) -> tuple[int, grpc.StatusCode, str]:
        """Send ``pairs`` on a new stream; returns (answers tallied, final code, details)."""
        sent = time.monotonic()
        call = self.stub.EmbedStream(iter([req for req, _ in pairs]), timeout=_DEADLINE_S)
        done = 0
        try:
            async for resp in call:
                exp = pairs[done][1]
                wrong = self.oracle.check_embed(resp, exp) if exp.code == OK else None
                self.tally.answer("EmbedStream", exp, resp, wrong, sent)
                done += 1
        except grpc.RpcError as e:
            return done, e.code(), str(e.details())
        return done, OK, ""

    async def run(self, until: float, rng: random.Random) -> None:
        """Random calls (Embed 2 : EmbedBatch 1 : EmbedStream 1) until ``until``."""
        while time.monotonic() < until:
            await rng.choices((self.embed, self.batch, self.stream), weights=(2, 1, 1))[0]()

    async def close(self) -> None:
        """Close the channel (sample an ``AttemptCounter`` before: its counts go with it)."""
        await self.channel.close()


class AttemptCounter:
    """Calls and attempts of this process's open channels to one target, from channelz.

    A channel counts each call once; its subchannels count each attempt that reached a
    connection, so attempts - calls is the number of retries sent. A subchannel's counts
    go when its connection does (a killed worker), so ``sample`` keeps the largest count
    seen per subchannel id: call it often, and right before killing a worker. Attempts
    that failed before any connection existed (while reconnecting) are retried by gRPC
    but counted on no subchannel: the figure is a lower bound. grpc's Python channelz
    API is the private cygrpc one (what the grpcio-channelz servicer calls).
    """

    def __init__(self, target: str) -> None:
        self.target = target
        self.calls = 0
        self._subchannels: dict[int, int] = {}  # id -> largest callsStarted seen

    def sample(self) -> None:
        from grpc._cython import cygrpc

        calls = 0
        for ch in json.loads(cygrpc.channelz_get_top_channels(0)).get("channel", []):
            if not ch["data"].get("target", "").endswith(self.target):
                continue
            calls += int(ch["data"].get("callsStarted", 0))
            for ref in ch.get("subchannelRef", []):
                sid = int(ref["subchannelId"])
                sub = json.loads(cygrpc.channelz_get_subchannel(sid))["subchannel"]["data"]
                got = int(sub.get("callsStarted", 0))
                self._subchannels[sid] = max(got, self._subchannels.get(sid, 0))
        self.calls = max(self.calls, calls)

    @property
    def attempts(self) -> int:
        return sum(self._subchannels.values())

    @property
    def retries(self) -> int:
        return self.attempts - self.calls

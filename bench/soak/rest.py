"""The soak's REST traffic: OIP infer over HTTP beside the gRPC clients, and a REST slow reader.

``RestClient`` sends the soak's random requests (and a share of invalid ones: 400) as
``POST /v2/models/soak/infer`` with binary output on one keep-alive session; every answer is
checked bit for bit by the oracle and tallied under ``REST infer``. ``RestSlowReader``: one
connection with a 4 KiB receive buffer sends a ``--rest-slow-batch`` x T request on the
wide model (8 MiB answers), reads nothing for ``--slow-hold`` seconds, then reads and checks
it; the server holds the answer (its in-flight slot, its bytes in ``--max-unsent-bytes``)
until its last byte has left. Infer is idempotent: a request whose connection broke (the
kill) or that met a draining worker (503) is sent again on a new connection.
"""

from __future__ import annotations

import asyncio
import json
import random
import re
import socket
import time
from types import SimpleNamespace
from typing import Any

import aiohttp
import grpc
import torch

from bench.harness.load import WIRE_NAMES
from bench.soak.oracle import Oracle
from bench.soak.requests import MODEL, Expected, Item, RequestMaker
from bench.soak.slow import WIDE_MODEL, WIDE_VOCAB, SlowTally, first_wait
from bench.soak.traffic import Tally
from genproto.embedding.v1 import embedding_pb2 as pb

__all__ = ["RestClient", "RestSlowReader", "rest_body"]

RPC = "REST infer"
_DEADLINE_S = 30.0
_MAX_TRIES = 4
_COMPOSES: dict[int, str] = {pb.COMPOSE_TOKEN_PLUS_POSITION: "token_plus_position",
                             pb.COMPOSE_TOKEN_ONLY: "token_only",
                             pb.COMPOSE_POSITION_ONLY: "position_only"}
_TRUNCATES: dict[int, str] = {pb.TRUNCATE_NONE: "none", pb.TRUNCATE_RIGHT: "right",
                              pb.TRUNCATE_LEFT: "left"}
_CODES = {200: grpc.StatusCode.OK, 400: grpc.StatusCode.INVALID_ARGUMENT,
          404: grpc.StatusCode.NOT_FOUND, 429: grpc.StatusCode.RESOURCE_EXHAUSTED,
          503: grpc.StatusCode.UNAVAILABLE, 504: grpc.StatusCode.DEADLINE_EXCEEDED}


def rest_body(items: tuple[Item, ...], exp: Expected, request_id: str) -> bytes:
    """The JSON request for ``items`` (all ids, or one text) under ``exp``'s options."""
    if items[0].text is not None:
        tensor: dict[str, Any] = {"name": "text", "datatype": "BYTES", "shape": [1],
                                  "data": [items[0].text]}
    else:
        ids = [list(item.ids or ()) for item in items]
        tensor = {"name": "input_ids", "datatype": "INT64", "shape": [len(ids), len(ids[0])],
                  "data": ids}
    return json.dumps({
        "id": request_id, "inputs": [tensor],
        "parameters": {"start_position": items[0].start, "compose": _COMPOSES[exp.compose],
                       "truncate": _TRUNCATES[exp.truncate],
                       "allow_special_tokens": exp.allow_special},
        "outputs": [{"name": "embeddings", "parameters": {
            "binary_data": True, "datatype": WIRE_NAMES[exp.dtype]}}]}).encode()


def check_answer(oracle: Oracle, body: bytes, header_length: int, exp: Expected
                 ) -> tuple[int, str | None]:
    """(the version it names, None or what is wrong) for a binary-embeddings answer."""
    header = json.loads(body[:header_length])
    params = header.get("parameters", {})
    v = oracle.versions.get(params.get("checkpoint_id", ""))
    version = int(header.get("model_version", 0))
    if v is None or header.get("model_name") != oracle.model or version != v.version:
        return version, f"answer names {header.get('model_name')}/{version}, not a version " \
                        f"published as such"
    parts = [oracle.fit(item, exp.truncate, exp.allow_special) for item in exp.items]
    if params.get("truncated_tokens") != sum(cut for _, cut in parts) \
            or params.get("start_position") != exp.items[0].start:
        return version, f"start/truncated {params.get('start_position')}/" \
                        f"{params.get('truncated_tokens')}"
    T = max(len(ids) for ids, _ in parts)
    want = torch.zeros((len(parts), T, v.token_table.shape[1]),
                       dtype=oracle.rows(v, [0], 0, exp.compose, exp.dtype).dtype)
    for b, ((ids, _), item) in enumerate(zip(parts, exp.items)):
        want[b, :len(ids)] = oracle.rows(v, ids, item.start, exp.compose, exp.dtype)
    (emb,) = [o for o in header["outputs"] if o["name"] == "embeddings"]
    got = body[header_length:header_length + emb["parameters"]["binary_data_size"]]
    if emb["shape"] != list(want.shape) or got != want.view(torch.uint8).numpy().tobytes():
        return version, f"rows {emb['shape']} differ from version {v.version}'s tables"
    return version, None


class RestClient:
    """One REST client: its own session, random infer requests back to back."""

    def __init__(self, index: int, port: int, oracle: Oracle, maker: RequestMaker,
                 tally: Tally, invalid_share: float) -> None:
        self.url = f"http://127.0.0.1:{port}/v2/models/{MODEL}/infer"
        self.index, self.oracle, self.maker, self.tally = index, oracle, maker, tally
        self.invalid_share = invalid_share
        self.session: aiohttp.ClientSession | None = None
        self.n = self.retries = 0

    async def run(self, until: float) -> None:
        self.session = aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(_DEADLINE_S))
        while time.monotonic() < until:
            await self.one(self.session)

    async def one(self, session: aiohttp.ClientSession) -> None:
        self.n += 1
        rid = f"r{self.index}-{self.n}"
        _, exp = self.maker.embed(rid)
        body = rest_body(exp.items, exp, rid)
        if self.maker.rng.random() < self.invalid_share:
            item = Item((1, self.maker.vocab + 5), None, 0)
            exp = Expected(grpc.StatusCode.INVALID_ARGUMENT, (item,), why="id past vocab")
            body = rest_body(exp.items, Expected(grpc.StatusCode.OK, exp.items), rid)
        sent = time.monotonic()
        status, data, split = 0, b"", 0
        for _ in range(_MAX_TRIES):
            try:
                async with session.post(self.url, data=body) as reply:
                    status, data = reply.status, await reply.read()
                    split = int(reply.headers.get("Inference-Header-Content-Length", 0))
            except (TimeoutError, aiohttp.ClientError) as e:
                status, data = 0, str(e).encode()
            if status not in (0, 503):
                break
            self.retries += 1  # the worker went away or drains: infer is idempotent
            await asyncio.sleep(0.2)
        code = _CODES.get(status, grpc.StatusCode.UNKNOWN if status else
                          grpc.StatusCode.DEADLINE_EXCEEDED)
        if code != grpc.StatusCode.OK:
            self.tally.outcome(RPC, exp, code, data[:200].decode("utf-8", "replace"))
            return
        version, wrong = (check_answer(self.oracle, data, split, exp)
                          if exp.code == grpc.StatusCode.OK else (0, None))
        self.tally.answer(RPC, exp, SimpleNamespace(version=version, request_id=rid), wrong,
                          sent)

    async def close(self) -> None:
        if self.session is not None:
            await self.session.close()


class RestSlowReader:
    """Stretches of one large REST answer held unread, then read and checked."""

    def __init__(self, index: int, port: int, oracle: Oracle, tally: SlowTally,
                 batch: int, tokens: int, hold_s: float, rng: random.Random) -> None:
        self.index, self.port, self.oracle, self.tally = index, port, oracle, tally
        self.batch, self.tokens, self.hold_s, self.rng = batch, tokens, hold_s, rng
        self.n = 0

    async def run(self, until: float) -> None:
        """Stretches back to back, after ``first_wait``, while one can still finish before
        ``until``."""
        await first_wait(until)
        while time.monotonic() + self.hold_s + 10 < until:
            await asyncio.to_thread(self.stretch)
            await asyncio.sleep(1.0)

    def stretch(self) -> None:
        """One request held unread for ``hold_s``, then its answer read and checked."""
        t = self.tally
        self.n += 1
        items = tuple(Item(tuple(self.rng.randrange(WIDE_VOCAB) for _ in range(self.tokens)),
                           None, 0) for _ in range(self.batch))
        exp = Expected(grpc.StatusCode.OK, items)
        body = rest_body(items, exp, f"rslow{self.index}-{self.n}")
        rec = t.begin(f"rest{self.index}", 1)
        status, data, split, why, hold = 0, b"", 0, "", self.hold_s
        for _ in range(_MAX_TRIES):
            try:
                status, data, split = self._exchange(body, hold, rec)
                break
            except OSError as e:  # the worker kill broke the connection: send it again
                why = str(e)
                rec["resumes"] += 1
                t.resumes += 1
                hold = 0.0  # a resumed request reads at once
        if status == 200:
            t.answered += 1
            rec["answered"] = 1
            _, wrong = check_answer(self.oracle, data, split, exp)
            if wrong is not None:
                t.corrupted += 1
                t.problem(f"REST slow reader: {wrong}")
        else:
            t.failures[_CODES.get(status, grpc.StatusCode.UNAVAILABLE).name] += 1
            t.problem(f"REST slow reader got {status}: {why or data[:200]!r}")
        t.end(rec)

    def _exchange(self, body: bytes, hold: float, rec: dict[str, Any]
                  ) -> tuple[int, bytes, int]:
        """Send ``body`` on a new connection, read nothing for ``hold`` s, then the reply:
        (status, body, Inference-Header-Content-Length)."""
        with socket.socket() as s:
            s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
            s.settimeout(_DEADLINE_S + hold)
            s.connect(("127.0.0.1", self.port))
            s.sendall(f"POST /v2/models/{WIDE_MODEL}/infer HTTP/1.1\r\nHost: x\r\n"
                      f"Content-Length: {len(body)}\r\n\r\n".encode() + body)
            time.sleep(hold)  # not reading: the server holds the answer
            self.tally.held(rec, hold)
            data = b""
            while b"\r\n\r\n" not in data:
                chunk = s.recv(1 << 16)
                if not chunk:
                    raise ConnectionError("closed before the answer's headers")
                data += chunk
            head, _, rest = data.partition(b"\r\n\r\n")
            length = re.search(rb"(?im)^content-length: (\d+)", head)
            split = re.search(rb"(?im)^inference-header-content-length: (\d+)", head)
            chunks, got = [rest], len(rest)
            total = int(length.group(1)) if length else 0
            while got < total:
                chunk = s.recv(1 << 20)
                if not chunk:
                    raise ConnectionError(f"closed after {got} of {total} body bytes")
                chunks.append(chunk)
                got += len(chunk)
        return (int(head.split(b" ", 2)[1]), b"".join(chunks),
                int(split.group(1)) if split else 0)

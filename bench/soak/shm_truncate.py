"""The soak's shared-memory scenario: objects truncated under load by their owner.

``--shm-clients`` good clients each own a region and send shared-memory ``Embed`` requests
into it, every answer checked bit for bit against ``tables(seed)``; one careless client
shrinks, zeroes or unlinks its own object while its requests are in flight, then registers
a new one. Passed: no good answer lost or corrupted, every careless answer OK,
FAILED_PRECONDITION or NOT_FOUND (while it re-registers).
"""

from __future__ import annotations

import asyncio
import os
import random
import secrets
import time
from dataclasses import dataclass, field
from pathlib import Path

import grpc
import grpc.aio
import torch

from bench.harness.checkpoint import VOCAB_SIZE, random_tables, write_random
from genproto.embedding.v1 import embedding_pb2 as pb
from genproto.embedding.v1 import embedding_pb2_grpc as pb_grpc

__all__ = ["MAX_SEQ_LEN", "MODEL", "VOCAB", "Outcome", "run_truncate_scenario", "tables",
           "write_model"]

VOCAB, DIM, MAX_SEQ_LEN, MODEL = VOCAB_SIZE, 64, 256, "soak-shm"
REGION_BYTES = MAX_SEQ_LEN * DIM * 4


def tables(seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The scenario model's (token_table, position_table)."""
    token_table, position_table = random_tables(VOCAB, DIM, MAX_SEQ_LEN, seed)
    assert position_table is not None
    return token_table, position_table


def write_model(models: Path, seed: int) -> None:
    """``models/soak-shm/1`` with ``tables(seed)`` and GPT-2's tokenizer."""
    write_random(models / MODEL / "1", VOCAB, DIM, MAX_SEQ_LEN, seed, tokenizer=True)


@dataclass
class Outcome:
    """Counts of one scenario run."""

    good_ok: int = 0
    lost: int = 0  # a good client's request that failed
    corrupted: int = 0  # a good client's rows that were not the tables'
    careless: dict[str, int] = field(default_factory=dict)  # status name -> count
    truncations: int = 0
    errors: list[str] = field(default_factory=list)  # first few unexpected details

    @property
    def passed(self) -> bool:
        """No good answer lost or corrupted; every careless answer an allowed status."""
        allowed = {"OK", "FAILED_PRECONDITION", "NOT_FOUND"}
        return (self.lost == 0 and self.corrupted == 0 and self.good_ok > 0
                and set(self.careless) <= allowed and self.truncations > 0)

    def error(self, text: str, always: bool = False) -> None:
        if always or len(self.errors) < 5:
            self.errors.append(text)


class _Object:
    """A /dev/shm object this process never maps (read with pread), and its registration."""

    def __init__(self, name: str) -> None:
        self.key = f"/embed-soak-{secrets.token_hex(6)}"
        self.path = Path("/dev/shm") / self.key[1:]
        fd = os.open(self.path, os.O_CREAT | os.O_EXCL | os.O_RDWR, 0o600)
        os.ftruncate(fd, REGION_BYTES)
        os.close(fd)
        self.register = pb.RegisterSharedMemoryRequest(region=pb.SharedMemoryRegion(
            name=name, key=self.key, byte_size=REGION_BYTES))
        self.unregister = pb.UnregisterSharedMemoryRequest(name=name)

    def read(self, n: int) -> bytes:
        with self.path.open("rb") as f:
            return f.read(n)


def _request(rng: random.Random, region: str) -> tuple[pb.EmbedRequest, list[int], int]:
    T = rng.randint(1, MAX_SEQ_LEN // 2)
    start = rng.randint(0, MAX_SEQ_LEN - T)
    ids = [rng.randrange(VOCAB) for _ in range(T)]
    return (pb.EmbedRequest(model=MODEL, token_ids=pb.TokenIds(ids=ids), start_position=start,
                            output=pb.SharedMemoryOutput(region=region)), ids, start)


async def _good(stub: pb_grpc.EmbeddingServiceStub, name: str, seed: int, until: float,
                expect: tuple[torch.Tensor, torch.Tensor], out: Outcome) -> None:
    obj, rng = _Object(name), random.Random(seed)
    token_table, position_table = expect
    try:
        await stub.RegisterSharedMemory(obj.register)
        while time.monotonic() < until:
            request, ids, start = _request(rng, name)
            try:
                await stub.Embed(request, timeout=30)
            except grpc.aio.AioRpcError as e:
                out.lost += 1
                out.error(f"{name}: {e.code().name}: {e.details()}")
                continue
            want = (token_table[torch.tensor(ids)] + position_table[start: start + len(ids)])
            if obj.read(len(ids) * DIM * 4) != want.numpy().tobytes():
                out.corrupted += 1
            else:
                out.good_ok += 1
        await stub.UnregisterSharedMemory(obj.unregister)
    except grpc.aio.AioRpcError as e:  # its region is gone: the server lost state
        out.lost += 1
        out.error(f"{name}: {e.code().name}: {e.details()}", always=True)
    finally:
        obj.path.unlink(missing_ok=True)


async def _careless(stub: pb_grpc.EmbeddingServiceStub, seed: int, until: float,
                    out: Outcome) -> None:
    rng = random.Random(seed)

    async def one(region: str) -> None:
        try:
            await stub.Embed(_request(rng, region)[0], timeout=30)
            code = "OK"
        except grpc.aio.AioRpcError as e:
            code = e.code().name
            if code not in ("FAILED_PRECONDITION", "NOT_FOUND"):
                out.error(f"careless: {code}: {e.details()}")
        out.careless[code] = out.careless.get(code, 0) + 1

    n = 0
    while time.monotonic() < until:
        name = f"careless-{n}"
        obj = _Object(name)
        n += 1
        try:
            await stub.RegisterSharedMemory(obj.register)
            inflight = [asyncio.ensure_future(one(name)) for _ in range(rng.randint(1, 8))]
            await asyncio.sleep(rng.uniform(0, 0.005))  # while they are queued or writing
            how = rng.choice(("shrink", "zero", "unlink"))
            if how == "unlink":
                obj.path.unlink()
            else:
                os.truncate(obj.path, 8 if how == "shrink" else 0)
            out.truncations += 1
            inflight += [asyncio.ensure_future(one(name)) for _ in range(2)]  # after it
            await asyncio.gather(*inflight)
            await stub.UnregisterSharedMemory(obj.unregister)
        except grpc.aio.AioRpcError as e:  # a registration the server forgot or refused
            key = f"register/unregister {e.code().name}"
            out.careless[key] = out.careless.get(key, 0) + 1
            out.error(f"careless: {key}: {e.details()}")
        finally:
            obj.path.unlink(missing_ok=True)


async def run_truncate_scenario(target: str, seconds: float, clients: int, seed: int,
                                table_seed: int) -> Outcome:
    """Good clients and one careless client against ``target`` for ``seconds``; the model
    ``soak-shm`` must be served from ``tables(table_seed)``."""
    out, until, expect = Outcome(), time.monotonic() + seconds, tables(table_seed)
    channels = [grpc.aio.insecure_channel(target) for _ in range(clients + 1)]
    try:
        stubs = [pb_grpc.EmbeddingServiceStub(ch) for ch in channels]
        await asyncio.gather(
            *(_good(stubs[i], f"good-{i}", seed + i, until, expect, out) for i in range(clients)),
            _careless(stubs[-1], seed + 1000, until, out))
    finally:
        for ch in channels:
            await ch.close()
    return out

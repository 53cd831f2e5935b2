"""Hot reload under load: versions published and a bad one dropped in while requests flow.

Every answer must be exact for the version it names (rows from that version's own
tables, checkpoint_id that version's manifest hash), each client's versions must never go
backwards, the bad version must be refused and never answered, and no request may fail.
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import os
import random
import time
from pathlib import Path

import grpc
import grpc.aio
import pytest
import torch

from genproto.embedding.v1 import embedding_pb2 as pb
from genproto.embedding.v1 import embedding_pb2_grpc as pb_grpc
from service.format.manifest import EMBEDDINGS_FILE, MANIFEST_FILE
from service.local import ServerHandle
from tests.tiny_model import MAX_SEQ_LEN, VOCAB_SIZE, MakeCheckpoint, start, tiny_tables

SEEDS = {1: 10, 2: 20, 3: 30, 4: 40}  # version -> table seed
CLIENTS = 4


def _expected(version: int, ids: list[int], start_position: int, dtype: int) -> bytes:
    token_table, position_table = tiny_tables(SEEDS[version])
    rows = token_table[torch.tensor(ids)] + position_table[start_position:start_position
                                                           + len(ids)]  # (T, C), fp32 add
    out = rows.to(torch.bfloat16 if dtype == pb.DTYPE_BFLOAT16 else torch.float32)
    return out.contiguous().view(torch.uint8).numpy().tobytes()


Answer = tuple[int, float, int, str, list[tuple[list[int], int]], int, bytes]


class _Load:
    """CLIENTS coroutines calling Embed, EmbedBatch and EmbedStream until told to stop."""

    def __init__(self, target: str) -> None:
        self.channel = grpc.aio.insecure_channel(target)
        self.stub = pb_grpc.EmbeddingServiceStub(self.channel)
        self.stop = False
        # client, time, version, checkpoint_id, [(ids, start)], dtype, tensor bytes
        self.answers: list[Answer] = []
        self.errors: list[str] = []

    def _seq(self, rng: random.Random) -> tuple[list[int], int]:
        start = rng.randrange(MAX_SEQ_LEN // 2)
        return [rng.randrange(VOCAB_SIZE) for _ in range(rng.randint(1, 12))], start

    async def client(self, index: int) -> None:
        rng = random.Random(index)
        while not self.stop:
            dtype = rng.choice((pb.DTYPE_FLOAT32, pb.DTYPE_BFLOAT16))
            kind = rng.randrange(3)
            try:
                if kind == 0:
                    ids, s = self._seq(rng)
                    r = await self.stub.Embed(pb.EmbedRequest(
                        token_ids=pb.TokenIds(ids=ids), start_position=s, dtype=dtype),
                        timeout=20)
                    self._keep(index, r.version, r.checkpoint_id, [(ids, s)], dtype, r)
                elif kind == 1:
                    seqs = [self._seq(rng) for _ in range(rng.randint(1, 4))]
                    r = await self.stub.EmbedBatch(pb.EmbedBatchRequest(
                        inputs=[pb.EmbedInput(token_ids=pb.TokenIds(ids=i), start_position=s)
                                for i, s in seqs], dtype=dtype), timeout=20)
                    self._keep(index, r.version, r.checkpoint_id, seqs, dtype, r)
                else:
                    seqs = [self._seq(rng) for _ in range(rng.randint(1, 4))]
                    reqs = [pb.EmbedRequest(token_ids=pb.TokenIds(ids=i), start_position=s,
                                            dtype=dtype) for i, s in seqs]
                    got = [r async for r in self.stub.EmbedStream(iter(reqs), timeout=20)]
                    assert len(got) == len(seqs), "stream ended with answers missing"
                    for r, seq in zip(got, seqs):
                        self._keep(index, r.version, r.checkpoint_id, [seq], dtype, r)
            except (grpc.RpcError, AssertionError) as e:
                self.errors.append(f"client {index}: {e!r}")

    def _keep(self, index: int, version: int, checkpoint_id: str,
              seqs: list[tuple[list[int], int]], dtype: int, resp: object) -> None:
        data = resp.embeddings.data  # type: ignore[attr-defined]
        self.answers.append((index, time.monotonic(), version, checkpoint_id, seqs, dtype,
                             data))

    def versions_since(self, t: float) -> set[int]:
        return {a[2] for a in self.answers if a[1] >= t}


async def _wait(predicate, timeout: float = 5.0) -> None:  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, "condition not met in time"
        await asyncio.sleep(0.02)


async def _scenario(handle: ServerHandle, repo: Path, staging: Path,
                    make_checkpoint: MakeCheckpoint, caplog: pytest.LogCaptureFixture) -> _Load:
    load = _Load(handle.target)
    tasks = [asyncio.create_task(load.client(i)) for i in range(CLIENTS)]
    try:
        await _wait(lambda: len(load.answers) >= 20)
        await asyncio.to_thread(make_checkpoint, repo, version=2, seed=SEEDS[2])
        await _wait(lambda: 2 in {a[2] for a in load.answers})
        bad = await asyncio.to_thread(make_checkpoint, staging, version=3, seed=SEEDS[3])
        data = bytearray((bad / EMBEDDINGS_FILE).read_bytes())
        data[len(data) // 2] ^= 0xFF  # one byte: the manifest's sha256 no longer matches
        (bad / EMBEDDINGS_FILE).write_bytes(bytes(data))
        os.rename(bad, repo / "tiny" / "3")
        await _wait(lambda: any("refused model=tiny version=3" in r.getMessage()
                                for r in caplog.records))
        t_refused = time.monotonic()
        n = len(load.answers)
        await _wait(lambda: len(load.answers) >= n + 20)  # v2 keeps serving meanwhile
        assert load.versions_since(t_refused) == {2}
        await asyncio.to_thread(make_checkpoint, repo, version=4, seed=SEEDS[4])
        await _wait(lambda: 4 in {a[2] for a in load.answers})
        n = len(load.answers)
        await _wait(lambda: len(load.answers) >= n + 20)
    finally:
        load.stop = True
        await asyncio.gather(*tasks)
        await load.channel.close()
    return load


def test_versions_swap_under_load_every_answer_exact(tmp_path: Path,
                                                     make_checkpoint: MakeCheckpoint,
                                                     caplog: pytest.LogCaptureFixture) -> None:
    repo, staging = tmp_path / "repo", tmp_path / "staging"
    make_checkpoint(repo, version=1, seed=SEEDS[1])
    handle = start(repo, poll_seconds=0.05)
    try:
        with caplog.at_level(logging.INFO, logger="service.engine.repository"):
            load = asyncio.run(_scenario(handle, repo, staging, make_checkpoint, caplog))
    finally:
        handle.stop()
    assert load.errors == []
    ids_of = {v: hashlib.sha256((repo / "tiny" / str(v) / MANIFEST_FILE).read_bytes())
              .hexdigest() for v in (1, 2, 3, 4)}
    assert {a[2] for a in load.answers} == {1, 2, 4}  # all served under load; 3 never
    for index, _, version, checkpoint_id, seqs, dtype, data in load.answers:
        assert checkpoint_id == ids_of[version]
        want = b"".join(_expected(version, ids, s, dtype) for ids, s in seqs)
        assert data == want, f"client {index}: rows differ from version {version}'s tables"
    for index in range(CLIENTS):  # one client's calls are sequential: never an older version
        versions = [a[2] for a in load.answers if a[0] == index]
        assert versions == sorted(versions)
    refused = [r.getMessage() for r in caplog.records if "refused model=tiny" in r.getMessage()]
    assert len(refused) == 1  # refused once, remembered, not retried every poll
    assert "version=3" in refused[0]
    assert "does not match manifest" in refused[0]

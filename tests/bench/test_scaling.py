"""The scaling suite's packed, unary and stream rounds each deliver every row."""

from __future__ import annotations

import asyncio

import grpc

from bench.suites.scaling import packed_round, stream_round, unary_round
from service.local import ServerHandle


def test_each_round_returns_every_row(server: ServerHandle) -> None:
    async def rounds() -> list[int]:
        async with grpc.aio.insecure_channel(server.target) as channel:
            seqs = [[i, i + 1, i + 2] for i in range(64)]
            return [await how(channel, seqs, "tiny")
                    for how in (packed_round, unary_round, stream_round)]

    assert asyncio.run(rounds()) == [192, 192, 192]

"""AsyncEmbeddingClient against a real server (each test runs its own event loop)."""

from __future__ import annotations

import asyncio
import re
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import TypeVar

import grpc
import numpy as np
import pytest

from client import AsyncEmbeddingClient, EmbeddingError
from service.local import ServerHandle

HELLO_WORLD = [31373, 995]
R = TypeVar("R")


def run(target: str, body: Callable[[AsyncEmbeddingClient], Awaitable[R]]) -> R:
    async def main() -> R:
        async with AsyncEmbeddingClient(target, timeout=30) as c:
            return await body(c)

    return asyncio.run(main())


def test_async_embed_is_exact(server: ServerHandle, reference, tiny_checkpoint) -> None:
    e = run(server.target, lambda c: c.embed("hello world", request_id="a1"))
    assert e.token_ids == HELLO_WORLD
    assert e.array.shape == (2, 16)
    assert np.array_equal(e.array, reference(HELLO_WORLD))
    assert (e.model, e.version, e.request_id) == ("tiny", 1, "a1")
    assert e.checkpoint_id == tiny_checkpoint.checkpoint_id


def test_async_concurrent_embeds(server: ServerHandle, reference) -> None:
    async def body(c: AsyncEmbeddingClient) -> list:
        return await asyncio.gather(*(c.embed(ids=[i, i + 1], start_position=i)
                                      for i in range(20)))

    out = run(server.target, body)
    for i, e in enumerate(out):
        assert e.token_ids == [i, i + 1]
        assert np.array_equal(e.array, reference([i, i + 1], i))


def test_async_batch_and_bfloat16(server: ServerHandle, reference) -> None:
    out = run(server.target, lambda c: c.embed_batch(["hello world", [9]], dtype="bfloat16"))
    assert [e.token_ids for e in out] == [HELLO_WORLD, [9]]
    import torch  # the oracle only; the client never imports torch

    for e in out:
        want = torch.from_numpy(reference(e.token_ids)).to(torch.bfloat16).float().numpy()
        assert (e.wire_dtype, e.array.dtype) == ("bfloat16", np.float32)
        assert np.array_equal(e.array, want)


def test_async_stream_from_an_async_iterable_keeps_order(server: ServerHandle,
                                                         reference) -> None:
    reqs = [[n] * n for n in (4, 1, 9, 2, 6)]

    async def source() -> AsyncIterator[list[int]]:
        for r in reqs:
            await asyncio.sleep(0)
            yield r

    async def body(c: AsyncEmbeddingClient) -> list:
        return [e async for e in c.embed_stream(source(), compose="token")]

    out = run(server.target, body)
    assert [e.token_ids for e in out] == reqs
    for e, ids in zip(out, reqs):
        assert np.array_equal(e.array, reference(ids, 0, "token"))


def test_async_tokenize_detokenize_and_info(server: ServerHandle) -> None:
    async def body(c: AsyncEmbeddingClient) -> tuple:
        return (await c.tokenize("hello world"), await c.detokenize(HELLO_WORLD),
                await c.model_info("tiny"), await c.list_models())

    tokens, text, info, models = run(server.target, body)
    assert tokens == (HELLO_WORLD, [b"hello", b" world"])
    assert text == "hello world"
    assert (info.model, info.dim, info.vocab_size) == ("tiny", 16, 50257)
    assert sorted(m.model for m in models) == ["rope", "tiny"]


def test_async_errors_are_typed(server: ServerHandle) -> None:
    with pytest.raises(EmbeddingError) as info:
        run(server.target, lambda c: c.embed(ids=[1, 2, 99999]))
    assert info.value.code == grpc.StatusCode.INVALID_ARGUMENT
    # The field path is the server's wording; the client must keep code, index and range.
    assert re.fullmatch(r"INVALID_ARGUMENT: \S*token_ids\S*\[2\]=99999 is out of range "
                        r"\[0, 50257\).*", str(info.value))
    with pytest.raises(EmbeddingError) as info:
        run("127.0.0.1:1", lambda c: c.embed("x"))
    assert info.value.code == grpc.StatusCode.UNAVAILABLE
    assert info.value.unreachable


def test_async_stream_closed_early_is_cancelled(server: ServerHandle) -> None:
    async def endless() -> AsyncIterator[list[int]]:
        n = 0
        while True:
            n += 1
            await asyncio.sleep(0)
            yield [n]

    async def body(c: AsyncEmbeddingClient) -> tuple[list[int], list[int]]:
        stream = c.embed_stream(endless())
        first = await anext(stream)
        await stream.aclose()  # must return, not wait on the endless request source
        return first.token_ids, (await c.embed("hello world")).token_ids

    assert run(server.target, body) == ([1], HELLO_WORLD)

"""The transport ceilings: what grpc.aio and aiohttp in Python move with no work of our own
(docs/performance.md). gRPC answers an ``EmbedResponse`` of the service's size, serialized
once per (T, dtype); REST reads the body and answers the service's captured response.

    python -m bench.servers.ceiling --port N --dim C [--http-port M --captured DIR]
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
from aiohttp import web

from bench.servers.host import (
    Captured,
    reference_args,
    reply_fields,
    reply_handler,
    respond,
    serve_forever,
)
from genproto.embedding.v1 import embedding_pb2 as pb

__all__ = ["CeilingPayloads", "main"]

_ITEMSIZE: dict[int, int] = {pb.DTYPE_FLOAT32: 4, pb.DTYPE_FLOAT16: 2, pb.DTYPE_BFLOAT16: 2}


class CeilingPayloads:
    """Serialized EmbedResponses keyed by (T, dtype), built on first use."""

    def __init__(self, dim: int, seed: int = 0) -> None:
        self.dim = dim
        self._rng = np.random.default_rng(seed)
        self._cache: dict[tuple[int, int], bytes] = {}

    def reply(self, request: pb.EmbedRequest) -> bytes:
        """The precomputed reply matching ``request``'s T and dtype."""
        key = (len(request.token_ids.ids), int(request.dtype))
        payload = self._cache.get(key)
        if payload is None:
            T, dtype = key
            resp = pb.EmbedResponse(embeddings=pb.Tensor(
                shape=[T, self.dim], dtype=dtype,  # type: ignore[arg-type]
                data=self._rng.bytes(T * self.dim * _ITEMSIZE[dtype])))
            resp.MergeFrom(reply_fields(T))
            payload = self._cache[key] = resp.SerializeToString()
        return payload


def main(argv: Sequence[str] | None = None) -> None:
    args = reference_args("python -m bench.servers.ceiling", argv)
    payloads = CeilingPayloads(args.dim)
    captured = Captured(args.captured) if args.captured else None

    async def rest(request: web.BaseRequest) -> web.StreamResponse:
        await request.read()
        assert captured is not None
        cell = captured.get(request.path)
        return await respond(request, cell.body, cell.headers)

    serve_forever("ceiling", args.port, [reply_handler("embedding.v1.EmbeddingService",
                                                       payloads.reply)],
                  args.http_port, rest if captured else None)


if __name__ == "__main__":
    main()

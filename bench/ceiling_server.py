"""Transport ceiling: EmbeddingService.Embed/EmbedStream answering with precomputed bytes.

The reply for each (T, dtype) is a real ``EmbedResponse`` of the service's size, serialized
once; the handler only parses the request and hands gRPC the bytes. What this server
sustains is what grpc.aio in Python can move, with no lookup, no encoding and no copy of
our own: the service can approach it, not pass it.

Run as ``python -m bench.ceiling_server --port N --dim C --ts 16,128 --dtypes float32``.
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence

import grpc
import numpy as np

from bench.backend_host import reply_handler, serve_forever
from bench.config import DTYPE_BYTES
from genproto.embedding.v1 import embedding_pb2 as pb

__all__ = ["CeilingPayloads", "main"]

_DTYPE_ENUM = {"float32": pb.DTYPE_FLOAT32, "float16": pb.DTYPE_FLOAT16,
               "bfloat16": pb.DTYPE_BFLOAT16}
_ENUM_DTYPE: dict[int, str] = {int(v): k for k, v in _DTYPE_ENUM.items()}


class CeilingPayloads:
    """Serialized EmbedResponses keyed by (T, dtype), built on first use."""

    def __init__(self, dim: int, seed: int = 0) -> None:
        self.dim = dim
        self._rng = np.random.default_rng(seed)
        self._cache: dict[tuple[int, int], bytes] = {}

    def get(self, T: int, dtype: int) -> bytes:
        """The reply for a request of T tokens in wire dtype ``dtype`` (a DType enum)."""
        key = (T, dtype)
        payload = self._cache.get(key)
        if payload is None:
            nbytes = T * self.dim * DTYPE_BYTES[_ENUM_DTYPE[dtype]]
            data = self._rng.integers(0, 256, nbytes, dtype=np.uint8).tobytes()
            # Same fields the service fills, so the sizes match to a few bytes.
            resp = pb.EmbedResponse(
                embeddings=pb.Tensor(shape=[T, self.dim], dtype=dtype, data=data),  # type: ignore[arg-type]
                token_ids=list(range(T)), model="bench", version=1, checkpoint_id="0" * 64,
                timing=pb.Timing(queue_ns=1, tokenize_ns=1, compute_ns=1, total_ns=1))
            payload = self._cache[key] = resp.SerializeToString()
        return payload

    def reply(self, request: pb.EmbedRequest) -> bytes:
        """The precomputed reply matching ``request``'s T and dtype."""
        return self.get(len(request.token_ids.ids), request.dtype)


def handler(payloads: CeilingPayloads) -> grpc.GenericRpcHandler:
    """Embed and EmbedStream of ``embedding.v1.EmbeddingService`` answering from ``payloads``."""
    return reply_handler("embedding.v1.EmbeddingService", payloads.reply)


def main(argv: Sequence[str] | None = None) -> None:
    """Precompute the replies for the given T and dtypes, then serve until SIGTERM."""
    p = argparse.ArgumentParser(prog="python -m bench.ceiling_server")
    p.add_argument("--port", type=int, required=True)
    p.add_argument("--dim", type=int, required=True)
    p.add_argument("--ts", default="")
    p.add_argument("--dtypes", default="float32")
    ns = p.parse_args(argv)
    payloads = CeilingPayloads(ns.dim)
    for t in (int(x) for x in ns.ts.split(",") if x):
        for name in ns.dtypes.split(","):
            payloads.get(t, _DTYPE_ENUM[name])
    serve_forever(ns.port, [handler(payloads)], "ceiling")


if __name__ == "__main__":
    main()

"""Light client for the embedding service: grpcio + protobuf + numpy, no torch, no tiktoken.

    from client import EmbeddingClient
    with EmbeddingClient("127.0.0.1:50051") as c:
        e = c.embed("hello world")  # e.array: (T, C) float32, read-only

AsyncEmbeddingClient has the same methods as coroutines; ``embedctl`` is the command line.
"""

from __future__ import annotations

from client.client import DEFAULT_TARGET, AsyncEmbeddingClient, EmbeddingClient
from client.codec import (
    COMPOSE,
    DTYPES,
    TRUNCATE,
    BatchOptions,
    Embedding,
    EmbeddingError,
    EmbedOptions,
    Timing,
    decode_tensor,
    embed_request,
)

__all__ = [
    "COMPOSE",
    "DEFAULT_TARGET",
    "DTYPES",
    "TRUNCATE",
    "AsyncEmbeddingClient",
    "BatchOptions",
    "EmbedOptions",
    "Embedding",
    "EmbeddingClient",
    "EmbeddingError",
    "Timing",
    "decode_tensor",
    "embed_request",
]

"""Light client for the embedding service: grpcio + protobuf + numpy, no torch, no tiktoken.

    from client import EmbeddingClient
    with EmbeddingClient("127.0.0.1:50051") as c:
        e = c.embed("hello world")  # e.array: (T, C) float32, read-only

AsyncEmbeddingClient has the same methods as coroutines; ``embedctl`` is the command line.
The names below load on first use, so ``import client.cli`` can configure grpc's logging
before grpc itself is imported.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
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
    from client.cuda_shm import CudaEmbedding, CudaSharedMemoryRegion

__all__ = [
    "COMPOSE",
    "DEFAULT_TARGET",
    "DTYPES",
    "TRUNCATE",
    "AsyncEmbeddingClient",
    "BatchOptions",
    "CudaEmbedding",
    "CudaSharedMemoryRegion",
    "EmbedOptions",
    "Embedding",
    "EmbeddingClient",
    "EmbeddingError",
    "Timing",
    "decode_tensor",
    "embed_request",
]

_HOME = {"DEFAULT_TARGET": "client.client", "AsyncEmbeddingClient": "client.client",
         "EmbeddingClient": "client.client", "CudaEmbedding": "client.cuda_shm",
         "CudaSharedMemoryRegion": "client.cuda_shm"}


def __getattr__(name: str) -> Any:
    if name not in __all__:
        raise AttributeError(f"module 'client' has no attribute {name!r}")
    return getattr(importlib.import_module(_HOME.get(name, "client.codec")), name)

"""Servers the fronts' tests share, whichever wire they speak: a native stub on the shared
server, the small-limits server each wire's refusals are tested against, and the server the
fuzz targets (gRPC and REST) send their examples to."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest

from genproto.embedding.v1 import embedding_pb2_grpc as pb_grpc
from service.local import ServerHandle
from tests.service.rpc.fuzz_oracle import SERVER_CONFIG
from tests.tiny_model import start

__all__ = ["fuzz_server", "limited_server", "native"]


@pytest.fixture(scope="module")
def native(server: ServerHandle) -> Iterator[pb_grpc.EmbeddingServiceStub]:
    """A native stub on the shared server: the reference every other wire's answer equals."""
    with grpc.insecure_channel(server.target) as channel:
        yield pb_grpc.EmbeddingServiceStub(channel)


@pytest.fixture(scope="module")
def limited_server(tiny_repo: Path) -> Iterator[ServerHandle]:
    """Small limits and a token; a 1 s batch delay keeps work queued long enough to collide."""
    with start(tiny_repo, max_text_bytes=16, max_message_bytes=2000, max_batch_tokens=8,
               max_queue_tokens=8, max_batch_delay_us=1_000_000, auth_token="t0ken") as handle:
        yield handle


@pytest.fixture(scope="module")
def fuzz_server(tiny_repo: Path) -> Iterator[ServerHandle]:
    """A real server over the tiny models with the fuzz oracle's limits and batching."""
    with start(tiny_repo, **SERVER_CONFIG) as handle:
        yield handle

"""Shared fixtures of the security suite: a repository with the models the attacks need,
one guarded server (a token, small limits) that every test here shares, and stubs.

The server runs in this process (``start_in_thread``), so a test can read what the server
itself measured (its metrics: seconds spent in Python per RPC, requests counted) and the
bytes it holds for streams, not just what a client sees. Each test leaves the server
serving: the good-request checks run after every attack.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest

from genproto.embedding.v1 import embedding_pb2 as pb
from genproto.embedding.v1 import embedding_pb2_grpc as pb_grpc
from genproto.inference.v2 import grpc_service_pb2_grpc as oip_grpc
from service.format.tokenizer import gpt2_spec
from service.format.writer import write_checkpoint
from service.local import ServerHandle
from tests.security.shm_helpers import MakeObject, ShmObject
from tests.tiny_model import MAX_SEQ_LEN, VOCAB_SIZE, MakeCheckpoint, start, tiny_tables

TOKEN = "s3cret-token"
AUTH = (("authorization", f"Bearer {TOKEN}"),)
WIDE_DIM = 128  # "wide": answers of 512 B per token, so a stream's answers add up fast
BIG_TOKEN = 60000.0  # "big": a token row within float16, and a position row that,
BIG_POSITION = 10000.0  # added to it, is not (70000 > 65504)
# The guarded server's limits: small, so a test reaches each with a cheap request.
LIMITS = {
    "max_inputs_per_request": 64,
    "max_request_text_bytes": 64 << 10,
    "max_text_bytes": 32 << 10,
    "max_concurrent_rpcs": 16,
    "max_stream_buffer_bytes": 256 << 10,
    "max_unsent_bytes": 1 << 20,
}


@pytest.fixture(scope="session")
def security_repo(tmp_path_factory: pytest.TempPathFactory, make_checkpoint: MakeCheckpoint,
                  gpt2_ranks: Path) -> Path:
    """``tiny`` (learned positions), ``wide`` (C=128) and ``big`` (values past float16)."""
    repo = tmp_path_factory.mktemp("security-models")
    make_checkpoint(repo, "tiny")
    make_checkpoint(repo, "wide", dim=WIDE_DIM, seed=2)
    token_table, position_table = tiny_tables(3)
    token_table[5, 0] = BIG_TOKEN
    position_table[:, 0] = BIG_POSITION
    write_checkpoint(repo / "big" / "1", token_table=token_table,
                     position_table=position_table, position="learned",
                     max_seq_len=MAX_SEQ_LEN, vocab_size=VOCAB_SIZE,
                     tokenizer_spec=gpt2_spec(), tokenizer_ranks=gpt2_ranks,
                     provenance={"source": "test", "note": "values past float16"})
    return repo


@pytest.fixture(scope="session")
def guarded(security_repo: Path) -> Iterator[ServerHandle]:
    """The suite's server: a bearer token and the small ``LIMITS``."""
    handle = start(security_repo, auth_token=TOKEN, **LIMITS)
    yield handle
    handle.stop()


@pytest.fixture(scope="session")
def grpc_server(guarded: ServerHandle) -> ServerHandle:
    """The server tests/conftest.py's ``channel`` opens onto here: the guarded one."""
    return guarded


@pytest.fixture(scope="module")
def native(channel: grpc.Channel) -> pb_grpc.EmbeddingServiceStub:
    return pb_grpc.EmbeddingServiceStub(channel)


@pytest.fixture(scope="module")
def inference(channel: grpc.Channel) -> oip_grpc.GRPCInferenceServiceStub:
    return oip_grpc.GRPCInferenceServiceStub(channel)


@pytest.fixture
def objects() -> Iterator[MakeObject]:
    """``objects(size)`` → a new /dev/shm object; every one unlinked when the test ends."""
    made: list[ShmObject] = []

    def make(size: int) -> ShmObject:
        made.append(ShmObject(size))
        return made[-1]

    yield make
    for obj in made:
        obj.close()


GOOD = pb.EmbedRequest(text="hello world", request_id="good")


def still_serves(stub: pb_grpc.EmbeddingServiceStub) -> None:
    """A good request right after an attack gets its answer."""
    resp = stub.Embed(GOOD, metadata=AUTH, timeout=10)
    assert list(resp.token_ids) == [31373, 995]


def server_seconds(handle: ServerHandle, rpc: str) -> tuple[float, int]:
    """(seconds in Python, calls) the server has recorded for ``rpc`` over every model
    label: its own measure of what the requests cost it (the frame's request duration)."""
    seconds, calls = 0.0, 0
    for labels, child in handle.server.metrics.request_duration._children.items():
        if labels[0] == rpc:
            seconds += child.sum  # type: ignore[attr-defined]
            calls += sum(child.counts)  # type: ignore[attr-defined]
    return seconds, calls

"""Shared-memory output: rows written into a client's /dev/shm region, bit for bit the
gRPC bytes; bounds, keys and unregistering while a request uses the region."""

from __future__ import annotations

import os
import threading
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest

from client import EmbeddingClient
from client.codec import EmbeddingError
from client.shm import SharedMemoryRegion
from genproto.embedding.v1 import embedding_pb2 as pb
from genproto.embedding.v1 import embedding_pb2_grpc as pb_grpc
from service.local import ServerHandle
from tests.tiny_model import DIM, start

IDS = [31373, 995, 0, 50256, 7, 11]


@pytest.fixture
def region() -> Iterator[SharedMemoryRegion]:
    with SharedMemoryRegion("test", 4096) as r:
        yield r


@pytest.fixture
def client(server: ServerHandle, region: SharedMemoryRegion) -> Iterator[EmbeddingClient]:
    with EmbeddingClient(server.target, raw_bfloat16=True) as c:
        c.register_shared_memory(region)
        try:
            yield c
        finally:
            c.unregister_shared_memory(region.name)


@pytest.mark.parametrize("dtype", ["float32", "float16", "bfloat16"])
def test_rows_in_region_equal_grpc_bytes(client: EmbeddingClient, region: SharedMemoryRegion,
                                         dtype: str) -> None:
    wire = client.embed(ids=IDS, dtype=dtype, start_position=5)
    placed = client.embed(ids=IDS, dtype=dtype, start_position=5, shm=region, shm_offset=64)
    assert placed.array.shape == (len(IDS), DIM)
    assert placed.array.tobytes() == wire.array.tobytes()
    # A view of the region itself, not a copy: the bytes sit at the offset asked for.
    nbytes = wire.array.nbytes
    assert bytes(region.mapping[64: 64 + nbytes]) == wire.array.tobytes()
    assert (placed.token_ids, placed.model, placed.version) == (IDS, "tiny", 1)
    assert placed.timing.total_ns > 0


def test_response_carries_only_shape_dtype_and_range(server: ServerHandle,
                                                     client: EmbeddingClient,
                                                     region: SharedMemoryRegion) -> None:
    with grpc.insecure_channel(server.target) as channel:
        stub = pb_grpc.EmbeddingServiceStub(channel)
        resp = stub.Embed(pb.EmbedRequest(token_ids=pb.TokenIds(ids=IDS),
                                          dtype=pb.DTYPE_BFLOAT16,
                                          output=pb.SharedMemoryOutput(region="test", offset=8)))
        batch = stub.EmbedBatch(pb.EmbedBatchRequest(
            inputs=[pb.EmbedInput(token_ids=pb.TokenIds(ids=IDS[:2])),
                    pb.EmbedInput(text="hello world", start_position=3)],
            output=pb.SharedMemoryOutput(region="test", offset=1024)))
        packed = stub.EmbedBatch(pb.EmbedBatchRequest(
            inputs=[pb.EmbedInput(token_ids=pb.TokenIds(ids=IDS[:2])),
                    pb.EmbedInput(text="hello world", start_position=3)]))
    assert (list(resp.embeddings.shape), resp.embeddings.dtype, resp.embeddings.data) == \
        ([len(IDS), DIM], pb.DTYPE_BFLOAT16, b"")
    assert resp.output == pb.SharedMemoryRange(region="test", offset=8,
                                               byte_size=len(IDS) * DIM * 2)
    assert batch.output.byte_size == 4 * DIM * 4
    assert list(batch.offsets) == [0, 2, 4]
    assert bytes(region.mapping[1024: 1024 + 4 * DIM * 4]) == packed.embeddings.data


def test_list_and_errors(server: ServerHandle, client: EmbeddingClient,
                         region: SharedMemoryRegion, tmp_path: Path) -> None:
    (listed,) = client.list_shared_memory()
    assert (listed.name, listed.key, listed.offset, listed.byte_size) == (
        "test", region.key, 0, 4096)

    def status(call: object) -> tuple[grpc.StatusCode, str]:
        with pytest.raises(EmbeddingError) as info:
            call()  # type: ignore[operator]
        return info.value.code, info.value.details

    too_big = status(lambda: client.embed(ids=[1] * 64, shm=region, shm_offset=100))
    assert too_big == (grpc.StatusCode.INVALID_ARGUMENT,
                       "output: the output needs 4096 bytes at offset 100 but region 'test' "
                       "has 4096 bytes; the largest T that fits is 62")
    with SharedMemoryRegion("other", 64) as other:  # never registered
        assert status(lambda: client.embed(ids=[1], shm=other)) == (
            grpc.StatusCode.NOT_FOUND, "region 'other' is not registered")
    assert status(lambda: client.register_shared_memory(region)) == (
        grpc.StatusCode.ALREADY_EXISTS, "region 'test' is already registered; unregister it "
                                        "first")
    stub_region = pb.SharedMemoryRegion
    with grpc.insecure_channel(server.target) as channel:
        stub = pb_grpc.EmbeddingServiceStub(channel)

        def register(**fields: object) -> tuple[grpc.StatusCode, str]:
            with pytest.raises(grpc.RpcError) as info:
                stub.RegisterSharedMemory(pb.RegisterSharedMemoryRequest(
                    region=stub_region(**fields)))  # type: ignore[arg-type]
            return info.value.code(), info.value.details()

        assert register(name="x", key="/../etc/passwd", byte_size=8) == (
            grpc.StatusCode.INVALID_ARGUMENT, "shared-memory key '/../etc/passwd' must name an "
            "object directly under /dev/shm (like '/my-region': ASCII letters, digits, '.', '_', "
            "'-'; no other '/')")
        assert register(name="x", key="/embed-no-such-object", byte_size=8) == (
            grpc.StatusCode.NOT_FOUND, "shared-memory object '/embed-no-such-object' does not "
            "exist under /dev/shm")
        assert register(name="x", key=region.key, offset=4000, byte_size=200) == (
            grpc.StatusCode.INVALID_ARGUMENT, f"region 'x': offset 4000 + byte_size 200 = 4200 "
            f"exceeds the size of {region.key!r} (4096 bytes)")
        target = tmp_path / "secret"
        target.write_bytes(b"\0" * 64)
        link = Path("/dev/shm") / f"embed-link-{os.getpid()}"
        link.symlink_to(target)
        try:  # a link in /dev/shm must not lead the server outside it
            code, message = register(name="x", key=f"/{link.name}", byte_size=8)
        finally:
            link.unlink()
        assert code == grpc.StatusCode.INVALID_ARGUMENT
        assert message.startswith(f"shared-memory object '/{link.name}' cannot be opened")
    assert client.embed(ids=[1, 2]).array.shape == (2, DIM)  # still serving


def test_unregister_while_a_request_writes_is_safe(tiny_repo: Path) -> None:
    handle = start(tiny_repo, max_batch_delay_us=300_000)  # the request waits in the queue
    try:
        with SharedMemoryRegion("busy", 4096) as region, \
                EmbeddingClient(handle.target) as client:
            client.register_shared_memory(region)
            result: list[object] = []
            worker = threading.Thread(target=lambda: result.append(
                client.embed(ids=IDS, shm=region)))
            worker.start()
            threading.Event().wait(0.1)
            client.unregister_shared_memory("busy")  # while the request is queued
            worker.join()
            assert client.list_shared_memory() == []
            wire = client.embed(ids=IDS)
            (placed,) = result
            assert placed.array.tobytes() == wire.array.tobytes()  # type: ignore[attr-defined]
            result.clear()  # the region can close only once no array views it
            del placed
    finally:
        handle.stop()

"""CUDA shared memory over the native gRPC API, on CPU servers.

A CPU server refuses every CUDA registration and CUDA output with
FAILED_PRECONDITION naming its device, after the request's own fields. Then the whole
request path (front, registry, plan, batcher, device write) with the engine's registry
opening handles as host bytes (``cuda_memory.HostOpener``: what ``cudaIpcOpenMemHandle``
would map, the one part a CPU cannot do): rows equal to the host path's bytes for Embed,
EmbedBatch and EmbedStream, tenancy between identities, one namespace with host regions, and
bounds refused before any work. The same requests against a GPU server and real device
memory are test_cuda_shm_gpu.py's.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest

from client.shm import SharedMemoryRegion
from genproto.embedding.v1 import embedding_pb2 as pb
from service.local import ServerHandle
from tests.security.shm_helpers import IDS, As, channel
from tests.service.engine.cuda_memory import HANDLE, HostOpener, handle, host_backed_server
from tests.tiny_model import DIM

PRECONDITION = (grpc.StatusCode.FAILED_PRECONDITION,
                "this server's tables are on cpu; CUDA shared memory needs --device cuda")
TOKENS = {"alice": "token-a", "bob": "token-b"}


def cuda_region(name: str, raw: bytes = HANDLE, size: int = 1 << 16,
                device_id: int = 0) -> pb.RegisterCudaSharedMemoryRequest:
    return pb.RegisterCudaSharedMemoryRequest(region=pb.CudaSharedMemoryRegion(
        name=name, raw_handle=raw, device_id=device_id, byte_size=size))


def embed(region: str, offset: int = 0, ids: list[int] | None = None,
          **fields: object) -> pb.EmbedRequest:
    return pb.EmbedRequest(token_ids=pb.TokenIds(ids=ids or IDS),
                           output=pb.SharedMemoryOutput(region=region, offset=offset,
                                                        cuda=True), **fields)  # type: ignore[arg-type]


def batch_count(server: ServerHandle) -> float:
    """Batches the server has run (its embed_batch_requests histogram's count)."""
    family = next(iter(server.server.metrics.batch_requests.collect()))
    return sum(s.value for s in family.samples if s.name.endswith("_count"))


def test_cpu_server_refuses_cuda_registration_and_outputs(cpu_server: ServerHandle) -> None:
    with channel(cpu_server.target) as ch:
        me = As(ch)
        assert me.status("native", "RegisterCudaSharedMemory", cuda_region("g")) == \
            PRECONDITION
        assert me.status("native", "RegisterCudaSharedMemory",
                         cuda_region("g", raw=HANDLE[:16])) == (
            grpc.StatusCode.INVALID_ARGUMENT,
            "raw_handle of region 'g' has 16 bytes; a cudaIpcMemHandle_t has 64")
        assert me.status("native", "RegisterCudaSharedMemory",
                         cuda_region("g", device_id=-2)) == (
            grpc.StatusCode.INVALID_ARGUMENT, "device_id=-2 of region 'g' must be a GPU "
                                              "index >= 0")
        assert me.status("native", "Embed", embed("g")) == PRECONDITION
        batch = pb.EmbedBatchRequest(inputs=[pb.EmbedInput(token_ids=pb.TokenIds(ids=IDS))],
                                     output=pb.SharedMemoryOutput(region="g", cuda=True))
        assert me.status("native", "EmbedBatch", batch) == PRECONDITION
        with pytest.raises(grpc.RpcError) as info:
            list(me.native.EmbedStream(iter([embed("g")]), timeout=30))
        assert (info.value.code(), info.value.details()) == PRECONDITION
        assert list(me("native", "ListCudaSharedMemory",
                       pb.ListCudaSharedMemoryRequest()).regions) == []
        assert me.status("native", "UnregisterCudaSharedMemory",
                         pb.UnregisterCudaSharedMemoryRequest(name="g")) == (
            grpc.StatusCode.NOT_FOUND, "CUDA region 'g' is not registered")
        assert len(me.embed()) == len(IDS) * DIM * 4  # still serving
        assert me.names() == []


@pytest.fixture
def host_backed(tiny_repo: Path) -> Iterator[tuple[ServerHandle, HostOpener]]:
    """A CPU server with two identities whose CUDA registry opens handles as host bytes."""
    tokens = tiny_repo.parent / "cuda-tokens"
    tokens.write_text("".join(f"{name} {token}\n" for name, token in TOKENS.items()))
    with host_backed_server(tiny_repo, max_per_identity=2, auth_tokens=str(tokens),
                            max_shm_regions_per_identity=2) as backed:
        yield backed


def test_rows_reach_the_region_through_every_embedding_rpc(
        host_backed: tuple[ServerHandle, HostOpener]) -> None:
    server, opener = host_backed
    with channel(server.target) as ch:
        alice = As(ch, TOKENS["alice"])
        alice("native", "RegisterCudaSharedMemory", cuda_region("g"))
        memory = opener.memory[HANDLE].bytes
        listed = alice("native", "ListCudaSharedMemory", pb.ListCudaSharedMemoryRequest())
        assert list(listed.regions) == [pb.CudaSharedMemoryRegion(
            name="g", device_id=0, byte_size=1 << 16)]  # no handle in a listing
        for dtype in (pb.DTYPE_FLOAT32, pb.DTYPE_FLOAT16, pb.DTYPE_BFLOAT16):
            want = alice("native", "Embed", pb.EmbedRequest(
                token_ids=pb.TokenIds(ids=IDS), dtype=dtype, start_position=3)).embeddings
            resp = alice("native", "Embed", embed("g", 256, dtype=dtype, start_position=3))
            n = len(want.data)
            assert resp.output == pb.SharedMemoryRange(region="g", offset=256, byte_size=n,
                                                       cuda=True)
            assert (list(resp.embeddings.shape), resp.embeddings.dtype,
                    resp.embeddings.data) == ([len(IDS), DIM], dtype, b"")
            assert memory[256: 256 + n].numpy().tobytes() == want.data
        packed = alice("native", "EmbedBatch", pb.EmbedBatchRequest(inputs=[
            pb.EmbedInput(token_ids=pb.TokenIds(ids=IDS[:2])),
            pb.EmbedInput(text="hello world", start_position=3)])).embeddings.data
        batch = alice("native", "EmbedBatch", pb.EmbedBatchRequest(
            inputs=[pb.EmbedInput(token_ids=pb.TokenIds(ids=IDS[:2])),
                    pb.EmbedInput(text="hello world", start_position=3)],
            output=pb.SharedMemoryOutput(region="g", offset=4096, cuda=True)))
        assert (list(batch.offsets), batch.output.byte_size) == ([0, 2, 4], len(packed))
        assert memory[4096: 4096 + len(packed)].numpy().tobytes() == packed
        stream = list(alice.native.EmbedStream(
            iter([embed("g", 8192, IDS[:3]), embed("g", 9216, IDS[3:])]),
            metadata=alice.metadata, timeout=30))
        assert [r.output.offset for r in stream] == [8192, 9216]
        for r, ids in zip(stream, (IDS[:3], IDS[3:])):
            n = r.output.byte_size
            assert memory[r.output.offset: r.output.offset + n].numpy().tobytes() == \
                alice.embed(ids)


def test_regions_of_another_identity_are_not_found(
        host_backed: tuple[ServerHandle, HostOpener]) -> None:
    server, opener = host_backed
    with channel(server.target) as ch, SharedMemoryRegion("h", 4096) as host_region:
        alice, bob = As(ch, TOKENS["alice"]), As(ch, TOKENS["bob"])
        alice("native", "RegisterCudaSharedMemory", cuda_region("g"))
        not_found = (grpc.StatusCode.NOT_FOUND, "CUDA region 'g' is not registered")
        assert bob.status("native", "Embed", embed("g")) == not_found
        assert bob.status("native", "UnregisterCudaSharedMemory",
                          pb.UnregisterCudaSharedMemoryRequest(name="g")) == not_found
        assert list(bob("native", "ListCudaSharedMemory",
                        pb.ListCudaSharedMemoryRequest()).regions) == []
        assert bob.status("native", "RegisterCudaSharedMemory", cuda_region("b")) == (
            grpc.StatusCode.PERMISSION_DENIED,
            "the allocation raw_handle names is registered by another client (region 'b')")
        bob("native", "UnregisterCudaSharedMemory", pb.UnregisterCudaSharedMemoryRequest())
        assert alice("native", "Embed", embed("g")).output.byte_size == len(IDS) * DIM * 4
        # one namespace per identity across both kinds of region
        exists = (grpc.StatusCode.ALREADY_EXISTS,
                  "region 'g' is already registered (a CUDA region); unregister it first")
        assert alice.status("native", "RegisterSharedMemory", pb.RegisterSharedMemoryRequest(
            region=pb.SharedMemoryRegion(name="g", key=host_region.key,
                                         byte_size=4096))) == exists
        alice.register("h", host_region)  # type: ignore[arg-type]
        assert alice.status("native", "RegisterCudaSharedMemory",
                            cuda_region("h", raw=handle(9))) == (
            grpc.StatusCode.ALREADY_EXISTS, "region 'h' is already registered; unregister it "
                                            "first")
        # a host output naming a CUDA region, and the reverse, name no region of that kind
        assert alice.status("native", "Embed", pb.EmbedRequest(
            token_ids=pb.TokenIds(ids=IDS), output=pb.SharedMemoryOutput(region="g"))) == (
            grpc.StatusCode.NOT_FOUND, "region 'g' is not registered")
        assert alice.status("native", "Embed", embed("h")) == (
            grpc.StatusCode.NOT_FOUND, "CUDA region 'h' is not registered")
        alice("native", "UnregisterSharedMemory", pb.UnregisterSharedMemoryRequest(name="h"))
    assert len(opener.opened) == 1


def test_bounds_are_refused_before_any_work(
        host_backed: tuple[ServerHandle, HostOpener]) -> None:
    server, opener = host_backed
    with channel(server.target) as ch:
        alice = As(ch, TOKENS["alice"])
        alice("native", "RegisterCudaSharedMemory", cuda_region("small", size=256))
        memory = opener.memory[HANDLE].bytes
        memory.fill_(0x5A)
        before = batch_count(server)
        assert alice.status("native", "Embed", embed("small", 0)) == (
            grpc.StatusCode.INVALID_ARGUMENT, "output: the output needs 384 bytes at offset 0 "
            "but CUDA region 'small' has 256 bytes; the largest T that fits is 4")
        assert alice.status("native", "Embed", embed("small", 2, IDS[:1],
                                                     dtype=pb.DTYPE_FLOAT32)) == (
            grpc.StatusCode.INVALID_ARGUMENT, "output: offset 2 is not a multiple of 4, the "
            "size of one float32 element; the device stores whole elements into a CUDA "
            "region")
        assert batch_count(server) == before  # no batch ran
        assert bool((memory == 0x5A).all())  # not a byte written
        fits = alice("native", "Embed", embed("small", 2, IDS[:4], dtype=pb.DTYPE_BFLOAT16))
        assert fits.output.byte_size == 4 * DIM * 2
        want = alice("native", "Embed", pb.EmbedRequest(token_ids=pb.TokenIds(ids=IDS[:4]),
                                                        dtype=pb.DTYPE_BFLOAT16))
        assert memory[2:130].numpy().tobytes() == want.embeddings.data
        assert bool((memory[:2] == 0x5A).all())
        assert bool((memory[130:] == 0x5A).all())

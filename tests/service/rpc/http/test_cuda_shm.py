"""The REST routes of Triton's CUDA shared-memory extension, with tritonclient.http and raw
HTTP: a CPU server answers a registration with 400 (FAILED_PRECONDITION) naming its device,
bodies are checked field by field, status and unregister answer as Triton's do; with the
engine's registry opening handles as host bytes (``cuda_memory.HostOpener``), a region
registered over REST is the one a gRPC Embed writes into, and only from local peers."""

from __future__ import annotations

import base64
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest
import tritonclient.http as th
from tritonclient.utils import InferenceServerException

from genproto.embedding.v1 import embedding_pb2 as pb
from genproto.embedding.v1 import embedding_pb2_grpc as pb_grpc
from service.local import ServerHandle
from tests.security.shm_helpers import IDS, non_loopback_address
from tests.service.engine.cuda_memory import HANDLE, HostOpener, host_backed_server
from tests.service.rpc.http.conftest import request
from tests.tiny_model import DIM

B64 = base64.b64encode(HANDLE).decode()
PRECONDITION = "this server's tables are on cpu; CUDA shared memory needs --device cuda"


@pytest.fixture(scope="module")
def server(cpu_server: ServerHandle) -> ServerHandle:
    """Every test here but the host-backed ones: the CPU server that refuses CUDA."""
    return cpu_server


@pytest.fixture(scope="module")
def triton(server: ServerHandle) -> Iterator[th.InferenceServerClient]:
    c = th.InferenceServerClient(f"127.0.0.1:{server.http_port}")
    yield c
    c.close()


def test_cpu_server_refuses_registration(server: ServerHandle,
                                         triton: th.InferenceServerClient) -> None:
    with pytest.raises(InferenceServerException) as info:
        triton.register_cuda_shared_memory("g", B64, 0, 4096)
    assert (info.value.status(), info.value.message()) == ("400", PRECONDITION)
    assert triton.get_cuda_shared_memory_status() == []
    triton.unregister_cuda_shared_memory()  # none of the caller's: nothing to do
    with pytest.raises(InferenceServerException) as info:
        triton.unregister_cuda_shared_memory("g")
    assert (info.value.status(), info.value.message()) == (
        "404", "CUDA region 'g' is not registered")
    assert triton.get_server_metadata()["extensions"] == ["parameters", "binary_tensor_data"]


@pytest.mark.parametrize(("body", "message"), [
    (b"not json", "register body must be a JSON object with raw_handle, device_id and "
                  "byte_size"),
    (b"[1]", "register body must be a JSON object with raw_handle, device_id and byte_size"),
    ({"raw_handle": B64, "device_id": 0, "byte_size": 8},
     'raw_handle must be {"b64": "<base64 of the cudaIpcMemHandle_t>"}'),
    ({"raw_handle": {"b64": "not base64!"}, "device_id": 0, "byte_size": 8},
     'raw_handle must be {"b64": "<base64 of the cudaIpcMemHandle_t>"}'),
    ({"raw_handle": {"b64": B64}, "device_id": "0", "byte_size": 8},
     'device_id must be an integer, got "0"'),
    ({"raw_handle": {"b64": B64}, "device_id": 0, "byte_size": True},
     "byte_size must be an integer, got true"),
    ({"raw_handle": {"b64": B64}, "device_id": 0},
     "byte_size must be an integer, got null"),
    ({"raw_handle": {"b64": "AQID"}, "device_id": 0, "byte_size": 8},
     "raw_handle of region 'g' has 3 bytes; a cudaIpcMemHandle_t has 64"),
    ({"raw_handle": {"b64": B64}, "device_id": 0, "byte_size": -1},
     "byte_size=-1 of region 'g' must be > 0"),
])
def test_register_body_is_checked_field_by_field(server: ServerHandle, body: object,
                                                 message: str) -> None:
    reply = request(server.http_port, "POST", "/v2/cudasharedmemory/region/g/register",
                    body)  # type: ignore[arg-type]
    assert (reply.status, reply.json()) == (400, {"error": message})


def test_routes_and_methods(server: ServerHandle) -> None:
    assert request(server.http_port, "GET", "/v2/cudasharedmemory/status").json() == []
    reply = request(server.http_port, "GET", "/v2/cudasharedmemory/region/g/status")
    assert (reply.status, reply.json()) == (404, {"error": "CUDA region 'g' is not registered"})
    reply = request(server.http_port, "POST", "/v2/cudasharedmemory/unregister")
    assert (reply.status, reply.body) == (200, b"")
    reply = request(server.http_port, "GET", "/v2/cudasharedmemory/region/g/register")
    assert (reply.status, reply.headers["allow"]) == (405, "POST")


@pytest.fixture
def host_backed(tiny_repo: Path) -> Iterator[tuple[ServerHandle, HostOpener]]:
    with host_backed_server(tiny_repo) as backed:
        yield backed


def test_a_region_registered_over_rest_is_the_grpc_fronts(
        host_backed: tuple[ServerHandle, HostOpener]) -> None:
    server, opener = host_backed
    c = th.InferenceServerClient(f"127.0.0.1:{server.http_port}")
    try:
        c.register_cuda_shared_memory("g", B64, 0, 4096)
        assert c.get_cuda_shared_memory_status() == [
            {"name": "g", "device_id": 0, "byte_size": 4096}]
        assert c.get_cuda_shared_memory_status("g") == [
            {"name": "g", "device_id": 0, "byte_size": 4096}]
        with grpc.insecure_channel(server.target) as channel:
            stub = pb_grpc.EmbeddingServiceStub(channel)
            want = stub.Embed(pb.EmbedRequest(token_ids=pb.TokenIds(ids=IDS))).embeddings.data
            got = stub.Embed(pb.EmbedRequest(token_ids=pb.TokenIds(ids=IDS),
                                             output=pb.SharedMemoryOutput(region="g",
                                                                          offset=64, cuda=True)))
        assert got.output.byte_size == len(IDS) * DIM * 4
        assert opener.memory[HANDLE].bytes[64: 64 + len(want)].numpy().tobytes() == want
        with pytest.raises(InferenceServerException) as info:
            c.register_cuda_shared_memory("g", B64, 0, 4096)
        assert (info.value.status(), info.value.message()) == (
            "409", "region 'g' is already registered; unregister it first")
        c.unregister_cuda_shared_memory("g")
        assert c.get_cuda_shared_memory_status() == []
    finally:
        c.close()


def test_non_local_peers_are_refused(tiny_repo: Path) -> None:
    address = non_loopback_address() or "127.0.0.1"
    remote = not address.startswith("127.")
    with host_backed_server(tiny_repo, host="0.0.0.0") as (handle, _):
        c = th.InferenceServerClient(f"{address}:{handle.http_port}")
        try:
            if remote:
                with pytest.raises(InferenceServerException) as info:
                    c.register_cuda_shared_memory("g", B64, 0, 4096)
                assert info.value.status() == "403"
                assert info.value.message().endswith("(the server's --shm-allow-remote "
                                                     "enables them)")
            else:  # a host with loopback only: nothing remote to come from
                c.register_cuda_shared_memory("g", B64, 0, 4096)
                assert c.get_cuda_shared_memory_status()[0]["name"] == "g"
        finally:
            c.close()

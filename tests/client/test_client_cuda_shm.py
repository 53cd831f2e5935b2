"""The client's CUDA shared-memory side on a machine without a GPU: it imports and refuses
without torch or a CUDA runtime, places a request's output in a CUDA region, and a CPU
server's refusals reach the caller as EmbeddingError. Allocating a region and reading the
rows as a tensor are test_cuda_shm_gpu.py's (gpu-marked)."""

from __future__ import annotations

import asyncio
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace

import grpc
import pytest

from client import AsyncEmbeddingClient, EmbeddingClient, EmbeddingError
from client.codec import embed_request
from client.cuda_shm import CudaSharedMemoryRegion
from client.outputs import placed
from genproto.embedding.v1 import embedding_pb2 as pb
from service.server import ServerHandle

ROOT = Path(__file__).resolve().parents[2]
NO_RUNTIME = (
    "CUDA shared memory needs the CUDA runtime (libcudart), and none can be loaded here: "
    "install a CUDA build of torch, or the nvidia-cuda-runtime wheel, on a machine with a GPU")
PRECONDITION = "this server's tables are on cpu; CUDA shared memory needs --device cuda"

# A fresh interpreter where torch cannot be imported and no libcudart can be found (the
# names it tries are replaced, so the result is the same on a machine with a GPU).
SCRIPT = """
import ctypes.util, importlib.abc, sys
class Block(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in ("torch", "service"):
            raise ImportError(name + " is blocked")
sys.meta_path.insert(0, Block())
ctypes.util.find_library = lambda name: None
import client.cuda_shm as cs
cs._RUNTIME_NAMES = ("libcudart-not-here.so",)
from client import CudaSharedMemoryRegion, EmbeddingClient, EmbeddingError
try:
    CudaSharedMemoryRegion("r", 4096)
except EmbeddingError as e:
    print(e.code.name, e.details, sep="|")
"""


class Unallocated(CudaSharedMemoryRegion):
    """A region object whose allocation was never made (no GPU here): only its name,
    handle bytes, device and size travel to the server."""

    def __init__(self, name: str, byte_size: int) -> None:
        self.name, self.byte_size, self.device_id = name, byte_size, 0
        self.address = 0
        self.raw_handle = bytes(range(1, 65))


@pytest.fixture
def client(server: ServerHandle) -> Iterator[EmbeddingClient]:
    with EmbeddingClient(server.target) as c:
        yield c


def test_region_without_torch_or_a_runtime_is_refused_in_words() -> None:
    proc = subprocess.run([sys.executable, "-c", SCRIPT], cwd=ROOT, capture_output=True,
                          text=True, timeout=60, check=False)
    assert (proc.returncode, proc.stderr) == (0, "")
    assert proc.stdout == f"FAILED_PRECONDITION|{NO_RUNTIME}\n"


def test_output_names_the_cuda_region() -> None:
    request = placed(embed_request(ids=[1, 2]), None, 0, Unallocated("g", 64), 256)
    assert request.output == pb.SharedMemoryOutput(region="g", offset=256, cuda=True)
    with pytest.raises(ValueError) as info:
        placed(embed_request(ids=[1]), SimpleNamespace(name="h"),  # type: ignore[arg-type]
               0, Unallocated("g", 64), 0)
    assert str(info.value) == "give shm or cuda_region, not both: the rows go to one region"
    message = Unallocated("g", 64).region_message()
    assert message == pb.CudaSharedMemoryRegion(name="g", raw_handle=bytes(range(1, 65)),
                                                device_id=0, byte_size=64)


def test_cpu_server_refuses_registration_and_output(client: EmbeddingClient) -> None:
    region = Unallocated("g", 4096)
    for call in (lambda: client.register_cuda_shared_memory(region),
                 lambda: client.embed(ids=[31373, 995], cuda_region=region)):
        with pytest.raises(EmbeddingError) as info:
            call()
        assert (info.value.code, info.value.details) == (
            grpc.StatusCode.FAILED_PRECONDITION, PRECONDITION)
    assert client.list_cuda_shared_memory() == []
    with pytest.raises(EmbeddingError) as info:
        client.unregister_cuda_shared_memory("g")
    assert (info.value.code, info.value.details) == (grpc.StatusCode.NOT_FOUND,
                                                     "CUDA region 'g' is not registered")
    client.unregister_cuda_shared_memory()  # "" = all of this client's: none, no error
    assert client.embed(ids=[31373, 995]).array.shape == (2, 16)  # still serving


def test_async_client_has_the_same_calls(server: ServerHandle) -> None:
    async def run() -> list[tuple[grpc.StatusCode, str]]:
        got = []
        async with AsyncEmbeddingClient(server.target) as c:
            region = Unallocated("g", 4096)
            for call in (lambda: c.register_cuda_shared_memory(region),
                         lambda: c.embed(ids=[1], cuda_region=region),
                         lambda: c.unregister_cuda_shared_memory("g")):
                try:
                    await call()
                except EmbeddingError as e:
                    got.append((e.code, e.details))
            assert await c.list_cuda_shared_memory() == []
        return got

    assert asyncio.run(run()) == [
        (grpc.StatusCode.FAILED_PRECONDITION, PRECONDITION),
        (grpc.StatusCode.FAILED_PRECONDITION, PRECONDITION),
        (grpc.StatusCode.NOT_FOUND, "CUDA region 'g' is not registered")]

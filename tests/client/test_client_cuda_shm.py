"""The client's CUDA shared-memory side on a machine without a GPU: it imports and refuses
without torch or a CUDA driver, places a request's output in a CUDA region, and a CPU
server's refusals reach the caller as EmbeddingError. Allocating a region and reading the
rows as a tensor are test_cuda_shm_gpu.py's (gpu-marked)."""

from __future__ import annotations

import asyncio
import ctypes
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace

import grpc
import pytest

from client import AsyncEmbeddingClient, EmbeddingClient, EmbeddingError, cuda_shm
from client.codec import embed_request
from client.cuda_shm import CudaSharedMemoryRegion
from client.outputs import placed
from genproto.embedding.v1 import embedding_pb2 as pb
from service.local import ServerHandle
from tests.service.engine.cuda_memory import fake_driver

ROOT = Path(__file__).resolve().parents[2]
NO_DRIVER = ("CUDA shared memory needs the CUDA driver (libcuda-not-here.so.1), and it cannot "
             "be loaded here: run on the GPU's node, where its driver is installed")
PRECONDITION = "this server's tables are on cpu; CUDA shared memory needs --device cuda"

# A fresh interpreter where torch cannot be imported and the driver library's name is one
# that exists nowhere (so the result is the same on a machine with a GPU).
SCRIPT = """
import importlib.abc, sys
class Block(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in ("torch", "service"):
            raise ImportError(name + " is blocked")
sys.meta_path.insert(0, Block())
import client.cuda_shm as cs
cs._DRIVER = "libcuda-not-here.so.1"
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
def client(cpu_server: ServerHandle) -> Iterator[EmbeddingClient]:
    with EmbeddingClient(cpu_server.target) as c:
        yield c


def test_region_without_torch_or_a_driver_is_refused_in_words() -> None:
    proc = subprocess.run([sys.executable, "-c", SCRIPT], cwd=ROOT, capture_output=True,
                          text=True, timeout=60, check=False)
    assert (proc.returncode, proc.stderr) == (0, "")
    assert proc.stdout == f"FAILED_PRECONDITION|{NO_DRIVER}\n"


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


def test_async_client_has_the_same_calls(cpu_server: ServerHandle) -> None:
    async def run() -> list[tuple[grpc.StatusCode, str]]:
        got = []
        async with AsyncEmbeddingClient(cpu_server.target) as c:
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


@pytest.fixture
def fake_cuda(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[ctypes.CDLL]:
    """client.cuda_shm on ``fake_cuda_driver.c`` (the driver's C signatures, no GPU)."""
    path = fake_driver(tmp_path)
    monkeypatch.setattr(cuda_shm, "_DRIVER", str(path))
    cuda_shm.cuda_driver.cache_clear()
    lib = ctypes.CDLL(str(path))
    yield lib
    cuda_shm.cuda_driver.cache_clear()


def test_region_allocates_exports_and_frees_through_the_driver(fake_cuda: ctypes.CDLL
                                                               ) -> None:
    freed = fake_cuda.fake_count(3)
    with CudaSharedMemoryRegion("g", 4096, device_id=1) as region:
        assert region.raw_handle == bytes(i + 1 if i % 3 else 0 for i in range(64))
        assert region.address != 0
        assert fake_cuda.fake_count(0) == fake_cuda.fake_count(1)  # pushed == popped
        rows = region.rows("bfloat16", [3, 8], 16)
        assert (rows.address, rows.dtype, rows.shape, rows.__dlpack_device__()) == (
            region.address + 16, pb.DTYPE_BFLOAT16, (3, 8), (2, 1))
        for dtype, shape, offset in (("float32", [4, 256], 4), ("float16", [1], 3),
                                     ("float32", [1], -4)):
            with pytest.raises(ValueError) as info:
                region.rows(dtype, shape, offset)
            assert "do not fit region 'g' (4096 bytes" in str(info.value)
    assert fake_cuda.fake_count(3) == freed + 1
    assert region.address == 0
    with pytest.raises(EmbeddingError) as refused:
        CudaSharedMemoryRegion("h", 64, device_id=7)
    assert (refused.value.code, refused.value.details) == (
        grpc.StatusCode.FAILED_PRECONDITION, "cuDeviceGet(7) failed: CUDA_ERROR_INVALID_DEVICE")

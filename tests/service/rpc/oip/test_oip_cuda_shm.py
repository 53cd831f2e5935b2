"""Triton's CUDA shared-memory extension on the OIP face, with the real tritonclient.grpc.

Its messages are Triton's own (names, field numbers and types, compared with tritonclient's
generated descriptors). A CPU server refuses CUDA registration with FAILED_PRECONDITION; a
server whose registry opens handles as host bytes (``cuda_memory.HostOpener``, standing in
for ``cudaIpcOpenMemHandle``) takes tritonclient's registration, status and unregistration,
and an infer naming the region gets its padded [B, T, C] rows there, the bytes of the
answer without shared memory. The same with a GPU server and device memory is gpu-marked.
"""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch

from service.local import ServerHandle
from tests.service.engine.cuda_memory import HANDLE, HostOpener, host_backed_server
from tests.service.engine.cuda_server import child_server
from tests.service.rpc.oip.conftest import Triton
from tests.tiny_model import DIM

ROOT = Path(__file__).resolve().parents[4]
TEXTS = ["hello world", "Input embeddings are what the first block reads."]
MESSAGES = ["CudaSharedMemoryStatusRequest", "CudaSharedMemoryStatusResponse",
            "CudaSharedMemoryRegisterRequest", "CudaSharedMemoryRegisterResponse",
            "CudaSharedMemoryUnregisterRequest", "CudaSharedMemoryUnregisterResponse"]
DESCRIBE = """
import json, sys
from {module} import DESCRIPTOR
def fields(d):
    return {{"fields": [[f.name, f.number, f.type] for f in d.fields],
             "nested": {{n.name: fields(n) for n in d.nested_types}}}}
service = DESCRIPTOR.services_by_name["GRPCInferenceService"]
print(json.dumps({{"messages": {{m: fields(DESCRIPTOR.message_types_by_name[m])
                                for m in {messages!r}}},
                  "rpcs": {{m.name: [m.input_type.name, m.output_type.name]
                           for m in service.methods if m.name.startswith("Cuda")}}}}))
"""


def describe(module: str) -> object:
    proc = subprocess.run([sys.executable, "-c", DESCRIBE.format(module=module,
                                                                 messages=MESSAGES)],
                          cwd=ROOT, capture_output=True, text=True, timeout=60, check=True)
    return json.loads(proc.stdout)


def test_messages_are_tritons() -> None:
    ours = describe("genproto.inference.v2.grpc_service_pb2")
    assert ours == describe("tritonclient.grpc.service_pb2")
    assert ours["rpcs"] == {  # type: ignore[index]
        "CudaSharedMemoryStatus": ["CudaSharedMemoryStatusRequest",
                                   "CudaSharedMemoryStatusResponse"],
        "CudaSharedMemoryRegister": ["CudaSharedMemoryRegisterRequest",
                                     "CudaSharedMemoryRegisterResponse"],
        "CudaSharedMemoryUnregister": ["CudaSharedMemoryUnregisterRequest",
                                       "CudaSharedMemoryUnregisterResponse"]}


def test_cpu_server_refuses_cuda_registration(cpu_server: ServerHandle, triton: Triton) -> None:
    register, short, status, unregister, unregister_all, meta = triton(cpu_server.target, [
        {"op": "cuda_register", "name": "g", "raw_handle": HANDLE.hex(), "byte_size": 4096},
        {"op": "cuda_register", "name": "g", "raw_handle": "0102", "byte_size": 4096},
        {"op": "cuda_status"},
        {"op": "cuda_unregister", "name": "g"},
        {"op": "cuda_unregister"},
        {"op": "server_metadata"}])
    assert register == {"status": "FAILED_PRECONDITION", "message": "this server's tables "
                        "are on cpu; CUDA shared memory needs --device cuda"}
    assert short == {"status": "INVALID_ARGUMENT", "message": "raw_handle of region 'g' has "
                     "2 bytes; a cudaIpcMemHandle_t has 64"}
    assert status == unregister_all == {"ok": {}}
    assert unregister == {"status": "NOT_FOUND", "message": "CUDA region 'g' is not registered"}
    # a CPU server does not advertise what it cannot serve
    assert meta["ok"]["extensions"] == ["parameters", "system_shared_memory"]


@pytest.fixture
def host_backed(tiny_repo: Path) -> Iterator[tuple[ServerHandle, HostOpener]]:
    with host_backed_server(tiny_repo) as backed:
        yield backed


def test_registration_status_and_padded_rows(host_backed: tuple[ServerHandle, HostOpener],
                                             triton: Triton) -> None:
    server, opener = host_backed
    register, status, one, wire, into, too_small, unregister, after = triton(server.target, [
        {"op": "cuda_register", "name": "g", "raw_handle": HANDLE.hex(), "byte_size": 8192},
        {"op": "cuda_status"},
        {"op": "cuda_status", "name": "g"},
        {"op": "infer", "texts": TEXTS, "outputs": ["embeddings"]},
        {"op": "infer", "texts": TEXTS, "shm": {"region": "g", "byte_size": 8192,
                                                 "offset": 512}},
        {"op": "infer", "ids": [[1] * 64] * 9, "shm": {"region": "g", "byte_size": 8192}},
        {"op": "cuda_unregister", "name": "g"},
        {"op": "cuda_status"}])
    assert register == unregister == {"ok": {}}
    listed = {"g": {"name": "g", "byte_size": "8192"}}  # device_id 0: proto3 leaves it out
    assert status == one == {"ok": {"regions": listed}}
    assert after == {"ok": {}}
    rows = bytes.fromhex(wire["ok"]["outputs"]["embeddings"]["hex"])  # (2, T, C) padded
    B, T = 2, len(rows) // (2 * DIM * 4)
    assert into["ok"]["outputs"]["embeddings"] == {"datatype": "FP32", "shape": [B, T, DIM]}
    memory = opener.memory[HANDLE].bytes
    assert memory[512: 512 + len(rows)].numpy().tobytes() == rows
    assert (too_small["status"], too_small["message"]) == (
        "INVALID_ARGUMENT", "outputs['embeddings']: the output needs 36864 bytes at offset 0 "
        "but CUDA region 'g' has 8192 bytes; the largest T that fits is 14")


@pytest.mark.gpu
def test_tritonclient_fills_a_real_cuda_region(tiny_repo: Path, triton: Triton) -> None:
    """tritonclient (its own process) registers this process's device memory with a GPU
    server (a third process) and infers into it; the rows are read here on the device."""
    from client.cuda_shm import CudaSharedMemoryRegion

    with child_server(tiny_repo) as gpu, CudaSharedMemoryRegion("trt", 1 << 16) as region:
        register, wire, into, meta, unregister = triton(gpu.target, [
            {"op": "cuda_register", "name": "trt", "raw_handle": region.raw_handle.hex(),
             "byte_size": region.byte_size},
            {"op": "infer", "texts": TEXTS, "outputs": ["embeddings"],
             "parameters": {"datatype": "FP16"}},
            {"op": "infer", "texts": TEXTS, "parameters": {"datatype": "FP16"},
             "shm": {"region": "trt", "byte_size": 1 << 16, "offset": 1024}},
            {"op": "server_metadata"},
            {"op": "cuda_unregister", "name": "trt"}])
        assert register == unregister == {"ok": {}}
        assert "cuda_shared_memory" in meta["ok"]["extensions"]
        rows = bytes.fromhex(wire["ok"]["outputs"]["embeddings"]["hex"])
        shape = into["ok"]["outputs"]["embeddings"]["shape"]
        got = torch.from_dlpack(region.rows("float16", shape, 1024))  # (B, T, C), no copy
        assert got.device.type == "cuda"
        assert got.cpu().numpy().tobytes() == rows

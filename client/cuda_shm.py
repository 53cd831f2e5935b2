"""Client side of CUDA shared-memory output: device memory the server writes rows into.

    with CudaSharedMemoryRegion("embed-gpu", 64 << 20, device_id=0) as region, \\
            EmbeddingClient() as client:
        client.register_cuda_shared_memory(region)
        e = client.embed("hello world", cuda_region=region)
        x = torch.from_dlpack(e.rows)   # (T, C) on cuda:0: a view of the region, no copy
        client.unregister_cuda_shared_memory(region.name)

The region is a ``cudaMalloc`` allocation of this process, exported with
``cudaIpcGetMemHandle``; the server (on the same node, tables on a GPU) opens the handle and
its device writes the rows straight into it, and answers once they are there. The CUDA
runtime is called through ctypes (the copy torch loaded when torch is imported first, else
``libcudart`` by name), so this module needs neither torch nor cuda-python; the rows are
handed over by DLPack (client.dlpack), which torch, CuPy and JAX read without a copy. A
tensor over a region is valid until the region is reused or closed: clone it to keep it.
The allocation must outlive its registration: unregister before ``close``.
"""

from __future__ import annotations

import contextlib
import ctypes
import ctypes.util
import functools
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType

import grpc

from client.codec import DTYPES, EmbeddingError, Timing
from client.dlpack import DeviceRows
from client.grammar import enum_value
from genproto.embedding.v1 import embedding_pb2 as pb

__all__ = ["CudaEmbedding", "CudaSharedMemoryRegion", "cuda_runtime", "rows_from_cuda_region"]

HANDLE_BYTES = 64  # sizeof(cudaIpcMemHandle_t)
_RUNTIME_NAMES = ("libcudart.so", "libcudart.so.13", "libcudart.so.12", "libcudart.so.11.0")
_ITEMSIZE = {pb.DTYPE_FLOAT32: 4, pb.DTYPE_FLOAT16: 2, pb.DTYPE_BFLOAT16: 2}
_DTYPE_NAMES = {v: k for k, v in DTYPES.items()}


@functools.cache
def cuda_runtime() -> ctypes.CDLL:
    """libcudart: the copy already loaded in this process (torch's), else the first found by
    name; EmbeddingError (FAILED_PRECONDITION) when there is none."""
    loaded = [line.split()[-1] for line in Path("/proc/self/maps").read_text().splitlines()
              if "/libcudart" in line]
    found = ctypes.util.find_library("cudart")
    for name in [*dict.fromkeys(loaded), *_RUNTIME_NAMES, *([found] if found else [])]:
        try:
            lib = ctypes.CDLL(name)
        except OSError:
            continue
        lib.cudaMalloc.argtypes = (ctypes.POINTER(ctypes.c_void_p), ctypes.c_size_t)
        lib.cudaFree.argtypes = (ctypes.c_void_p,)
        lib.cudaIpcGetMemHandle.argtypes = (ctypes.c_char_p, ctypes.c_void_p)
        lib.cudaSetDevice.argtypes = (ctypes.c_int,)
        lib.cudaGetDevice.argtypes = (ctypes.POINTER(ctypes.c_int),)
        lib.cudaGetErrorName.restype = ctypes.c_char_p
        return lib
    raise EmbeddingError(grpc.StatusCode.FAILED_PRECONDITION,
                         "CUDA shared memory needs the CUDA runtime (libcudart), and none can "
                         "be loaded here: install a CUDA build of torch, or the "
                         "nvidia-cuda-runtime wheel, on a machine with a GPU")


def _check(lib: ctypes.CDLL, code: int, what: str) -> None:
    if code != 0:
        lib.cudaGetLastError()
        name = (lib.cudaGetErrorName(code) or b"cudaError").decode()
        raise EmbeddingError(grpc.StatusCode.FAILED_PRECONDITION, f"{what} failed: {name}")


class CudaSharedMemoryRegion:
    """``byte_size`` bytes of device memory on GPU ``device_id`` (``cudaMalloc``), exported
    for the server; ``close`` frees it."""

    def __init__(self, name: str, byte_size: int, device_id: int = 0) -> None:
        if byte_size <= 0:
            raise ValueError(f"byte_size={byte_size} must be > 0")
        self.name, self.byte_size, self.device_id = name, byte_size, device_id
        self.address = 0
        lib = cuda_runtime()
        pointer, handle = ctypes.c_void_p(), ctypes.create_string_buffer(HANDLE_BYTES)
        with _on_device(lib, device_id):
            _check(lib, lib.cudaMalloc(ctypes.byref(pointer), byte_size),
                   f"cudaMalloc of {byte_size} bytes on device {device_id}")
            self.address = int(pointer.value or 0)
            try:
                _check(lib, lib.cudaIpcGetMemHandle(handle, ctypes.c_void_p(self.address)),
                       "cudaIpcGetMemHandle")
            except BaseException:
                self.close()
                raise
        self.raw_handle = handle.raw  # the cudaIpcMemHandle_t's 64 bytes

    def region_message(self) -> pb.CudaSharedMemoryRegion:
        """The RegisterCudaSharedMemory body for this region."""
        return pb.CudaSharedMemoryRegion(name=self.name, raw_handle=self.raw_handle,
                                         device_id=self.device_id, byte_size=self.byte_size)

    def rows(self, dtype: str | int, shape: Sequence[int], offset: int = 0) -> DeviceRows:
        """``shape`` elements of ``dtype`` ("float32" | "float16" | "bfloat16", or a
        pb.DType) at ``offset`` of the region, for ``torch.from_dlpack`` (no copy)."""
        wire = enum_value("dtype", dtype)
        if wire not in _ITEMSIZE:
            raise ValueError(f"dtype {dtype}: expected one of {', '.join(DTYPES)}")
        count = 1
        for n in shape:
            count *= int(n)
        size = _ITEMSIZE[wire]
        if offset < 0 or offset + count * size > self.byte_size or offset % size:
            raise ValueError(f"{count * size} bytes of {_DTYPE_NAMES[wire]} at offset "
                             f"{offset} do not fit region {self.name!r} ({self.byte_size} "
                             f"bytes; the offset a multiple of {size})")
        return DeviceRows(self.address + offset, wire, shape, self.device_id, self)

    def close(self) -> None:
        """Free the allocation (tensors over it must be gone; unregister it first)."""
        if self.address:
            lib = cuda_runtime()
            with _on_device(lib, self.device_id):
                lib.cudaFree(ctypes.c_void_p(self.address))
            self.address = 0

    def __enter__(self) -> CudaSharedMemoryRegion:
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.close()


@contextlib.contextmanager
def _on_device(lib: ctypes.CDLL, device: int) -> Iterator[None]:
    """``device`` current for the block, the caller's device again after it."""
    before = ctypes.c_int(0)
    _check(lib, lib.cudaGetDevice(ctypes.byref(before)), "cudaGetDevice")
    _check(lib, lib.cudaSetDevice(device), f"cudaSetDevice({device})")
    try:
        yield
    finally:
        lib.cudaSetDevice(before.value)


@dataclass(frozen=True)
class CudaEmbedding:
    """One sequence's input embeddings in a CUDA region, and what the server says about them."""

    rows: DeviceRows  # (T, C) in the region, on its GPU: torch.from_dlpack(rows), no copy
    region: str
    offset: int  # bytes into the region where the rows start
    byte_size: int
    token_ids: list[int]  # after truncation
    start_position: int
    model: str
    version: int
    checkpoint_id: str
    truncated_tokens: int
    untrained_token_indices: list[int]
    timing: Timing
    request_id: str
    wire_dtype: str  # float32 | float16 | bfloat16


def rows_from_cuda_region(region: CudaSharedMemoryRegion, resp: pb.EmbedResponse
                          ) -> CudaEmbedding:
    """An Embed answer whose rows the server wrote into ``region``, with them as DLPack rows."""
    placed, tensor = resp.output, resp.embeddings
    shape = [int(d) for d in tensor.shape]
    count = 1
    for n in shape:
        count *= n
    if (not placed.cuda or placed.region != region.name or tensor.dtype not in _ITEMSIZE
            or count * _ITEMSIZE[tensor.dtype] != placed.byte_size):
        raise EmbeddingError(grpc.StatusCode.INTERNAL,
                             f"server placed {placed.byte_size} bytes for shape {shape} in "
                             f"{placed.region!r} (cuda={placed.cuda}); this region is "
                             f"{region.name!r}")
    t = resp.timing
    return CudaEmbedding(region.rows(tensor.dtype, shape, placed.offset), placed.region,
                         placed.offset, placed.byte_size, list(resp.token_ids),
                         resp.start_position, resp.model, resp.version, resp.checkpoint_id,
                         resp.truncated_tokens, list(resp.untrained_token_indices),
                         Timing(t.queue_ns, t.tokenize_ns, t.compute_ns, t.total_ns),
                         resp.request_id, _DTYPE_NAMES[tensor.dtype])

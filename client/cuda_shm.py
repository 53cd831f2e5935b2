"""Client side of CUDA shared-memory output: device memory the server writes rows into.

    with CudaSharedMemoryRegion("embed-gpu", 64 << 20, device_id=0) as region, \\
            EmbeddingClient() as client:
        client.register_cuda_shared_memory(region)
        e = client.embed("hello world", cuda_region=region)
        x = torch.from_dlpack(e.rows)   # (T, C) on cuda:0: a view of the region, no copy
        client.unregister_cuda_shared_memory(region.name)

The region is device memory of this process (``cuMemAlloc``, what ``cudaMalloc`` does, in
the GPU's primary context: torch's) exported with ``cuIpcGetMemHandle``; the server (on the
same node, tables on a GPU) opens the handle, its device writes the rows straight into it,
and it answers once they are there. The CUDA driver (``libcuda.so.1``) is called through
ctypes, so this module needs neither torch, nor cuda-python, nor a CUDA runtime; the rows
are handed over by DLPack (client.dlpack), which torch, CuPy and JAX read without a copy.
A tensor over a region is valid until the region is reused or closed: clone it to keep it.
The allocation must outlive its registration: unregister before ``close``.
"""

from __future__ import annotations

import contextlib
import ctypes
import functools
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from types import TracebackType

import grpc

from client.codec import DTYPES, EmbeddingError, Timing
from client.dlpack import DeviceRows
from client.grammar import enum_value
from genproto.embedding.v1 import embedding_pb2 as pb

__all__ = ["CudaEmbedding", "CudaSharedMemoryRegion", "cuda_driver", "rows_from_cuda_region"]

HANDLE_BYTES = 64  # sizeof(CUipcMemHandle) = sizeof(cudaIpcMemHandle_t)
_DRIVER = "libcuda.so.1"  # present wherever a GPU is usable, whatever else is installed
_ITEMSIZE = {pb.DTYPE_FLOAT32: 4, pb.DTYPE_FLOAT16: 2, pb.DTYPE_BFLOAT16: 2}
_DTYPE_NAMES = {v: k for k, v in DTYPES.items()}


class _Driver:
    """The CUDA driver's few entry points a region needs, in each GPU's primary context
    (the one torch and the runtime use, so their kernels see the memory)."""

    def __init__(self, lib: ctypes.CDLL) -> None:
        ptr, u64 = ctypes.POINTER, ctypes.c_uint64
        self.lib = lib
        lib.cuDeviceGet.argtypes = (ptr(ctypes.c_int), ctypes.c_int)
        lib.cuDevicePrimaryCtxRetain.argtypes = (ptr(ctypes.c_void_p), ctypes.c_int)
        lib.cuCtxPushCurrent_v2.argtypes = (ctypes.c_void_p,)
        lib.cuCtxPopCurrent_v2.argtypes = (ptr(ctypes.c_void_p),)
        lib.cuMemAlloc_v2.argtypes = (ptr(u64), ctypes.c_size_t)
        lib.cuMemFree_v2.argtypes = (u64,)
        lib.cuIpcGetMemHandle.argtypes = (ctypes.c_char_p, u64)
        lib.cuGetErrorName.argtypes = (ctypes.c_int, ptr(ctypes.c_char_p))
        self._contexts: dict[int, ctypes.c_void_p] = {}
        self.check(lib.cuInit(0), "cuInit")

    def check(self, code: int, what: str) -> None:
        """EmbeddingError (FAILED_PRECONDITION) naming the call and CUDA's error."""
        if code != 0:
            name = ctypes.c_char_p()
            self.lib.cuGetErrorName(code, ctypes.byref(name))
            raise EmbeddingError(grpc.StatusCode.FAILED_PRECONDITION,
                                 f"{what} failed: {(name.value or b'CUDA_ERROR').decode()}")

    @contextlib.contextmanager
    def on(self, device: int) -> Iterator[ctypes.CDLL]:
        """GPU ``device``'s primary context current for the block."""
        ctx = self._contexts.get(device)
        if ctx is None:  # retained for the process's life, as torch retains it
            dev, ctx = ctypes.c_int(), ctypes.c_void_p()
            self.check(self.lib.cuDeviceGet(ctypes.byref(dev), device),
                       f"cuDeviceGet({device})")
            self.check(self.lib.cuDevicePrimaryCtxRetain(ctypes.byref(ctx), dev),
                       f"cuDevicePrimaryCtxRetain({device})")
            self._contexts[device] = ctx
        self.check(self.lib.cuCtxPushCurrent_v2(ctx), "cuCtxPushCurrent")
        try:
            yield self.lib
        finally:
            self.lib.cuCtxPopCurrent_v2(ctypes.byref(ctypes.c_void_p()))


@functools.cache
def cuda_driver() -> _Driver:
    """The CUDA driver (``libcuda.so.1``); EmbeddingError (FAILED_PRECONDITION) without."""
    try:
        lib = ctypes.CDLL(_DRIVER)
    except OSError:
        raise EmbeddingError(grpc.StatusCode.FAILED_PRECONDITION,
                             f"CUDA shared memory needs the CUDA driver ({_DRIVER}), and it "
                             f"cannot be loaded here: run on the GPU's node, where its "
                             f"driver is installed") from None
    return _Driver(lib)


class CudaSharedMemoryRegion:
    """``byte_size`` bytes of device memory on GPU ``device_id`` (``cuMemAlloc``, as
    ``cudaMalloc``), exported for the server; ``close`` frees it."""

    def __init__(self, name: str, byte_size: int, device_id: int = 0) -> None:
        if byte_size <= 0:
            raise ValueError(f"byte_size={byte_size} must be > 0")
        self.name, self.byte_size, self.device_id = name, byte_size, device_id
        self.address = 0
        driver = cuda_driver()
        pointer, handle = ctypes.c_uint64(), ctypes.create_string_buffer(HANDLE_BYTES)
        with driver.on(device_id) as lib:
            driver.check(lib.cuMemAlloc_v2(ctypes.byref(pointer), byte_size),
                         f"cuMemAlloc of {byte_size} bytes on device {device_id}")
            self.address = int(pointer.value)
            try:
                driver.check(lib.cuIpcGetMemHandle(handle, self.address), "cuIpcGetMemHandle")
            except BaseException:
                self.close()
                raise
        self.raw_handle = handle.raw  # the handle's 64 bytes (cudaIpcMemHandle_t's layout)

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
            with cuda_driver().on(self.device_id) as lib:
                lib.cuMemFree_v2(self.address)
            self.address = 0

    def __enter__(self) -> CudaSharedMemoryRegion:
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.close()


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

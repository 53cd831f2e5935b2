"""The CUDA shared-memory RPCs of both clients (``RegisterCudaSharedMemory`` and co.), as
mixins over their ``_call`` and stub; the region itself is client.cuda_shm's."""

from __future__ import annotations

from typing import Any, Protocol

from client.cuda_shm import CudaSharedMemoryRegion
from genproto.embedding.v1 import embedding_pb2 as pb

__all__ = ["AsyncCudaCalls", "CudaCalls"]


class _Client(Protocol):
    _stub: Any

    def _call(self, method: Any, request: Any, timeout: float | None) -> Any: ...


class _AsyncClient(Protocol):
    _stub: Any

    async def _call(self, method: Any, request: Any, timeout: float | None) -> Any: ...


class CudaCalls:
    """EmbeddingClient's CUDA region calls."""

    def register_cuda_shared_memory(self: _Client, region: CudaSharedMemoryRegion, *,
                                    timeout: float | None = None) -> None:
        """Let the server write into ``region`` (it opens the region's IPC handle)."""
        request = pb.RegisterCudaSharedMemoryRequest(region=region.region_message())
        self._call(self._stub.RegisterCudaSharedMemory, request, timeout)

    def unregister_cuda_shared_memory(self: _Client, name: str = "", *,
                                      timeout: float | None = None) -> None:
        """Forget a CUDA region on the server ("" = all of this client's)."""
        request = pb.UnregisterCudaSharedMemoryRequest(name=name)
        self._call(self._stub.UnregisterCudaSharedMemory, request, timeout)

    def list_cuda_shared_memory(self: _Client, *, timeout: float | None = None
                                ) -> list[pb.CudaSharedMemoryRegion]:
        """The CUDA regions the server has registered for this client (no handles)."""
        return list(self._call(self._stub.ListCudaSharedMemory,
                               pb.ListCudaSharedMemoryRequest(), timeout).regions)


class AsyncCudaCalls:
    """AsyncEmbeddingClient's CUDA region calls."""

    async def register_cuda_shared_memory(self: _AsyncClient, region: CudaSharedMemoryRegion, *,
                                          timeout: float | None = None) -> None:
        """See CudaCalls.register_cuda_shared_memory."""
        request = pb.RegisterCudaSharedMemoryRequest(region=region.region_message())
        await self._call(self._stub.RegisterCudaSharedMemory, request, timeout)

    async def unregister_cuda_shared_memory(self: _AsyncClient, name: str = "", *,
                                            timeout: float | None = None) -> None:
        """See CudaCalls.unregister_cuda_shared_memory."""
        request = pb.UnregisterCudaSharedMemoryRequest(name=name)
        await self._call(self._stub.UnregisterCudaSharedMemory, request, timeout)

    async def list_cuda_shared_memory(self: _AsyncClient, *, timeout: float | None = None
                                      ) -> list[pb.CudaSharedMemoryRegion]:
        """See CudaCalls.list_cuda_shared_memory."""
        resp = await self._call(self._stub.ListCudaSharedMemory,
                                pb.ListCudaSharedMemoryRequest(), timeout)
        return list(resp.regions)

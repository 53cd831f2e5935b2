"""CUDA shared memory (Triton-style): outputs written by the device into a client's GPU memory.

A process on the server's node allocates device memory (``cudaMalloc``), exports it with
``cudaIpcGetMemHandle`` and registers the handle's 64 bytes by name with its device and
size; a request then names the region (and an offset) as its output. With the tables on a
GPU, the rows are gathered, composed and cast straight into that memory by the device
(``cuda_plan``), and the server answers once they are there: the rows never pass through
host memory. This module is the registry (names, tenancy, bounds), beside the host one
(``shm``), with the same rules and status codes:

- **Device.** A server whose tables are not on a GPU refuses every registration and every
  CUDA output with FAILED_PRECONDITION naming its device, after the request's own fields
  are checked (a malformed handle is INVALID_ARGUMENT wherever it is sent).
- **Tenancy.** A region belongs to the identity that registered it; listing, unregistering
  ("" = all of the caller's own) and writing see only the caller's regions, so another
  identity's region is NOT_FOUND. One allocation (one handle) is registered by one identity
  at a time (PERMISSION_DENIED otherwise). Names are one namespace with the host registry's
  (``check_free``): a name is a host region or a CUDA region of its owner, never both.
- **Local peers only**, as for host regions (``--shm-allow-remote`` lifts it).
- **Bounds.** ``byte_size`` may not exceed the allocation the handle opens (asked of the
  driver at registration); every write is checked against the region and the request's own
  byte size before any work, and its offset must be a multiple of the element size (the
  device stores whole elements). Registrations are capped per identity and in all.

Unregistering drops the registry's reference only: a request in flight holds its region and
the mapping is closed (``cuIpcCloseMemHandle``) after it.
"""

from __future__ import annotations

import weakref
from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

import torch

from service.engine.cuda_ipc import HANDLE_BYTES, open_handle
from service.engine.cuda_plan import CudaPlan
from service.engine.regions import Caller, RegionTable, check_name
from service.engine.shm import SharedMemoryRegistry
from service.engine.shm_region import short
from service.errors import (
    AlreadyExists,
    FailedPrecondition,
    InvalidArgument,
    NotFound,
    PermissionDenied,
)

__all__ = ["CudaRegion", "CudaSharedMemoryRegistry", "DeviceMemory", "parse_handle"]

MAX_DEVICE_ID = 1 << 16  # far past any node's GPU count: a bigger id is a malformed request


class DeviceMemory(Protocol):
    """An opened allocation (``cuda_ipc.IpcMapping``): its bytes as a tensor on its device."""

    @property
    def size(self) -> int: ...

    def tensor(self) -> torch.Tensor: ...


Opener = Callable[[bytes, int, int], DeviceMemory]  # (handle, device_id, byte_size)


@dataclass(frozen=True, eq=False)
class CudaRegion:
    """A registered region: the first ``byte_size`` bytes of the allocation ``handle`` opens."""

    name: str
    device_id: int
    byte_size: int
    owner: str  # the identity that registered it
    handle: bytes  # the cudaIpcMemHandle_t
    memory: DeviceMemory
    data: torch.Tensor  # (byte_size,) uint8 on the region's device: a view, no copy


def parse_handle(raw: bytes, device_id: int, byte_size: int, name: str) -> bytes:
    """The request's own fields, checked before anything is opened: INVALID_ARGUMENT naming
    the field. A handle is opaque past its size; an all-zero one was never filled in."""
    if len(raw) != HANDLE_BYTES:
        raise InvalidArgument(f"raw_handle of region {short(name)} has {len(raw)} bytes; a "
                              f"cudaIpcMemHandle_t has {HANDLE_BYTES}")
    if not any(raw):
        raise InvalidArgument(f"raw_handle of region {short(name)} is all zero bytes: not a "
                              f"handle from cudaIpcGetMemHandle")
    if not 0 <= device_id < MAX_DEVICE_ID:
        raise InvalidArgument(f"device_id={device_id} of region {short(name)} must be a GPU "
                              f"index >= 0")
    if byte_size <= 0:
        raise InvalidArgument(f"byte_size={byte_size} of region {short(name)} must be > 0")
    return bytes(raw)


class CudaSharedMemoryRegistry(RegionTable[CudaRegion]):
    """Registered CUDA regions by (owner, name); used from the event loop and the compute
    thread. ``device`` is where the tables are; ``opener`` opens a handle (the CUDA driver's
    IPC, ``cuda_ipc.open_handle``)."""

    kind = "CUDA "

    def __init__(self, device: torch.device, host: SharedMemoryRegistry | None = None,
                 allow_remote: bool = False, max_per_identity: int = 16,
                 max_regions: int = 1024, opener: Opener = open_handle) -> None:
        super().__init__(allow_remote, max_per_identity, max_regions)
        self.device = device
        self.host = host
        self._open = opener
        # handle -> its opened memory while anything holds it (a region, a request in flight)
        self._opened: weakref.WeakValueDictionary[bytes, DeviceMemory] = \
            weakref.WeakValueDictionary()

    def check_device(self) -> None:
        """FAILED_PRECONDITION unless the tables are on a GPU."""
        if self.device.type != "cuda":
            raise FailedPrecondition(f"this server's tables are on {self.device}; CUDA shared "
                                     f"memory needs --device cuda")

    def register(self, caller: Caller, name: str, raw_handle: bytes, device_id: int,
                 byte_size: int) -> CudaRegion:
        """Open ``raw_handle`` on GPU ``device_id`` as region ``name`` of the caller."""
        self.check_peer(caller)
        check_name(name)
        handle = parse_handle(raw_handle, device_id, byte_size, name)
        self.check_device()
        with self._lock:
            self._check_room(caller.identity, name, self._host_has(caller, name))
            memory = self._opened.get(handle)
            owners = {r.owner for r in self._regions.values() if r.handle == handle}
        if owners - {caller.identity}:
            raise PermissionDenied(f"the allocation raw_handle names is registered by another "
                                   f"client (region {short(name)})")
        if memory is None:
            memory = self._open(handle, device_id, byte_size)
        elif byte_size > memory.size:
            raise InvalidArgument(f"byte_size={byte_size} exceeds the {memory.size} bytes of "
                                  f"the allocation raw_handle names")
        region = CudaRegion(name, device_id, byte_size, caller.identity, handle, memory,
                            memory.tensor()[:byte_size])
        with self._lock:
            self._check_room(caller.identity, name, self._host_has(caller, name))  # again
            self._opened[handle] = memory
            self._regions[(caller.identity, name)] = region
        return region

    def check_free(self, caller: Caller, name: str) -> None:
        """ALREADY_EXISTS when ``name`` is one of the caller's CUDA regions: the fronts ask
        before they register a host region (one namespace)."""
        if self.owns(caller, name):
            raise AlreadyExists(f"region {short(name)} is already registered (a CUDA region); "
                                f"unregister it first")

    def _host_has(self, caller: Caller, name: str) -> bool:
        if self.host is None:
            return False
        try:
            self.host.regions(caller, name)
        except NotFound:
            return False
        return True

    def plan(self, caller: Caller, name: str, offset: int, shape: tuple[int, ...],
             dtype: torch.dtype, field: str, byte_size: int | None = None) -> CudaPlan:
        """Where ``shape`` rows of ``dtype`` go: ``offset`` bytes into the caller's CUDA
        region ``name``, within it and within ``byte_size`` (the request's own bound);
        every refusal before any work."""
        self.check_device()
        region, _ = self._fitting(caller, name, offset, shape, dtype.itemsize, field,
                                  byte_size)
        if offset % dtype.itemsize:
            raise InvalidArgument(
                f"{field}: offset {offset} is not a multiple of {dtype.itemsize}, the size of "
                f"one {str(dtype).removeprefix('torch.')} element; the device stores whole "
                f"elements into a CUDA region")
        return CudaPlan(region.data, offset, shape, dtype, region)

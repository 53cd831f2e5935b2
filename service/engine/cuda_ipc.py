"""Device memory of another process on this node, opened from its ``cudaIpcMemHandle_t``.

torch has no public call that opens a raw handle (its own IPC, ``torch.multiprocessing``,
passes handles of its caching allocator with a reference-counting file beside them), so the
CUDA driver (``libcuda.so.1``, present wherever a GPU is usable, whatever runtime torch was
built with) is called through ctypes, in the device's primary context, the one torch's
kernels run in: ``cuIpcOpenMemHandle`` maps the allocation into this process,
``cuMemGetAddressRange`` says how large it really is (a registration may not claim more),
and ``cuIpcCloseMemHandle`` unmaps it when the last holder lets go. The mapping is wrapped
as a uint8 torch tensor on its device through the ``__cuda_array_interface__`` protocol,
which torch reads without a copy; every tensor over it holds the mapping, so it is never
closed under a view. A runtime handle (``cudaIpcGetMemHandle``) and a driver handle
(``cuIpcGetMemHandle``) are the same 64 bytes.
"""

from __future__ import annotations

import contextlib
import ctypes
import functools
import threading
from collections.abc import Iterator
from typing import Any

import torch

from service.errors import FailedPrecondition, InvalidArgument

__all__ = ["HANDLE_BYTES", "Driver", "IpcMapping", "open_handle", "open_with"]

HANDLE_BYTES = 64  # sizeof(CUipcMemHandle) = sizeof(cudaIpcMemHandle_t)
_LAZY_PEER_ACCESS = 0x1  # CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS: the memory may be on another GPU


class _Handle(ctypes.Structure):
    _fields_ = [("reserved", ctypes.c_char * HANDLE_BYTES)]


def _symbol(lib: ctypes.CDLL, *names: str) -> Any:
    for name in names:  # the versioned entry point first, as cuda.h maps it
        with contextlib.suppress(AttributeError):
            return getattr(lib, name)
    raise FailedPrecondition(f"the CUDA driver has none of {', '.join(names)}")


class Driver:
    """The few driver entry points used here, typed (``lib``: libcuda.so.1)."""

    def __init__(self, lib: ctypes.CDLL) -> None:
        ptr, u64 = ctypes.POINTER, ctypes.c_uint64
        self.init = lib.cuInit
        self.device_get = lib.cuDeviceGet
        self.device_get.argtypes = (ptr(ctypes.c_int), ctypes.c_int)
        self.retain = lib.cuDevicePrimaryCtxRetain
        self.retain.argtypes = (ptr(ctypes.c_void_p), ctypes.c_int)
        self.push = _symbol(lib, "cuCtxPushCurrent_v2", "cuCtxPushCurrent")
        self.push.argtypes = (ctypes.c_void_p,)
        self.pop = _symbol(lib, "cuCtxPopCurrent_v2", "cuCtxPopCurrent")
        self.pop.argtypes = (ptr(ctypes.c_void_p),)
        self.open = _symbol(lib, "cuIpcOpenMemHandle_v2", "cuIpcOpenMemHandle")
        self.open.argtypes = (ptr(u64), _Handle, ctypes.c_uint)
        self.close = lib.cuIpcCloseMemHandle
        self.close.argtypes = (u64,)
        self.address_range = _symbol(lib, "cuMemGetAddressRange_v2", "cuMemGetAddressRange")
        self.address_range.argtypes = (ptr(u64), ptr(ctypes.c_size_t), u64)
        self.error_name = lib.cuGetErrorName
        self.error_name.argtypes = (ctypes.c_int, ptr(ctypes.c_char_p))
        self._contexts: dict[int, ctypes.c_void_p] = {}
        self.init(0)

    def error(self, code: int) -> str:
        """CUDA_ERROR_... for a result code."""
        name = ctypes.c_char_p()
        self.error_name(code, ctypes.byref(name))
        return (name.value or b"CUDA_ERROR").decode()

    @contextlib.contextmanager
    def on(self, device: int) -> Iterator[None]:
        """GPU ``device``'s primary context (torch's) current for the block."""
        ctx = self._contexts.get(device)
        if ctx is None:  # retained for the process's life: torch holds it as long
            dev, ctx = ctypes.c_int(), ctypes.c_void_p()
            for code in (self.device_get(ctypes.byref(dev), device),
                         self.retain(ctypes.byref(ctx), dev)):
                if code != 0:
                    raise FailedPrecondition(f"CUDA device {device}: {self.error(code)}")
            self._contexts[device] = ctx
        code = self.push(ctx)
        if code != 0:
            raise FailedPrecondition(f"CUDA device {device}: {self.error(code)}")
        try:
            yield
        finally:
            self.pop(ctypes.byref(ctypes.c_void_p()))


@functools.cache
def _driver() -> Driver:
    torch.cuda.init()  # the runtime's context first: the driver's calls run in it
    try:
        lib = ctypes.CDLL("libcuda.so.1")
    except OSError:
        raise FailedPrecondition("CUDA shared memory: the CUDA driver (libcuda.so.1) cannot "
                                 "be loaded in this server") from None
    return Driver(lib)


class IpcMapping:
    """One opened allocation: ``size`` bytes at ``address`` on GPU ``device``; unmapped when
    the last holder (a registered region, a request writing into it, a tensor over it)
    drops it."""

    __slots__ = ("__weakref__", "address", "device", "driver", "size")

    def __init__(self, driver: Driver, address: int, device: int, size: int) -> None:
        self.driver = driver
        self.address, self.device, self.size = address, device, size

    @property
    def __cuda_array_interface__(self) -> dict[str, object]:
        """The whole allocation as bytes, for ``torch.as_tensor`` (which keeps ``self``)."""
        return {"shape": (self.size,), "typestr": "|u1", "data": (self.address, False),
                "version": 2}

    def tensor(self) -> torch.Tensor:
        """The allocation as a uint8 tensor on its device, no copy; it holds this mapping."""
        return torch.as_tensor(self, device=torch.device("cuda", self.device))  # (size,)

    def __del__(self) -> None:
        # At interpreter shutdown torch may be gone: the process unmaps it anyway.
        with contextlib.suppress(Exception):
            torch.cuda.synchronize(self.device)  # nothing of ours still writes into it
        with contextlib.suppress(Exception), self.driver.on(self.device):
            self.driver.close(self.address)


_OPEN_LOCK = threading.Lock()


def open_handle(raw: bytes, device: int, byte_size: int, field: str = "raw_handle"
                ) -> IpcMapping:
    """Open ``raw`` (a parsed handle) on GPU ``device``: INVALID_ARGUMENT when CUDA refuses
    it, or when the allocation is smaller than ``byte_size``."""
    count = torch.cuda.device_count()
    if device >= count:
        raise InvalidArgument(f"device_id={device}: this server sees {count} CUDA device(s) "
                              f"(0..{count - 1})")
    return open_with(_driver(), raw, device, byte_size, field)


def open_with(driver: Driver, raw: bytes, device: int, byte_size: int,
              field: str = "raw_handle") -> IpcMapping:
    """``open_handle`` through ``driver``."""
    address = ctypes.c_uint64()
    base, size = ctypes.c_uint64(), ctypes.c_size_t()
    handle = _Handle.from_buffer_copy(raw)  # every byte: a handle holds zeros too
    with _OPEN_LOCK, driver.on(device):
        code = driver.open(ctypes.byref(address), handle, _LAZY_PEER_ACCESS)
        if code != 0:
            raise InvalidArgument(f"{field}: cuIpcOpenMemHandle on device {device} refused "
                                  f"it: {driver.error(code)}; a handle comes from "
                                  f"cudaIpcGetMemHandle in another process on this node")
        if driver.address_range(ctypes.byref(base), ctypes.byref(size), address) != 0:
            base.value, size.value = address.value, 0  # unknown: refused below as too small
    mapping = IpcMapping(driver, int(address.value), device,
                         int(size.value) - (int(address.value) - int(base.value)))
    if byte_size > mapping.size:  # dropping the mapping closes the handle
        raise InvalidArgument(f"byte_size={byte_size} exceeds the {mapping.size} bytes of "
                              f"the allocation {field} names")
    return mapping

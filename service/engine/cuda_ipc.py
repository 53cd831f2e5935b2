"""Device memory of another process on this node, opened from its ``cudaIpcMemHandle_t``.

torch has no public call that opens a raw handle (its own IPC, ``torch.multiprocessing``,
passes handles of its caching allocator with a reference-counting file beside them), so the
CUDA runtime is called here through ctypes: ``cudaIpcOpenMemHandle`` maps the allocation
into this process, the driver's ``cuMemGetAddressRange`` says how large it really is (a
registration may not claim more), and ``cudaIpcCloseMemHandle`` unmaps it when the last
holder lets go. The mapping is wrapped as a uint8 torch tensor on its device through the
``__cuda_array_interface__`` protocol, which torch reads without a copy; every tensor over
it holds the mapping, so it is never closed under a view.

The runtime is the one torch loaded (found in the process's own mappings), so the device
this thread has current and the errors it reports are torch's too; a failed call's error is
cleared before torch can see it.
"""

from __future__ import annotations

import contextlib
import ctypes
import ctypes.util
import functools
import threading
from pathlib import Path

import torch

from service.errors import FailedPrecondition, InvalidArgument

__all__ = ["HANDLE_BYTES", "IpcMapping", "open_handle"]

HANDLE_BYTES = 64  # sizeof(cudaIpcMemHandle_t): CUDA_IPC_HANDLE_SIZE
_LAZY_PEER_ACCESS = 0x1  # cudaIpcMemLazyEnablePeerAccess: the allocation may be on another GPU
_RUNTIME_NAMES = ("libcudart.so", "libcudart.so.13", "libcudart.so.12", "libcudart.so.11.0")


class _Handle(ctypes.Structure):
    _fields_ = [("reserved", ctypes.c_char * HANDLE_BYTES)]


@functools.cache
def _runtime() -> ctypes.CDLL:
    """libcudart: the copy torch loaded, else the first found by name."""
    torch.cuda.init()
    paths = [line.split()[-1] for line in Path("/proc/self/maps").read_text().splitlines()
             if "/libcudart" in line]
    found = ctypes.util.find_library("cudart")
    for name in [*dict.fromkeys(paths), *_RUNTIME_NAMES, *([found] if found else [])]:
        try:
            lib = ctypes.CDLL(name)
        except OSError:
            continue
        lib.cudaIpcOpenMemHandle.argtypes = (ctypes.POINTER(ctypes.c_void_p), _Handle,
                                             ctypes.c_uint)
        lib.cudaIpcCloseMemHandle.argtypes = (ctypes.c_void_p,)
        lib.cudaSetDevice.argtypes = (ctypes.c_int,)
        lib.cudaGetErrorName.restype = ctypes.c_char_p
        lib.cudaGetErrorString.restype = ctypes.c_char_p
        return lib
    raise FailedPrecondition("CUDA shared memory: no CUDA runtime library (libcudart) can be "
                             "loaded in this server")


@functools.cache
def _driver() -> ctypes.CDLL:
    lib = ctypes.CDLL("libcuda.so.1")  # present wherever a CUDA device is usable
    lib.cuMemGetAddressRange_v2.argtypes = (ctypes.POINTER(ctypes.c_uint64),
                                            ctypes.POINTER(ctypes.c_size_t), ctypes.c_uint64)
    return lib


def _error(lib: ctypes.CDLL, code: int) -> str:
    lib.cudaGetLastError()  # a failed IPC call must not surface in torch's next check
    name = lib.cudaGetErrorName(code) or b"cudaError"
    text = lib.cudaGetErrorString(code) or b""
    return f"{name.decode()} ({text.decode()})"


class IpcMapping:
    """One opened allocation: ``size`` bytes at ``address`` on GPU ``device``; unmapped when
    the last holder (a registered region, a request writing into it, a tensor over it)
    drops it."""

    __slots__ = ("__weakref__", "address", "device", "size")

    def __init__(self, address: int, device: int, size: int) -> None:
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
            lib = _runtime()
            with torch.cuda.device(self.device):
                lib.cudaSetDevice(self.device)
                torch.cuda.synchronize(self.device)  # nothing of ours still writes into it
                if lib.cudaIpcCloseMemHandle(ctypes.c_void_p(self.address)) != 0:
                    lib.cudaGetLastError()


_OPEN_LOCK = threading.Lock()


def open_handle(raw: bytes, device: int, byte_size: int, field: str = "raw_handle"
                ) -> IpcMapping:
    """Open ``raw`` (a parsed handle) on GPU ``device``: INVALID_ARGUMENT when CUDA refuses
    it, or when the allocation is smaller than ``byte_size``."""
    count = torch.cuda.device_count()
    if device >= count:
        raise InvalidArgument(f"device_id={device}: this server sees {count} CUDA device(s) "
                              f"(0..{count - 1})")
    lib = _runtime()
    pointer = ctypes.c_void_p()
    with _OPEN_LOCK, torch.cuda.device(device):
        lib.cudaSetDevice(device)
        code = lib.cudaIpcOpenMemHandle(ctypes.byref(pointer), _Handle(raw), _LAZY_PEER_ACCESS)
        if code != 0:
            raise InvalidArgument(f"{field}: cudaIpcOpenMemHandle on device {device} "
                                  f"refused it: {_error(lib, code)}; a handle comes from "
                                  f"cudaIpcGetMemHandle in another process on this node")
        address = int(pointer.value or 0)
        base, size = ctypes.c_uint64(), ctypes.c_size_t()
        if _driver().cuMemGetAddressRange_v2(ctypes.byref(base), ctypes.byref(size),
                                             address) != 0:
            size.value, base.value = 0, address  # unknown: refused below as too small
    mapping = IpcMapping(address, device, int(size.value) - (address - int(base.value)))
    if byte_size > mapping.size:
        raise InvalidArgument(f"byte_size={byte_size} exceeds the {mapping.size} bytes of "
                              f"the allocation {field} names")
    return mapping

"""Rows in device memory, handed to any array library without a copy (DLPack).

``torch.from_dlpack(rows)`` (or CuPy's, JAX's) gives a tensor over the same memory on its
device: this is how a CUDA region's rows reach a consumer while the client itself imports no
array library but numpy. Built with ctypes against the DLPack C ABI (``dlpack.h``: a
``DLManagedTensor`` in a capsule named "dltensor"); the structure, its shape array and
whatever owns the memory stay alive until the consumer's tensor calls the deleter (or the
capsule is dropped unused).
"""

from __future__ import annotations

import ctypes
import threading
from collections.abc import Sequence
from typing import Any

from genproto.embedding.v1 import embedding_pb2 as pb

__all__ = ["CPU", "CUDA", "DeviceRows"]

CPU, CUDA = 1, 2  # DLDeviceType kDLCPU, kDLCUDA
_FLOAT, _BFLOAT = 2, 4  # DLDataTypeCode kDLFloat, kDLBfloat
_CODES: dict[int, tuple[int, int]] = {  # wire dtype -> (DLDataTypeCode, bits)
    pb.DTYPE_FLOAT32: (_FLOAT, 32), pb.DTYPE_FLOAT16: (_FLOAT, 16),
    pb.DTYPE_BFLOAT16: (_BFLOAT, 16)}
_NAME = b"dltensor"


class _Device(ctypes.Structure):
    _fields_ = [("device_type", ctypes.c_int), ("device_id", ctypes.c_int)]


class _DataType(ctypes.Structure):
    _fields_ = [("code", ctypes.c_uint8), ("bits", ctypes.c_uint8), ("lanes", ctypes.c_uint16)]


class _Tensor(ctypes.Structure):
    _fields_ = [("data", ctypes.c_void_p), ("device", _Device), ("ndim", ctypes.c_int),
                ("dtype", _DataType), ("shape", ctypes.POINTER(ctypes.c_int64)),
                ("strides", ctypes.POINTER(ctypes.c_int64)), ("byte_offset", ctypes.c_uint64)]


_Deleter = ctypes.CFUNCTYPE(None, ctypes.c_void_p)


class _Managed(ctypes.Structure):
    _fields_ = [("dl_tensor", _Tensor), ("manager_ctx", ctypes.c_void_p),
                ("deleter", _Deleter)]


# address of a _Managed -> what it keeps alive (itself, its shape, the memory's owner)
_LIVE: dict[int, tuple[Any, ...]] = {}
_LIVE_LOCK = threading.Lock()


@_Deleter
def _delete(address: int) -> None:
    """The consumer is done with the tensor: let its structures (and owner) go."""
    with _LIVE_LOCK:
        _LIVE.pop(int(address), None)


_api = ctypes.pythonapi
_api.PyCapsule_New.restype = ctypes.py_object
_api.PyCapsule_New.argtypes = (ctypes.c_void_p, ctypes.c_char_p, ctypes.c_void_p)
_api.PyCapsule_IsValid.argtypes = (ctypes.py_object, ctypes.c_char_p)
_api.PyCapsule_GetPointer.restype = ctypes.c_void_p
_api.PyCapsule_GetPointer.argtypes = (ctypes.py_object, ctypes.c_char_p)


@ctypes.CFUNCTYPE(None, ctypes.c_void_p)
def _capsule_gone(capsule: int) -> None:
    """A capsule dropped before any library took it (its name is still "dltensor")."""
    obj = ctypes.cast(capsule, ctypes.py_object)
    if _api.PyCapsule_IsValid(obj, _NAME):
        _delete(_api.PyCapsule_GetPointer(obj, _NAME))


class DeviceRows:
    """``shape`` elements of the wire ``dtype`` at ``address`` on a device (``CUDA`` and a
    GPU index, or ``CPU``), kept alive by ``owner``; a DLPack producer."""

    def __init__(self, address: int, dtype: int, shape: Sequence[int], device_id: int,
                 owner: object, device_type: int = CUDA) -> None:
        if dtype not in _CODES:
            raise ValueError(f"unknown tensor dtype {dtype}")
        self.address, self.dtype, self.shape = address, dtype, tuple(int(n) for n in shape)
        self.device = (device_type, device_id)
        self.owner = owner

    def __dlpack_device__(self) -> tuple[int, int]:
        """(DLDeviceType, device index)."""
        return self.device

    def __dlpack__(self, *, stream: int | None = None) -> object:
        """A "dltensor" capsule over the rows. ``stream`` needs no wait: the server
        synchronised its device before it answered."""
        shape = (ctypes.c_int64 * len(self.shape))(*self.shape)
        code, bits = _CODES[self.dtype]
        managed = _Managed(_Tensor(self.address, _Device(*self.device), len(self.shape),
                                   _DataType(code, bits, 1), shape, None, 0), None, _delete)
        address = ctypes.addressof(managed)
        with _LIVE_LOCK:
            _LIVE[address] = (managed, shape, self.owner)
        return _api.PyCapsule_New(address, _NAME, ctypes.cast(_capsule_gone, ctypes.c_void_p))

"""cuda_ipc's ctypes layer against the CUDA driver's C signatures (``fake_cuda_driver.c``,
built here): the handle's 64 bytes reach cuIpcOpenMemHandle by value, zeros included; the
allocation's size bounds a registration; a refusal names CUDA's error; every context pushed
is popped; a mapping is closed when its last holder drops it. The real driver opening a real
handle is test_cuda_shm_gpu.py's."""

from __future__ import annotations

import ctypes
import gc

import grpc
import pytest

from service.engine.cuda_ipc import Driver, open_with
from service.errors import EmbedError
from tests.service.engine.cuda_memory import fake_driver

RAW = bytes(i + 1 if i % 3 else 0 for i in range(64))  # a third of it zero bytes


@pytest.fixture(scope="module")
def lib(tmp_path_factory: pytest.TempPathFactory) -> ctypes.CDLL:
    path = fake_driver(tmp_path_factory.mktemp("fake-cuda"))
    lib = ctypes.CDLL(str(path))
    lib.fake_seen.restype = ctypes.POINTER(ctypes.c_ubyte * 64)
    lib.fake_memory.restype = ctypes.c_size_t
    return lib


def count(lib: ctypes.CDLL, which: str) -> int:
    return int(lib.fake_count(("pushed", "popped", "closed", "freed").index(which)))


def test_the_handle_reaches_the_driver_whole(lib: ctypes.CDLL) -> None:
    driver = Driver(lib)
    pushed = count(lib, "pushed")
    mapping = open_with(driver, RAW, 1, 4096)
    assert bytes(lib.fake_seen().contents) == RAW
    memory = lib.fake_memory()
    assert (mapping.address, mapping.device, mapping.size) == (memory + 256, 1, 65536 - 256)
    assert count(lib, "pushed") == count(lib, "popped") == pushed + 1
    closed = count(lib, "closed")
    del mapping
    gc.collect()
    assert count(lib, "closed") == closed + 1


def test_refusals_name_the_field_and_cuda_error(lib: ctypes.CDLL) -> None:
    driver = Driver(lib)
    gc.collect()
    closed = count(lib, "closed")

    def refusal(raw: bytes, device: int, size: int) -> tuple[grpc.StatusCode, str]:
        with pytest.raises(EmbedError) as info:
            open_with(driver, raw, device, size)
        return info.value.code, str(info.value)

    assert refusal(RAW, 0, 65536 - 255) == (
        grpc.StatusCode.INVALID_ARGUMENT,
        "byte_size=65281 exceeds the 65280 bytes of the allocation raw_handle names")
    gc.collect()
    assert count(lib, "closed") == closed + 1  # the refused mapping was closed again
    assert refusal(b"\x07" + RAW[1:], 0, 8) == (
        grpc.StatusCode.INVALID_ARGUMENT,
        "raw_handle: cuIpcOpenMemHandle on device 0 refused it: CUDA_ERROR_INVALID_VALUE; a "
        "handle comes from cudaIpcGetMemHandle in another process on this node")
    assert refusal(RAW, 5, 8) == (grpc.StatusCode.FAILED_PRECONDITION,
                                  "CUDA device 5: CUDA_ERROR_INVALID_DEVICE")
    assert count(lib, "pushed") == count(lib, "popped")

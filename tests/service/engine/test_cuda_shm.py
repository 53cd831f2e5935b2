"""The CUDA shared-memory registry: handle parsing, the device refusal, tenancy, bounds and
caps; and its device write (``cuda_plan``), run on CPU tables into host bytes, equal bit for
bit to the host path's answer for every dtype and compose (the HF families' rules in
test_cuda_shm_families.py). The registry's opener is ``cuda_memory.HostOpener`` here; the
CUDA runtime's open is in the gpu-marked tests."""

from __future__ import annotations

import gc
from collections.abc import Callable

import grpc
import numpy as np
import pytest
import torch

from client import EmbeddingClient
from service.engine.cuda_shm import CudaSharedMemoryRegistry, parse_handle
from service.engine.shm import SharedMemoryRegistry
from service.errors import EmbedError
from service.local import ServerHandle
from tests.service.engine.cuda_memory import HANDLE, HostOpener, Who, handle, registry
from tests.tiny_model import DIM

IDS = [31373, 995, 0, 50256, 7, 11]
ALICE, BOB = Who("alice"), Who("bob")
TORCH_DTYPES = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}
COMPOSES = {"token+position": 0, "token": 1, "position": 2}


def refusal(call: Callable[[], object]) -> tuple[grpc.StatusCode, str]:
    with pytest.raises(EmbedError) as info:
        call()
    return info.value.code, str(info.value)


@pytest.mark.parametrize(("raw", "device", "size", "message"), [
    (b"", 0, 8, "raw_handle of region 'r' has 0 bytes; a cudaIpcMemHandle_t has 64"),
    (b"\1" * 63, 0, 8, "raw_handle of region 'r' has 63 bytes; a cudaIpcMemHandle_t has 64"),
    (b"\1" * 65, 0, 8, "raw_handle of region 'r' has 65 bytes; a cudaIpcMemHandle_t has 64"),
    (bytes(64), 0, 8, "raw_handle of region 'r' is all zero bytes: not a handle from "
                      "cudaIpcGetMemHandle"),
    (HANDLE, -1, 8, "device_id=-1 of region 'r' must be a GPU index >= 0"),
    (HANDLE, 1 << 16, 8, "device_id=65536 of region 'r' must be a GPU index >= 0"),
    (HANDLE, 0, 0, "byte_size=0 of region 'r' must be > 0"),
])
def test_handle_parsing(raw: bytes, device: int, size: int, message: str) -> None:
    assert refusal(lambda: parse_handle(raw, device, size, "r")) == (
        grpc.StatusCode.INVALID_ARGUMENT, message)


def test_parsed_handle_is_its_64_bytes() -> None:
    raw = bytes(range(1, 65))
    assert parse_handle(bytearray(raw), 3, 1, "r") == raw


def test_cpu_server_refuses_after_checking_the_request() -> None:
    opener = HostOpener()
    cpu = CudaSharedMemoryRegistry(torch.device("cpu"), opener=opener)
    precondition = (grpc.StatusCode.FAILED_PRECONDITION,
                    "this server's tables are on cpu; CUDA shared memory needs --device cuda")
    assert refusal(lambda: cpu.register(ALICE, "r", HANDLE, 0, 64)) == precondition
    assert refusal(lambda: cpu.plan(ALICE, "r", 0, (2, DIM), torch.float32, "output")) == \
        precondition
    # the request's own mistakes first: they are the client's to fix wherever it sends them
    assert refusal(lambda: cpu.register(ALICE, "r", HANDLE[:8], 0, 64))[0] == \
        grpc.StatusCode.INVALID_ARGUMENT
    assert refusal(lambda: cpu.register(ALICE, "", HANDLE, 0, 64)) == (
        grpc.StatusCode.INVALID_ARGUMENT, "region name is empty")
    assert opener.opened == []
    assert cpu.regions(ALICE) == []


def test_regions_belong_to_their_owner() -> None:
    opener = HostOpener()
    reg = registry(opener)
    reg.register(ALICE, "a", HANDLE, 0, 256)
    reg.register(BOB, "b", handle(2), 0, 256)
    assert [r.name for r in reg.regions(ALICE)] == ["a"]
    assert [r.name for r in reg.regions(BOB)] == ["b"]
    not_found = (grpc.StatusCode.NOT_FOUND, "CUDA region 'a' is not registered")
    assert refusal(lambda: reg.regions(BOB, "a")) == not_found
    assert refusal(lambda: reg.plan(BOB, "a", 0, (1, DIM), torch.float32, "output")) == \
        not_found
    assert refusal(lambda: reg.unregister(BOB, "a")) == not_found
    reg.unregister(BOB, "")  # every one of bob's own, none of alice's
    assert ([r.name for r in reg.regions(ALICE)], reg.regions(BOB)) == (["a"], [])
    assert (reg.owns(ALICE, "a"), reg.owns(BOB, "a"), reg.owns(ALICE, "")) == \
        (True, False, False)
    # one allocation, one owner: bob cannot register alice's handle under any name
    assert refusal(lambda: reg.register(BOB, "mine", HANDLE, 0, 256)) == (
        grpc.StatusCode.PERMISSION_DENIED,
        "the allocation raw_handle names is registered by another client (region 'mine')")
    # the owner may name it twice: opened once, both regions over the same bytes
    second = reg.register(ALICE, "a2", HANDLE, 0, 128)
    (first,) = reg.regions(ALICE, "a")
    assert [h for h, _, _ in opener.opened] == [HANDLE, handle(2)]
    assert second.memory is first.memory
    assert (first.device_id, first.byte_size, second.byte_size) == (0, 256, 128)


def test_registration_refusals() -> None:
    opener = HostOpener(size=1000)
    host = SharedMemoryRegistry()
    reg = registry(opener, host, max_per_identity=2, max_regions=3)
    reg.register(ALICE, "a", HANDLE, 0, 1000)
    assert refusal(lambda: reg.register(ALICE, "a", handle(5), 0, 8)) == (
        grpc.StatusCode.ALREADY_EXISTS, "region 'a' is already registered; unregister it first")
    assert refusal(lambda: reg.register(ALICE, "a2", HANDLE, 0, 1001)) == (
        grpc.StatusCode.INVALID_ARGUMENT,
        "byte_size=1001 exceeds the 1000 bytes of the allocation raw_handle names")
    reg.register(ALICE, "b", handle(2), 0, 8)
    assert refusal(lambda: reg.register(ALICE, "c", handle(3), 0, 8)) == (
        grpc.StatusCode.RESOURCE_EXHAUSTED, "2 CUDA regions registered by this client: "
        "max_shm_regions_per_identity=2; unregister one first")
    reg.register(BOB, "c", handle(3), 0, 8)
    assert refusal(lambda: reg.register(Who("carol"), "d", handle(4), 0, 8)) == (
        grpc.StatusCode.RESOURCE_EXHAUSTED,
        "3 CUDA regions registered: max_shm_regions=3; retry later")
    assert refusal(lambda: reg.register(Who("carol"), "\x00", handle(4), 0, 8)) == (
        grpc.StatusCode.INVALID_ARGUMENT,
        "region name '\\x00' must be printable and at most 128 characters")
    assert refusal(lambda: reg.register(Who("bob", "ipv4:10.1.2.3:5"), "d", handle(4), 0, 8)
                   ) == (grpc.StatusCode.PERMISSION_DENIED,
                         "shared-memory calls are served to local peers only (loopback or a "
                         "Unix socket); this peer is not local (the server's "
                         "--shm-allow-remote enables them)")
    assert len(opener.opened) == 3  # no refusal opened anything


def test_names_are_one_namespace_with_host_regions(tmp_path: object) -> None:
    from client.shm import SharedMemoryRegion

    host = SharedMemoryRegistry()
    reg = registry(HostOpener(), host)
    with SharedMemoryRegion("h", 4096) as region:
        host.register(ALICE, "h", region.key, 0, 4096)
        try:
            assert refusal(lambda: reg.register(ALICE, "h", HANDLE, 0, 8)) == (
                grpc.StatusCode.ALREADY_EXISTS,
                "region 'h' is already registered; unregister it first")
            reg.register(BOB, "h", HANDLE, 0, 8)  # another identity's namespace
            reg.register(ALICE, "c", handle(2), 0, 8)
            assert refusal(lambda: reg.check_free(ALICE, "c")) == (
                grpc.StatusCode.ALREADY_EXISTS,
                "region 'c' is already registered (a CUDA region); unregister it first")
            reg.check_free(ALICE, "h")  # a host name: the host registry answers for it
            reg.check_free(BOB, "c")
        finally:
            host.unregister(ALICE, "")
            del region


def test_bounds_are_checked_before_any_work() -> None:
    reg = registry(HostOpener())
    reg.register(ALICE, "r", HANDLE, 0, 4096)
    row = DIM * 4

    def plan(offset: int, T: int, dtype: torch.dtype = torch.float32,
             byte_size: int | None = None) -> tuple[grpc.StatusCode, str]:
        return refusal(lambda: reg.plan(ALICE, "r", offset, (T, DIM), dtype, "output",
                                        byte_size))

    assert plan(100, 64) == (grpc.StatusCode.INVALID_ARGUMENT,
                             "output: the output needs 4096 bytes at offset 100 but CUDA region "
                             "'r' has 4096 bytes; the largest T that fits is 62")
    assert plan(0, 9, byte_size=8 * row) == (
        grpc.StatusCode.INVALID_ARGUMENT, "output: the output needs 576 bytes at offset 0 but "
        "the request allows 512 bytes; the largest T that fits is 8")
    assert plan(4097, 1) == (grpc.StatusCode.INVALID_ARGUMENT,
                             "output: the output needs 64 bytes at offset 4097 but CUDA region "
                             "'r' has 4096 bytes; the largest T that fits is 0")
    assert plan(6, 2) == (grpc.StatusCode.INVALID_ARGUMENT,
                          "output: offset 6 is not a multiple of 4, the size of one float32 "
                          "element; the device stores whole elements into a CUDA region")
    assert plan(3, 2, torch.bfloat16) == (
        grpc.StatusCode.INVALID_ARGUMENT, "output: offset 3 is not a multiple of 2, the size "
        "of one bfloat16 element; the device stores whole elements into a CUDA region")
    assert refusal(lambda: reg.plan(ALICE, "", 0, (1, DIM), torch.float32, "output")) == (
        grpc.StatusCode.INVALID_ARGUMENT, "output.region is empty: name a registered region")
    fits = reg.plan(ALICE, "r", 6, (2, DIM), torch.float16, "output")
    assert (fits.byte_size, fits.rows.shape, fits.rows.dtype) == (2 * DIM * 2, (2, DIM),
                                                                  torch.float16)
    assert fits.rows.data_ptr() == reg.regions(ALICE, "r")[0].data.data_ptr() + 6


def test_memory_is_released_after_the_last_holder() -> None:
    opener = HostOpener()
    reg = registry(opener)
    reg.register(ALICE, "r", HANDLE, 0, 64)
    plan = reg.plan(ALICE, "r", 0, (1, DIM), torch.float32, "output")
    reg.unregister(ALICE, "r")
    del opener.memory[HANDLE]
    gc.collect()
    assert list(reg._opened) == [HANDLE]  # the request in flight still holds it
    reg.register(ALICE, "again", HANDLE, 0, 64)  # reopened? no: the same memory
    assert len(opener.opened) == 1
    reg.unregister(ALICE, "")
    del plan
    gc.collect()
    assert list(reg._opened) == []


@pytest.mark.parametrize("dtype", list(TORCH_DTYPES))
@pytest.mark.parametrize("compose", list(COMPOSES))
def test_device_write_equals_the_host_path(server: ServerHandle, dtype: str,
                                           compose: str) -> None:
    """The tiny model (learned positions; the one-pass kernel serves its host path) and the
    rope model (no position table)."""
    reg = registry(HostOpener())
    reg.register(ALICE, "r", HANDLE, 0, 1 << 16)
    with EmbeddingClient(server.target, raw_bfloat16=True) as c:
        for model in ("tiny", "rope"):
            tables = server.server.repo.get(model, 0).tables
            if compose == "position" and tables.position_table is None:
                continue  # FAILED_PRECONDITION before any lookup (test_status_codes)
            want = c.embed(ids=IDS, model=model, dtype=dtype, compose=compose,
                           start_position=5).array.tobytes()
            plan = reg.plan(ALICE, "r", 256, (len(IDS), DIM), TORCH_DTYPES[dtype], "output")
            dest = plan.destination(lambda timing: "answer")
            assert dest.lookup(tables, np.array(IDS, dtype=np.int64), [(5, len(IDS))],
                               COMPOSES[compose]) is True
            assert dest.finish(None) == "answer"  # type: ignore[arg-type]
            got = reg.regions(ALICE, "r")[0].data[256: 256 + len(want)]
            assert got.numpy().tobytes() == want, model


def test_padded_batch_zeroes_the_rows_past_each_sequence(server: ServerHandle) -> None:
    """OIP's [B, T, C] with sequences of 3, 1 and 2 tokens: each sequence's rows at its
    slot, zeros after, as the host path pads; a batch of equal lengths is one packed write."""
    reg = registry(HostOpener())
    reg.register(ALICE, "r", HANDLE, 0, 1 << 16)
    reg.regions(ALICE, "r")[0].data.fill_(0xAB)  # stale bytes a padded row must not keep
    tables = server.server.repo.get("tiny", 0).tables
    seqs = [IDS[:3], IDS[3:4], IDS[4:6]]
    plan = reg.plan(ALICE, "r", 0, (3, 3, DIM), torch.float32, "outputs['embeddings']")
    dest = plan.destination(lambda timing: None, lengths=[3, 1, 2])
    dest.lookup(tables, np.array(IDS, dtype=np.int64), [(0, 3), (0, 1), (0, 2)], 0)
    rows = plan.rows  # (3, 3, C)
    with EmbeddingClient(server.target) as c:
        for b, ids in enumerate(seqs):
            want = torch.from_numpy(c.embed(ids=ids).array.copy())  # (n, C)
            assert torch.equal(rows[b, :len(ids)], want)
            assert not rows[b, len(ids):].any()
        same = reg.plan(ALICE, "r", 0, (2, 3, DIM), torch.float32, "x")
        same.destination(lambda timing: None, lengths=[3, 3]).lookup(
            tables, np.array(IDS, dtype=np.int64), [(0, 3), (0, 3)], 0)
        assert torch.equal(same.rows[1], torch.from_numpy(c.embed(ids=IDS[3:]).array.copy()))

"""Shared-memory rows stored straight into the region's mapping by the guarded one-pass
lookup: exact, and an object shrunk between the size check and the stores (a SIGBUS in
the write) fails that request with FAILED_PRECONDITION while the process goes on."""

from __future__ import annotations

import os
from collections.abc import Iterator

import numpy as np
import pytest
import torch

from client.shm import SharedMemoryRegion
from service.engine.shm import SharedMemoryRegistry
from service.engine.shm_region import Region
from service.engine.tables import COMPOSE_TOKEN_PLUS_POSITION, EmbeddingTables
from service.errors import FailedPrecondition

C = 1024  # 4 KiB fp32 rows: one page each


class _Caller:
    identity = ""
    peer = "unix:/tmp/x"


@pytest.fixture
def tables() -> EmbeddingTables:
    g = torch.Generator().manual_seed(3)
    return EmbeddingTables(torch.randn(50, C, generator=g), torch.randn(16, C, generator=g),
                           torch.device("cpu"))


@pytest.fixture
def region() -> Iterator[SharedMemoryRegion]:
    with SharedMemoryRegion("direct", 8 * C * 4) as r:
        yield r


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_rows_go_straight_into_the_mapping(tables: EmbeddingTables,
                                           region: SharedMemoryRegion,
                                           dtype: torch.dtype) -> None:
    registry = SharedMemoryRegistry()
    registry.register(_Caller(), "r", region.key, 0, region.byte_size)
    plan = registry.plan(_Caller(), "r", C * 4, (4, C), dtype, "output")  # at a row offset
    ids = np.array([3, 1, 4, 1], dtype=np.int64)
    assert plan.lookup(tables, ids, [(2, 4)], COMPOSE_TOKEN_PLUS_POSITION)
    plan.write()  # nothing left to copy
    expected = (tables.token_table[ids] + tables.position_table[2:6]).to(dtype)  # type: ignore[index]
    got = torch.frombuffer(bytearray(region.mapping[C * 4: C * 4 + plan.byte_size]),
                           dtype=dtype).view(4, C)
    assert torch.equal(got.view(torch.uint8), expected.view(torch.uint8))


def test_a_shrink_racing_the_check_fails_that_request_only(
        tables: EmbeddingTables, region: SharedMemoryRegion,
        monkeypatch: pytest.MonkeyPatch) -> None:
    registry = SharedMemoryRegistry()
    registry.register(_Caller(), "r", region.key, 0, region.byte_size)
    plan = registry.plan(_Caller(), "r", 0, (8, C), torch.float32, "output")
    checks: list[int] = []
    real_check = Region.check

    def racing_check(self: Region, at: int, n: int) -> None:
        checks.append(n)
        if len(checks) == 1:  # passes, then the owner shrinks the object
            real_check(self, at, n)
            os.truncate(f"/dev/shm/{region.key.lstrip('/')}", 2 * C * 4)
        else:
            real_check(self, at, n)

    monkeypatch.setattr(Region, "check", racing_check)
    with pytest.raises(FailedPrecondition, match="shrunk below the 32768"):
        plan.lookup(tables, np.arange(8, dtype=np.int64), [(0, 8)], COMPOSE_TOKEN_PLUS_POSITION)
    # The process goes on, and a request that fits what is left is written.
    small = registry.plan(_Caller(), "r", 0, (2, C), torch.float32, "output")
    assert small.lookup(tables, np.array([5, 6], dtype=np.int64), [(0, 2)],
                        COMPOSE_TOKEN_PLUS_POSITION)

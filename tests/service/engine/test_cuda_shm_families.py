"""The CUDA region write (``cuda_plan``) for every family rule (``cuda_families``), dtype and
compose, on CPU tables into host bytes: bit for bit the host path's answer from the same
server. The same
comparison with the tables on a GPU and a real CUDA region is
test_cuda_shm_gpu.py::test_every_family_dtype_and_compose."""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np
import pytest
import torch

from client import EmbeddingClient, EmbeddingError
from service.local import ServerHandle
from tests.service.engine.cuda_families import FAMILIES, FAMILY_IDS, family_repo
from tests.service.engine.cuda_memory import HANDLE, HostOpener, Who, registry
from tests.tiny_model import start

DTYPES = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}
COMPOSES = {"token+position": 0, "token": 1, "position": 2}


@pytest.fixture(scope="module")
def families(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerHandle]:
    handle = start(family_repo(tmp_path_factory.mktemp("cuda-families")),
                   default_model="plain", metrics_port=-1)
    yield handle
    handle.stop()


@pytest.fixture(autouse=True)
def one_thread() -> Iterator[None]:
    """The lookups here run with the server's torch thread count (--torch-threads 1): OPT's
    project_in is a GEMM whose rounding depends on how many threads split it."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.mark.parametrize("name", list(FAMILIES))
def test_every_dtype_and_compose_equals_the_host_path(families: ServerHandle,
                                                      name: str) -> None:
    reg = registry(HostOpener(size=1 << 16))
    reg.register(Who(), "r", HANDLE, 0, 1 << 16)
    data = reg.regions(Who(), "r")[0].data
    tables = families.server.repo.get(name, 0).tables
    start_position = 3
    compared = []
    with EmbeddingClient(families.target, raw_bfloat16=True) as c:
        for dtype, torch_dtype in DTYPES.items():
            for compose, value in COMPOSES.items():
                try:
                    want = c.embed(ids=FAMILY_IDS, model=name, dtype=dtype, compose=compose,
                                   start_position=start_position).array
                except EmbeddingError as e:  # position-only without a table, fp16 range
                    compared.append((dtype, compose, e.code.name))
                    continue
                data.fill_(0xAB)
                plan = reg.plan(Who(), "r", 64, want.shape, torch_dtype, "output")
                plan.destination(lambda timing: None).lookup(
                    tables, np.array(FAMILY_IDS, dtype=np.int64),
                    [(start_position, len(FAMILY_IDS))], value)
                assert data[64: 64 + want.nbytes].numpy().tobytes() == want.tobytes(), \
                    (dtype, compose)
                compared.append((dtype, compose, "equal"))
    refused = [c for c in compared if c[2] != "equal"]
    no_positions = [(dtype, "position", "FAILED_PRECONDITION") for dtype in DTYPES]
    assert refused == (no_positions if tables.position_table is None else [])

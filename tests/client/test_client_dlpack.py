"""client.dlpack: rows handed to torch (and numpy) by DLPack with no copy, checked on host
memory (the same capsule, with kDLCPU where a CUDA region's says kDLCUDA): the tensor is a
view of the bytes, every wire dtype (bfloat16 included) keeps its type, and the owner of the
memory lives exactly as long as a tensor over it."""

from __future__ import annotations

import gc
import weakref

import numpy as np
import pytest
import torch

from client import dlpack
from client.dlpack import CPU, DeviceRows
from genproto.embedding.v1 import embedding_pb2 as pb


class Owner:
    """Memory some region object owns."""

    def __init__(self, values: torch.Tensor) -> None:
        self.values = values


@pytest.mark.parametrize(("wire", "dtype"), [(pb.DTYPE_FLOAT32, torch.float32),
                                             (pb.DTYPE_FLOAT16, torch.float16),
                                             (pb.DTYPE_BFLOAT16, torch.bfloat16)])
def test_torch_reads_the_rows_in_place(wire: int, dtype: torch.dtype) -> None:
    values = torch.randn(5, 3, generator=torch.Generator().manual_seed(0)).to(dtype)
    owner = Owner(values)
    rows = DeviceRows(values.data_ptr() + 3 * values.element_size(), wire, (4, 3), 0, owner,
                      device_type=CPU)
    tensor = torch.from_dlpack(rows)
    assert (tensor.dtype, tuple(tensor.shape), tensor.device.type) == (dtype, (4, 3), "cpu")
    assert tensor.data_ptr() == values.data_ptr() + 3 * values.element_size()
    assert torch.equal(tensor, values[1:])
    values[2, 1] = 7.0  # one memory: a write on either side is seen on the other
    assert float(tensor[1, 1]) == 7.0


def test_numpy_reads_them_too() -> None:
    values = torch.arange(6, dtype=torch.float32)
    rows = DeviceRows(values.data_ptr(), pb.DTYPE_FLOAT32, (2, 3), 0, Owner(values),
                      device_type=CPU)
    assert np.from_dlpack(rows).tolist() == [[0.0, 1.0, 2.0], [3.0, 4.0, 5.0]]


def test_the_owner_lives_as_long_as_a_tensor_over_it() -> None:
    values = torch.zeros(4)
    owner = Owner(values)
    alive = weakref.ref(owner)
    rows = DeviceRows(values.data_ptr(), pb.DTYPE_FLOAT32, (4,), 0, owner, device_type=CPU)
    tensor = torch.from_dlpack(rows)
    del owner, rows, values
    gc.collect()
    assert alive() is not None  # held by the tensor's DLPack structures
    del tensor
    gc.collect()
    assert alive() is None
    assert dlpack._LIVE == {}


def test_an_unused_capsule_releases_the_owner() -> None:
    values = torch.zeros(2)
    owner = Owner(values)
    alive = weakref.ref(owner)
    capsule = DeviceRows(values.data_ptr(), pb.DTYPE_FLOAT16, (4,), 0, owner,
                         device_type=CPU).__dlpack__()
    assert len(dlpack._LIVE) == 1
    del owner, capsule
    gc.collect()
    assert alive() is None
    assert dlpack._LIVE == {}


def test_device_and_dtype() -> None:
    rows = DeviceRows(1 << 20, pb.DTYPE_BFLOAT16, [2, 8], 3, None)
    assert (rows.__dlpack_device__(), rows.shape) == ((2, 3), (2, 8))
    with pytest.raises(ValueError) as info:
        DeviceRows(1 << 20, 9, [2], 0, None)
    assert str(info.value) == "unknown tensor dtype 9"

"""The one dtype table: wire enum, storage name, OIP datatype, safetensors code, torch dtype.

Every other module (replies, OIP tensors, checkpoint, config, importers) looks a dtype up
here, so a new dtype is one row. The client mirrors the wire half from the generated enum.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from genproto.embedding.v1 import embedding_pb2 as pb

__all__ = [
    "BY_NAME",
    "BY_OIP",
    "BY_TORCH",
    "BY_WIRE",
    "SAFETENSORS",
    "TABLE_DTYPE_NAMES",
    "DType",
]


@dataclass(frozen=True)
class DType:
    """One float dtype the service stores or returns, under each of its names."""

    wire: int  # embedding.v1.DType enum value
    name: str  # storage / CLI / metrics name ("float32")
    oip: str  # Open Inference Protocol datatype ("FP32")
    safetensors: str  # safetensors header code ("F32")
    torch: torch.dtype

    @property
    def itemsize(self) -> int:
        """Bytes per element."""
        return self.torch.itemsize


_ROWS = (
    DType(pb.DTYPE_FLOAT32, "float32", "FP32", "F32", torch.float32),
    DType(pb.DTYPE_FLOAT16, "float16", "FP16", "F16", torch.float16),
    # bfloat16 travels as its raw 2-byte bit pattern (numpy has no bfloat16).
    DType(pb.DTYPE_BFLOAT16, "bfloat16", "BF16", "BF16", torch.bfloat16),
)
BY_WIRE: dict[int, DType] = {d.wire: d for d in _ROWS}
BY_NAME: dict[str, DType] = {d.name: d for d in _ROWS}
BY_OIP: dict[str, DType] = {d.oip: d for d in _ROWS}
BY_TORCH: dict[torch.dtype, DType] = {d.torch: d for d in _ROWS}
TABLE_DTYPE_NAMES = tuple(BY_NAME)  # what a checkpoint may store and --table-dtype accepts
# Every safetensors code a checkpoint file may hold (floats above, plus row statistics).
SAFETENSORS: dict[str, torch.dtype] = {
    **{d.safetensors: d.torch for d in _ROWS},
    "F64": torch.float64, "I64": torch.int64, "I32": torch.int32, "U8": torch.uint8,
}

"""The REST infer answer laid out around its rows: a JSON header, then the binary outputs
in output order (Triton's binary tensor data extension), or the rows as JSON numbers
(``replies`` says why the engine, not the front, lays answers out)."""

from __future__ import annotations

import functools
from collections.abc import Sequence
from typing import Any, NamedTuple

import numpy as np
import orjson
import torch

from service.dtypes import BY_WIRE
from service.engine.admission import Admitted
from service.engine.batcher import Destination, Timing
from service.engine.cuda_plan import CudaPlan
from service.engine.message import MessageBuffer
from service.engine.replies import Reply, padded_shape
from service.engine.shm_plan import ShmPlan

__all__ = ["RestAnswer", "RestReply"]


class RestAnswer(NamedTuple):
    """A REST infer answer's body, its content type and, when binary data follows the
    JSON header, the header's length (``Inference-Header-Content-Length``). A tuple: one
    is built per answer, and a frozen dataclass's ``__init__`` costs a microsecond."""

    body: bytes
    content_type: str
    header_length: int | None


class RestReply(Reply[RestAnswer]):
    """The REST infer answer: a JSON header, then the binary outputs in output order
    (Triton's binary tensor data extension), or the rows as JSON numbers."""

    padded = True

    def __init__(self, request_id: str, outputs: list[tuple[str, bool]]) -> None:
        self._id = request_id
        self._outputs = tuple(outputs)  # (name, binary), in response order
        self._rows_binary = dict(outputs)["embeddings"]
        self._admitted: Admitted | None = None

    def prepare(self, admitted: Admitted, untrained: list[list[int]] | None) -> int:
        self._admitted = admitted
        B, T, C = padded_shape(admitted, True)
        # An upper bound, known now: the rows as binary, or as JSON numbers (at most 24
        # characters and a comma each), the sequence lengths, and the header (id escaped).
        values = B * T * C
        rows = values * admitted.itemsize if self._rows_binary else values * 25
        return rows + 24 * B * 2 + 4096 + 6 * len(self._id)

    def destination(self, region: ShmPlan | CudaPlan | None) -> Destination:
        admitted = self._admitted
        assert admitted is not None
        assert region is None  # REST answers carry their rows
        B, T, C = padded_shape(admitted, True)
        dtype = BY_WIRE[admitted.options.dtype]
        model, sequences = admitted.model, admitted.sequences
        facts = (model.name, model.version, model.checkpoint_id, sequences[0].start_position,
                 sum(f.truncated_tokens for f in sequences), B, T, C, dtype.oip,
                 dtype.itemsize, self._outputs, tuple(admitted.lengths))
        if not self._rows_binary:
            return _RestJson(_header(self._id, *facts), torch.empty(B * T, C, dtype=dtype.torch),
                             _lengths_raw(self._outputs, admitted.lengths) or None)
        # Requests repeat a few shapes: the answer to one sequence without an id reuses
        # its layout (a few hundred bytes each, at most 4096 of them).
        head, tail, header_length = (_cached_layout(*facts) if B == 1 and not self._id
                                     else _binary_layout(_header(self._id, *facts),
                                                         self._outputs, admitted.lengths))
        return _RestBinary(head, (B * T, C), dtype.torch, tail, header_length)


def _header(request_id: str, model: str, version: int, checkpoint_id: str,
            start_position: int, truncated: int, B: int, T: int, C: int, datatype: str,
            itemsize: int, outputs: tuple[tuple[str, bool], ...],
            lengths: tuple[int, ...]) -> dict[str, Any]:
    """The answer's JSON header (the rows and the binary outputs follow it)."""
    out = []
    for name, binary in outputs:
        if name == "embeddings":
            o: dict[str, Any] = {"name": name, "datatype": datatype, "shape": [B, T, C]}
            size = B * T * C * itemsize
        else:
            o = {"name": name, "datatype": "INT64", "shape": [B]}
            size = 8 * B
            if not binary:
                o["data"] = list(lengths)
        if binary:
            o["parameters"] = {"binary_data_size": size}
        out.append(o)
    return {"model_name": model, "model_version": str(version),
            **({"id": request_id} if request_id else {}),
            "parameters": {"checkpoint_id": checkpoint_id, "start_position": start_position,
                           "truncated_tokens": truncated},
            "outputs": out}


def _lengths_raw(outputs: tuple[tuple[str, bool], ...], lengths: Sequence[int]) -> bytes:
    """``sequence_lengths`` as binary, when asked for so (the bytes every binary output
    other than the rows holds); else nothing."""
    if not dict(outputs).get("sequence_lengths"):
        return b""
    return np.asarray(lengths, dtype="<i8").tobytes()


def _binary_layout(header: dict[str, Any], outputs: tuple[tuple[str, bool], ...],
                   lengths: Sequence[int]) -> tuple[bytes, bytes, int]:
    """What comes before the rows (the JSON header, the binary outputs before them), what
    comes after, and the header's length."""
    head = orjson.dumps(header)  # ~0.5 µs; json.dumps takes ~8
    lengths_raw = _lengths_raw(outputs, lengths)
    order = [n for n, b in outputs if b]
    at = order.index("embeddings")
    before = lengths_raw * at  # each binary output before the rows is the lengths
    after = lengths_raw * (len(order) - at - 1)
    return head + before, after, len(head)


@functools.lru_cache(maxsize=4096)
def _cached_layout(*facts: Any) -> tuple[bytes, bytes, int]:
    """``_binary_layout`` of a one-sequence answer without an id, kept for the next of its
    shape."""
    outputs, lengths = facts[-2], facts[-1]
    return _binary_layout(_header("", *facts), outputs, lengths)


class _RestBinary(MessageBuffer):
    """The binary body: the JSON header, the binary outputs before the rows, the rows,
    the ones after."""

    __slots__ = ("header_length",)

    def __init__(self, head: bytes, shape: tuple[int, int], dtype: torch.dtype, tail: bytes,
                 header_length: int) -> None:
        super().__init__(head, shape, dtype, tail)
        self.header_length = header_length

    def finish(self, timing: Timing) -> RestAnswer:  # type: ignore[override]
        return RestAnswer(super().finish(timing), "application/octet-stream",
                          self.header_length)


class _RestJson:
    """The rows in a private buffer, written out as JSON numbers once looked up."""

    __slots__ = ("_header", "_lengths_raw", "rows")

    def __init__(self, header: dict[str, Any], rows: torch.Tensor,
                 lengths_raw: bytes | None) -> None:
        self._header = header
        self.rows = rows  # (B*T, C)
        self._lengths_raw = lengths_raw  # sequence_lengths asked for as binary

    def finish(self, timing: Timing) -> RestAnswer:
        header = dict(self._header)
        header["outputs"] = [dict(o) for o in header["outputs"]]
        for o in header["outputs"]:
            if o["name"] == "embeddings":
                # Widened to float64 and printed as the shortest decimal that reads back as
                # that double: a reader's float32(double) is the row's value bit for bit
                # (a float32's own shortest decimal, read as a double, could round twice).
                # orjson writes numpy arrays in C: T=1024 x 768 in ~0.1 s, not ~0.7 s.
                o["data"] = self.rows.reshape(-1).numpy().astype(np.float64)
        head = orjson.dumps(header, option=orjson.OPT_SERIALIZE_NUMPY)
        if self._lengths_raw is not None:
            return RestAnswer(head + self._lengths_raw, "application/octet-stream", len(head))
        return RestAnswer(head, "application/json", None)

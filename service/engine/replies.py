"""Answers: each wire's response laid out around the rows, where the lookup writes them.

A front hands the engine a ``Reply`` with its request: the native ``EmbedResponse`` /
``EmbedBatchResponse`` (``NativeReply``), the Open Inference Protocol's
``ModelInferResponse`` (``OipReply``) or its REST body (``rest_reply.RestReply``). Why the
engine and not the front lays the answer out: the rows are written once, straight into the response
bytes (``message.MessageBuffer``), and where they start depends on what admission decided
(the model, T, the ids kept). So once a request is admitted the engine asks its reply for
the answer's size (``prepare``: every field but the rows and the timing), then for the
``Destination`` the batcher writes the rows into (``destination``): the response bytes, or
the caller's shared-memory region with a small message beside it. What the destination's
``finish`` returns is what ``Engine.embed`` returns: the answer, ready for the transport.

Native answers echo the ids and report untrained rows; OIP and REST answers are [B, T, C]
with rows past each sequence's length zeroed (``padded``).
"""

from __future__ import annotations

import functools
from collections.abc import Set as AbstractSet
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

import numpy as np

from genproto.embedding.v1 import embedding_pb2 as pb
from genproto.inference.v2 import grpc_service_pb2 as oip
from service.dtypes import BY_WIRE
from service.engine.admission import Admitted
from service.engine.batcher import Destination, Timing
from service.engine.cuda_plan import CudaPlan
from service.engine.message import (
    TIMING_BYTES,
    MessageBuffer,
    bytes_field_prefix,
    message_head,
    timing_tag,
)
from service.engine.shm_plan import ShmPlan
from service.engine.validation import TokenSequence

__all__ = ["NativeReply", "OipReply", "RegionOutput", "Reply", "padded_shape"]

R = TypeVar("R")
_RAW_OUTPUT_FIELD = 6  # ModelInferResponse.raw_output_contents


@dataclass(frozen=True)
class RegionOutput:
    """Rows written into one of the caller's registered shared-memory regions."""

    name: str
    offset: int
    byte_size: int | None  # the request's own bound (OIP's shared_memory_byte_size)
    field: str  # named in messages: "output", "outputs['embeddings']"
    cuda: bool | None = None  # a CUDA region; None: whichever kind the name is registered as


class Reply(Generic[R]):
    """One request's answer: ``prepare`` lays out every field but the rows (and returns
    the answer's size in bytes, for the answer budgets), then ``destination`` gives where
    the rows go; its ``finish`` returns the answer."""

    padded = False  # rows [B, T, C], zero past each sequence's end; else packed [ΣT, C]
    reports_untrained = False  # the answer lists untrained rows (``prepare`` gets them)
    region: RegionOutput | None = None

    def prepare(self, admitted: Admitted, untrained: list[list[int]] | None) -> int:
        raise NotImplementedError

    def destination(self, region: ShmPlan | CudaPlan | None) -> Destination:
        raise NotImplementedError


def padded_shape(admitted: Admitted, padded: bool) -> tuple[int, ...]:
    """(B, T, C) of a padded answer, (ΣT, C) of a packed one."""
    lengths = admitted.lengths
    if padded:
        return len(lengths), max(lengths), admitted.dim  # (B, T, C)
    return admitted.tokens, admitted.dim  # (ΣT, C)


def _echo(inp: pb.EmbedRequest | pb.EmbedInput, fitted: TokenSequence) -> Any:
    """The ids an answer echoes: the request's own repeated field when it was kept whole
    (no tensor -> list -> proto round trip), else the ids as fitted (tokenized, truncated)."""
    if inp.WhichOneof("input") == "token_ids" and not fitted.truncated_tokens:
        return inp.token_ids.ids
    return fitted.ids.tolist()


class NativeReply(Reply[bytes]):
    """``EmbedResponse`` (one input) or ``EmbedBatchResponse`` (its inputs, packed, with
    offsets): the rows in ``embeddings``, or in the region named by ``output``."""

    reports_untrained = True

    def __init__(self, request: pb.EmbedRequest | pb.EmbedBatchRequest) -> None:
        self._request = request
        if request.HasField("output"):
            output = request.output
            self.region = RegionOutput(output.region, output.offset, None, "output",
                                       output.cuda)
        self._fields: Any = None
        self._tail = b""  # the fields serialised (an answer in the message)
        self._shape = (0, 0)
        self._dtype = 0

    def prepare(self, admitted: Admitted, untrained: list[list[int]] | None) -> int:
        request, model = self._request, admitted.model
        assert untrained is not None
        if isinstance(request, pb.EmbedBatchRequest):
            items = [pb.BatchItem(token_ids=_echo(inp, f), start_position=f.start_position,
                                  truncated_tokens=f.truncated_tokens, untrained_token_indices=u)
                     for inp, f, u in zip(request.inputs, admitted.sequences, untrained)]
            self._fields = pb.EmbedBatchResponse(
                offsets=np.cumsum([0, *admitted.lengths]).tolist(), items=items,
                model=model.name, version=model.version, checkpoint_id=model.checkpoint_id,
                request_id=request.request_id)
        else:
            (fitted,), (indices,) = admitted.sequences, untrained
            self._fields = pb.EmbedResponse(
                token_ids=_echo(request, fitted), start_position=fitted.start_position,
                model=model.name, version=model.version, checkpoint_id=model.checkpoint_id,
                truncated_tokens=fitted.truncated_tokens, untrained_token_indices=indices,
                request_id=request.request_id)
        N, C = self._shape = (admitted.tokens, admitted.dim)
        self._dtype = admitted.options.dtype
        if self.region is not None:  # the fields grow once the region is known
            return self._fields.ByteSize() + TIMING_BYTES + 64
        self._tail = self._fields.SerializeToString()  # what follows the rows, but the timing
        return N * C * admitted.itemsize + len(self._tail) + TIMING_BYTES + 64

    def destination(self, region: ShmPlan | CudaPlan | None) -> Destination:
        fields, (N, C), dtype = self._fields, self._shape, self._dtype
        if region is None:
            return MessageBuffer(message_head(N, C, dtype), self._shape, BY_WIRE[dtype].torch,
                                 self._tail, timing_tag(fields.DESCRIPTOR))
        assert self.region is not None
        fields.embeddings.shape[:] = self._shape
        fields.embeddings.dtype = dtype
        fields.output.region, fields.output.offset = self.region.name, self.region.offset
        fields.output.cuda = isinstance(region, CudaPlan)
        fields.output.byte_size = region.byte_size
        return region.destination(self._with_timing)

    def _with_timing(self, timing: Timing) -> bytes:
        """A shared-memory answer: the small fields plus the timing, serialised."""
        self._fields.timing.CopyFrom(pb.Timing(
            queue_ns=timing.queue_ns, tokenize_ns=timing.tokenize_ns,
            compute_ns=timing.compute_ns, total_ns=timing.total_ns))
        data: bytes = self._fields.SerializeToString()
        return data


class OipReply(Reply[bytes]):
    """``ModelInferResponse``: ``embeddings`` [B, T, C] in ``raw_output_contents`` (or in
    a region), and ``sequence_lengths`` [B] when asked for."""

    padded = True

    def __init__(self, request_id: str, wanted: AbstractSet[str],
                 region: RegionOutput | None = None) -> None:
        self._id = request_id
        self._lengths = "sequence_lengths" in wanted
        self.region = region
        self._admitted: Admitted | None = None
        self._fields = b""  # every field but the rows, serialised

    def prepare(self, admitted: Admitted, untrained: list[list[int]] | None) -> int:
        self._admitted = admitted
        self._fields = self._tail(admitted)
        B, T, C = padded_shape(admitted, True)
        rows = 0 if self.region is not None else B * T * C * admitted.itemsize
        return rows + len(self._fields) + 8 * B + 64

    def _tail(self, admitted: Admitted) -> bytes:
        """Every field but the rows, serialised: the fields that repeat from request to
        request once per (model, shape, ...), then this request's id."""
        model, sequences = admitted.model, admitted.sequences
        B, T, C = padded_shape(admitted, True)
        tail = _oip_fields(model.name, model.version, model.checkpoint_id,
                           BY_WIRE[admitted.options.dtype].oip, B, T, C, self._lengths,
                           sum(f.truncated_tokens for f in sequences),
                           sequences[0].start_position)
        if self._id:  # field 3: the rest of a message's fields may come in any order
            tail += oip.ModelInferResponse(id=self._id).SerializeToString()
        return tail


    def destination(self, region: ShmPlan | CudaPlan | None) -> Destination:
        admitted = self._admitted
        assert admitted is not None
        B, T, C = padded_shape(admitted, True)
        dtype = admitted.options.dtype
        if region is not None:
            assert self.region is not None
            fields = oip.ModelInferResponse.FromString(self._fields)  # small, and rare
            p = fields.outputs[0].parameters
            p["shared_memory_region"].string_param = self.region.name
            p["shared_memory_offset"].int64_param = self.region.offset
            p["shared_memory_byte_size"].int64_param = region.byte_size
            if self._lengths:  # small: travels in the response
                fields.outputs[1].contents.int64_contents.extend(admitted.lengths)
            if isinstance(region, CudaPlan):  # padded by the device itself
                return region.destination(lambda _: fields.SerializeToString(),
                                          admitted.lengths)
            return region.destination(lambda _: fields.SerializeToString())
        tail = self._fields
        if self._lengths:  # raw_output_contents[1], after the rows
            raw = np.asarray(admitted.lengths, dtype="<i8").tobytes()
            tail += bytes_field_prefix(_RAW_OUTPUT_FIELD, len(raw)) + raw
        nbytes = B * T * C * admitted.itemsize
        return MessageBuffer(bytes_field_prefix(_RAW_OUTPUT_FIELD, nbytes), (B * T, C),
                             BY_WIRE[dtype].torch, tail)


@functools.lru_cache(maxsize=4096)
def _oip_fields(model: str, version: int, checkpoint_id: str, datatype: str, B: int, T: int,
                C: int, lengths: bool, truncated: int, start_position: int) -> bytes:
    """A ModelInferResponse's fields but the rows and the id, serialised (requests repeat
    a few shapes: kept for the next one)."""
    out = oip.ModelInferResponse.InferOutputTensor
    fields = oip.ModelInferResponse(
        model_name=model, model_version=str(version),
        outputs=[out(name="embeddings", datatype=datatype, shape=[B, T, C])])
    fields.parameters["checkpoint_id"].string_param = checkpoint_id
    fields.parameters["truncated_tokens"].int64_param = truncated
    fields.parameters["start_position"].int64_param = start_position
    if lengths:
        fields.outputs.append(out(name="sequence_lengths", datatype="INT64", shape=[B]))
    data: bytes = fields.SerializeToString()
    return data

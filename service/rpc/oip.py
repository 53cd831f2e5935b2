"""The Open Inference Protocol face (KServe v2 / Triton ``inference.GRPCInferenceService``).

Served beside the native API on the same port, through the same admission, batcher and
status map, so Triton and KServe clients, pipelines and dashboards work unchanged.

ModelInfer tensors (what ModelMetadata describes):
  inputs   ``input_ids`` INT64 or INT32 [B, T] (raw_input_contents or typed contents), or
           ``text`` BYTES [B] (one UTF-8 string per sequence)
  outputs  ``embeddings`` FP32 | FP16 | BF16 [B, T, C], always in raw_output_contents;
           ``sequence_lengths`` INT64 [B] (texts tokenize to different T: rows past a
           sequence's length are zero)
  request parameters: ``start_position`` (int64), ``compose`` ("token_plus_position" |
  "token_only" | "position_only"), ``datatype`` ("FP32" | "FP16" | "BF16"), ``truncate``
  ("none" | "right" | "left"), ``allow_special_tokens`` (bool), ``add_special_tokens``
  (bool; absent = the model's default, as AutoTokenizer applies it).
ModelMetadata also carries ``parameters``: family, rules, tokenizer, hidden_size.
Shared memory (Triton's system shared-memory extension): the ``embeddings`` output's
``shared_memory_region`` / ``shared_memory_offset`` / ``shared_memory_byte_size``
parameters put the [B, T, C] rows in a registered region instead of the response.
"""

from __future__ import annotations

import asyncio
import time
from importlib import metadata
from typing import Any

import grpc
import numpy as np

from genproto.inference.v2 import grpc_service_pb2 as oip
from service import tracing
from service.dtypes import BY_WIRE
from service.engine.admission import Admission, Options
from service.engine.shm import ShmDestination
from service.errors import EmbedError, InvalidArgument
from service.rpc import codec
from service.rpc.native import EmbeddingService
from service.rpc.oip_tensors import (
    DATATYPES,
    model_parameters,
    output_dtype,
    read_input,
    request_parameters,
    requested_outputs,
)

__all__ = ["OIP_SERVICE_NAME", "InferenceService"]

OIP_SERVICE_NAME = "inference.GRPCInferenceService"
EXTENSIONS = ["parameters", "system_shared_memory"]  # what ServerMetadata advertises
_RAW_OUTPUT_FIELD = 6  # ModelInferResponse.raw_output_contents


class InferenceService:
    """Implements the OIP RPCs on the native service's repository, admission and batcher."""

    def __init__(self, native: EmbeddingService) -> None:
        self.native = native

    # -- health and metadata --------------------------------------------------------------

    async def ServerLive(self, request: oip.ServerLiveRequest,
                         context: grpc.aio.ServicerContext) -> oip.ServerLiveResponse:
        """The process answers."""
        return oip.ServerLiveResponse(live=True)

    async def ServerReady(self, request: oip.ServerReadyRequest,
                          context: grpc.aio.ServicerContext) -> oip.ServerReadyResponse:
        """A model is loaded and the server is not draining."""
        return oip.ServerReadyResponse(
            ready=bool(self.native.repo.models) and not self.native.draining)

    async def ModelReady(self, request: oip.ModelReadyRequest,
                         context: grpc.aio.ServicerContext) -> oip.ModelReadyResponse:
        """The model (and version, when given) is loaded."""
        try:
            self.native.repo.get(request.name, _version(request.version))
        except EmbedError:  # unknown model or version, bad version text, nothing loaded yet
            return oip.ModelReadyResponse(ready=False)
        return oip.ModelReadyResponse(ready=not self.native.draining)

    async def ServerMetadata(self, request: oip.ServerMetadataRequest,
                             context: grpc.aio.ServicerContext) -> oip.ServerMetadataResponse:
        """Name, version and the protocol extensions served."""
        try:
            version = metadata.version("embedding-service")
        except metadata.PackageNotFoundError:
            version = "0"
        return oip.ServerMetadataResponse(name="embedding-service", version=version,
                                          extensions=EXTENSIONS)

    async def ModelMetadata(self, request: oip.ModelMetadataRequest,
                            context: grpc.aio.ServicerContext) -> oip.ModelMetadataResponse:
        """The model's tensors: exactly what ModelInfer takes and returns."""
        async def body() -> oip.ModelMetadataResponse:
            model = self.native.repo.get(request.name, _version(request.version))
            meta = oip.ModelMetadataResponse.TensorMetadata
            response = oip.ModelMetadataResponse(
                name=model.name, versions=[str(model.version)], platform="embedding",
                inputs=[meta(name="input_ids", datatype="INT64", shape=[-1, -1]),
                        meta(name="text", datatype="BYTES", shape=[-1])],
                outputs=[meta(name="embeddings", datatype="FP32",
                              shape=[-1, -1, model.tables.width]),
                         meta(name="sequence_lengths", datatype="INT64", shape=[-1])])
            model_parameters(response.parameters, model.checkpoint.manifest)
            return response

        return await self.native.call("ModelMetadata", request.name, "", context, body)

    async def RepositoryIndex(self, request: oip.RepositoryIndexRequest,
                              context: grpc.aio.ServicerContext
                              ) -> oip.RepositoryIndexResponse:
        """Every version on disk: READY (served), UNAVAILABLE (refused) or AVAILABLE."""
        index = oip.RepositoryIndexResponse.ModelIndex
        rows = [index(name=name, version=str(v), state=state, reason=reason)
                for name, v, state, reason in self.native.repo.index()
                if not request.ready or state == "READY"]
        return oip.RepositoryIndexResponse(models=rows)

    # -- inference ------------------------------------------------------------------------

    async def ModelInfer(self, request: oip.ModelInferRequest,
                         context: grpc.aio.ServicerContext) -> bytes:
        """Token ids or text in, [B, T, C] input embeddings out."""
        t0 = time.perf_counter_ns()
        return await self.native.call("ModelInfer", request.model_name, request.id, context,
                                      lambda: self._infer(request, context, t0))

    async def _infer(self, request: oip.ModelInferRequest, context: grpc.aio.ServicerContext,
                     t0: int) -> bytes:
        params = request_parameters(request)
        wanted, shm = requested_outputs(request)
        dtype = output_dtype(request, params)
        inputs = read_input(request, params["start_position"])
        options = Options(request.model_name, _version(request.model_version),
                          params["compose"], dtype, params["truncate"],
                          params["allow_special_tokens"], params["add_special_tokens"],
                          in_message=shm is None)
        admission = await self.native.admitter.admit(options, inputs)
        model = admission.model
        self.native.batcher.check_room(admission.tokens)  # before allocating: cheap refusals
        lengths = admission.lengths
        B, T, C = len(lengths), max(lengths), admission.dim
        datatype = DATATYPES[dtype]
        out = oip.ModelInferResponse.InferOutputTensor
        fields = oip.ModelInferResponse(
            model_name=model.name, model_version=str(model.version), id=request.id,
            outputs=[out(name="embeddings", datatype=datatype, shape=[B, T, C])])
        fields.parameters["checkpoint_id"].string_param = model.checkpoint_id
        fields.parameters["truncated_tokens"].int64_param = sum(
            f.truncated_tokens for f in admission.sequences)
        fields.parameters["start_position"].int64_param = admission.sequences[0].start_position
        if "sequence_lengths" in wanted:
            fields.outputs.append(out(name="sequence_lengths", datatype="INT64", shape=[B]))
        deadline = self.native.deadline(context)
        if shm is not None:
            region, offset = shm
            rows = self.native.shm.rows(region, offset, (B, T, C), BY_WIRE[dtype].torch,
                                        "outputs['embeddings']")
            p = fields.outputs[0].parameters
            p["shared_memory_region"].string_param = region
            p["shared_memory_offset"].int64_param = offset
            p["shared_memory_byte_size"].int64_param = rows.numel() * rows.element_size()
            if "sequence_lengths" in wanted:  # small: travels in the response
                fields.outputs[1].contents.int64_contents.extend(lengths)
            return await self._fill(admission, rows, ShmDestination(
                rows.view(B * T, C), lambda _: fields.SerializeToString()), lengths, t0,
                deadline, request.id)
        suffix = fields.SerializeToString()
        if "sequence_lengths" in wanted:  # raw_output_contents[1], after the rows
            raw = np.asarray(lengths, dtype="<i8").tobytes()
            suffix += codec.bytes_field_prefix(_RAW_OUTPUT_FIELD, len(raw)) + raw
        nbytes = B * T * C * BY_WIRE[dtype].itemsize
        writer = codec.ResponseWriter(codec.bytes_field_prefix(_RAW_OUTPUT_FIELD, nbytes),
                                      (B * T, C), BY_WIRE[dtype].torch, suffix, None)
        return await self._fill(admission, writer.rows.view(B, T, C), writer, lengths, t0,
                                deadline, request.id)

    async def _fill(self, admission: Admission, rows: Any, dest: Any, lengths: list[int],
                    t0: int, deadline: float | None, request_id: str) -> bytes:
        """Batch the lookup into ``rows`` (B, T, C): one job when every sequence has T
        rows, else one job per sequence into its slice, with the padding zeroed."""
        native = self.native
        if len(set(lengths)) == 1:
            job = admission.job(dest, t0, deadline)
            result: bytes = await native.batcher.submit(job)
            native.admitter.account(admission, job)
            tracing.record(admission, job, request_id)
            return result
        for b, n in enumerate(lengths):
            rows[b, n:].zero_()  # (T - n, C) padding
        jobs = [admission.job(codec.RowSlice(rows[b, :n]), t0, deadline, [seq])
                for b, (n, seq) in enumerate(zip(lengths, admission.sequences))]
        timings = await asyncio.gather(*(native.batcher.submit(job) for job in jobs))
        for job in jobs:
            native.admitter.account(admission, job)
        tracing.record(admission, jobs[-1], request_id)  # the last sequence's queue/compute
        finished: bytes = dest.finish(timings[-1])
        return finished

    # -- shared memory (Triton's system shared-memory extension) --------------------------

    async def SystemSharedMemoryRegister(
            self, request: oip.SystemSharedMemoryRegisterRequest,
            context: grpc.aio.ServicerContext) -> oip.SystemSharedMemoryRegisterResponse:
        """Map a /dev/shm object as a named region."""
        async def body() -> oip.SystemSharedMemoryRegisterResponse:
            self.native.shm.register(request.name, request.key, request.offset,
                                     request.byte_size)
            return oip.SystemSharedMemoryRegisterResponse()

        return await self.native.call("SystemSharedMemoryRegister", "", "", context, body)

    async def SystemSharedMemoryUnregister(
            self, request: oip.SystemSharedMemoryUnregisterRequest,
            context: grpc.aio.ServicerContext) -> oip.SystemSharedMemoryUnregisterResponse:
        """Forget a region ("" = all)."""
        async def body() -> oip.SystemSharedMemoryUnregisterResponse:
            self.native.shm.unregister(request.name)
            return oip.SystemSharedMemoryUnregisterResponse()

        return await self.native.call("SystemSharedMemoryUnregister", "", "", context, body)

    async def SystemSharedMemoryStatus(
            self, request: oip.SystemSharedMemoryStatusRequest,
            context: grpc.aio.ServicerContext) -> oip.SystemSharedMemoryStatusResponse:
        """Registered regions (or the one named)."""
        async def body() -> oip.SystemSharedMemoryStatusResponse:
            response = oip.SystemSharedMemoryStatusResponse()
            for r in self.native.shm.regions(request.name):
                response.regions[r.name].CopyFrom(oip.SystemSharedMemoryStatusResponse.RegionStatus(
                    name=r.name, key=r.key, offset=r.offset, byte_size=r.byte_size))
            return response

        return await self.native.call("SystemSharedMemoryStatus", "", "", context, body)

    def handlers(self) -> grpc.GenericRpcHandler:
        """Method handlers; ModelInfer returns bytes laid out by ``codec``."""
        unary = self.native.unary
        return grpc.method_handlers_generic_handler(OIP_SERVICE_NAME, {
            "ServerLive": unary("ServerLive", self.ServerLive, oip.ServerLiveRequest),
            "ServerReady": unary("ServerReady", self.ServerReady, oip.ServerReadyRequest),
            "ModelReady": unary("ModelReady", self.ModelReady, oip.ModelReadyRequest),
            "ServerMetadata": unary("ServerMetadata", self.ServerMetadata,
                                    oip.ServerMetadataRequest),
            "ModelMetadata": unary("ModelMetadata", self.ModelMetadata,
                                   oip.ModelMetadataRequest),
            "ModelInfer": unary("ModelInfer", self.ModelInfer, oip.ModelInferRequest, raw=True),
            "RepositoryIndex": unary("RepositoryIndex", self.RepositoryIndex,
                                     oip.RepositoryIndexRequest),
            "SystemSharedMemoryStatus": unary("SystemSharedMemoryStatus",
                                              self.SystemSharedMemoryStatus,
                                              oip.SystemSharedMemoryStatusRequest),
            "SystemSharedMemoryRegister": unary("SystemSharedMemoryRegister",
                                                self.SystemSharedMemoryRegister,
                                                oip.SystemSharedMemoryRegisterRequest),
            "SystemSharedMemoryUnregister": unary("SystemSharedMemoryUnregister",
                                                  self.SystemSharedMemoryUnregister,
                                                  oip.SystemSharedMemoryUnregisterRequest),
        })


def _version(text: str) -> int:
    """OIP versions are strings: "" = newest; otherwise a positive integer."""
    if not text:
        return 0
    if not text.isdigit() or int(text) <= 0:
        raise InvalidArgument(f"model_version={text!r} must be empty or a positive integer")
    return int(text)


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
Shared memory (Triton's system and CUDA shared-memory extensions): the ``embeddings``
output's ``shared_memory_region`` / ``shared_memory_offset`` / ``shared_memory_byte_size``
parameters put the [B, T, C] rows in a registered region instead of the response (a CUDA
region's are written there by the device).
"""

from __future__ import annotations

from collections.abc import Sequence
from importlib import metadata
from typing import Any

import grpc
import numpy as np

from genproto.embedding.v1 import embedding_pb2 as pb
from genproto.inference.v2 import grpc_service_pb2 as oip
from service.engine import Engine, Input, OipReply, Options, RegionOutput, Request
from service.errors import EmbedError
from service.rpc.frame import Call, Frame
from service.rpc.oip_tensors import (
    DTYPE_OF,
    model_metadata,
    model_version,
    output_dtype,
    output_names,
    read_input,
    request_parameters,
    requested_outputs,
)

__all__ = ["OIP_SERVICE_NAME", "OipFront", "read_infer", "usual_infer"]

OIP_SERVICE_NAME = "inference.GRPCInferenceService"
EXTENSIONS = ["parameters", "system_shared_memory"]  # what ServerMetadata advertises
_ALL_OUTPUTS = frozenset(output_names([]))  # none named: all of them
_EMBEDDINGS = frozenset({"embeddings"})


class OipFront:
    """Implements the OIP RPCs on the engine; every method runs inside the frame."""

    def __init__(self, engine: Engine, frame: Frame) -> None:
        self.engine = engine
        self.frame = frame

    def handlers(self) -> grpc.GenericRpcHandler:
        """The service's handler table, built from its descriptor, inside the frame."""
        return self.frame.grpc_service(
            oip.DESCRIPTOR.services_by_name["GRPCInferenceService"], self, _labels)

    # -- health and metadata --------------------------------------------------------------

    async def ServerLive(self, request: oip.ServerLiveRequest,
                         call: Call) -> oip.ServerLiveResponse:
        """The process answers."""
        return oip.ServerLiveResponse(live=True)

    async def ServerReady(self, request: oip.ServerReadyRequest,
                          call: Call) -> oip.ServerReadyResponse:
        """A model is loaded and the server is not draining."""
        return oip.ServerReadyResponse(ready=self.engine.ready)

    async def ModelReady(self, request: oip.ModelReadyRequest,
                         call: Call) -> oip.ModelReadyResponse:
        """The model (and version, when given) is loaded."""
        try:
            self.engine.model(request.name, _version(request.version))
        except EmbedError:  # unknown model or version, bad version text, nothing loaded yet
            return oip.ModelReadyResponse(ready=False)
        return oip.ModelReadyResponse(ready=not self.engine.draining)

    async def ServerMetadata(self, request: oip.ServerMetadataRequest,
                             call: Call) -> oip.ServerMetadataResponse:
        """Name, version and the protocol extensions served."""
        try:
            version = metadata.version("embedding-service")
        except metadata.PackageNotFoundError:
            version = "0"
        cuda = ["cuda_shared_memory"] if self.engine.cuda_shm.device.type == "cuda" else []
        return oip.ServerMetadataResponse(name="embedding-service", version=version,
                                          extensions=EXTENSIONS + cuda)

    async def ModelMetadata(self, request: oip.ModelMetadataRequest,
                            call: Call) -> oip.ModelMetadataResponse:
        """The model's tensors: exactly what ModelInfer takes and returns."""
        meta = model_metadata(self.engine.model(request.name, _version(request.version)))
        tensor = oip.ModelMetadataResponse.TensorMetadata
        response = oip.ModelMetadataResponse(
            name=meta["name"], versions=meta["versions"], platform=meta["platform"],
            inputs=[tensor(**t) for t in meta["inputs"]],
            outputs=[tensor(**t) for t in meta["outputs"]])
        for key, value in meta["parameters"].items():
            if isinstance(value, int):
                response.parameters[key].int64_param = value
            else:
                response.parameters[key].string_param = value
        return response

    async def RepositoryIndex(self, request: oip.RepositoryIndexRequest,
                              call: Call) -> oip.RepositoryIndexResponse:
        """Every version on disk: READY (served), UNAVAILABLE (refused) or AVAILABLE."""
        index = oip.RepositoryIndexResponse.ModelIndex
        rows = [index(name=name, version=str(v), state=state, reason=reason)
                for name, v, state, reason in self.engine.repo.index()
                if not request.ready or state == "READY"]
        return oip.RepositoryIndexResponse(models=rows)

    # -- inference ------------------------------------------------------------------------

    async def ModelInfer(self, request: oip.ModelInferRequest, call: Call) -> bytes:
        """Token ids or text in, [B, T, C] input embeddings out."""
        options, inputs, reply = usual_infer(request) or read_infer(request)
        return await self.engine.embed(Request(options, inputs, reply, call.start_ns,
                                               call.deadline, request.id, call))

    # -- shared memory (Triton's system shared-memory extension) --------------------------

    async def SystemSharedMemoryRegister(
            self, request: oip.SystemSharedMemoryRegisterRequest,
            call: Call) -> oip.SystemSharedMemoryRegisterResponse:
        """Map a /dev/shm object as a named region."""
        self.engine.cuda_shm.check_free(call, request.name)
        self.engine.shm.register(call, request.name, request.key, request.offset,
                                 request.byte_size)
        return oip.SystemSharedMemoryRegisterResponse()

    async def SystemSharedMemoryUnregister(
            self, request: oip.SystemSharedMemoryUnregisterRequest,
            call: Call) -> oip.SystemSharedMemoryUnregisterResponse:
        """Forget one of the caller's regions ("" = all of the caller's own)."""
        self.engine.shm.unregister(call, request.name)
        return oip.SystemSharedMemoryUnregisterResponse()

    async def SystemSharedMemoryStatus(
            self, request: oip.SystemSharedMemoryStatusRequest,
            call: Call) -> oip.SystemSharedMemoryStatusResponse:
        """The caller's registered regions (or the one named)."""
        return _status(oip.SystemSharedMemoryStatusResponse(),
                       self.engine.shm.regions(call, request.name), ("key", "offset"))

    # -- CUDA shared memory (Triton's CUDA shared-memory extension) ----------------------

    async def CudaSharedMemoryRegister(
            self, request: oip.CudaSharedMemoryRegisterRequest,
            call: Call) -> oip.CudaSharedMemoryRegisterResponse:
        """Open a client's device memory (its cudaIpcMemHandle) as a named region."""
        self.engine.cuda_shm.register(call, request.name, request.raw_handle,
                                      request.device_id, request.byte_size)
        return oip.CudaSharedMemoryRegisterResponse()

    async def CudaSharedMemoryUnregister(
            self, request: oip.CudaSharedMemoryUnregisterRequest,
            call: Call) -> oip.CudaSharedMemoryUnregisterResponse:
        """Forget one of the caller's CUDA regions ("" = all of the caller's own)."""
        self.engine.cuda_shm.unregister(call, request.name)
        return oip.CudaSharedMemoryUnregisterResponse()

    async def CudaSharedMemoryStatus(
            self, request: oip.CudaSharedMemoryStatusRequest,
            call: Call) -> oip.CudaSharedMemoryStatusResponse:
        """The caller's registered CUDA regions (or the one named)."""
        return _status(oip.CudaSharedMemoryStatusResponse(),
                       self.engine.cuda_shm.regions(call, request.name), ("device_id",))


Read = tuple[Options, Sequence[Input], OipReply]  # what the engine takes from a ModelInfer


def read_infer(request: oip.ModelInferRequest) -> Read:
    """Any ModelInfer request, every field read and checked: the engine's options, the
    sequences and the reply its answer is laid out in."""
    params = request_parameters(request)
    wanted, shm = requested_outputs(request)
    dtype = output_dtype(request, params)
    inputs = read_input(request, params["start_position"])
    options = Options(request.model_name, _version(request.model_version),
                      params["compose"], dtype, params["truncate"],
                      params["allow_special_tokens"], params["add_special_tokens"],
                      in_message=shm is None)
    region = None if shm is None else RegionOutput(*shm, "outputs['embeddings']")
    return options, inputs, OipReply(request.id, wanted, region)


def usual_infer(request: oip.ModelInferRequest) -> Read | None:
    """The usual small request, read in a few steps: ``input_ids`` INT64 [1, T] in
    ``raw_input_contents``, no parameters but the output ``datatype`` (by its name),
    outputs none or ``embeddings`` alone without parameters. None for anything else:
    ``read_infer`` then decides, and words its refusals; what this reads, ``read_infer``
    reads the same (tests/service/rpc/oip/test_oip_usual.py compares the two over many
    requests)."""
    if len(request.inputs) != 1 or len(request.raw_input_contents) != 1:
        return None
    dtype: int = pb.DTYPE_FLOAT32
    params = request.parameters
    if params:  # the output datatype alone, by its exact name
        if len(params) != 1 or "datatype" not in params:
            return None
        value = params["datatype"]
        if value.WhichOneof("parameter_choice") != "string_param" \
                or value.string_param not in DTYPE_OF:
            return None
        dtype = DTYPE_OF[value.string_param]
    tensor, raw = request.inputs[0], request.raw_input_contents[0]
    shape = tensor.shape
    if tensor.name != "input_ids" or tensor.datatype != "INT64" or tensor.parameters \
            or len(shape) != 2 or shape[0] != 1 or not 0 < 8 * shape[1] == len(raw):
        return None
    outputs = request.outputs
    if not outputs:
        wanted = _ALL_OUTPUTS
    elif len(outputs) == 1 and outputs[0].name == "embeddings" and not outputs[0].parameters:
        wanted = _EMBEDDINGS
    else:
        return None
    ids = np.frombuffer(raw, "<i8").copy()  # (T,) writable: torch shares its memory
    return (Options(request.model_name, _version(request.model_version), dtype=dtype),
            [Input("input_ids[0]", ids=ids, value_field="input_ids[0]")],
            OipReply(request.id, wanted))


def _status(response: Any, regions: Sequence[Any], fields: tuple[str, ...]) -> Any:
    """A shared-memory status response (host or CUDA): each region by name, with its
    ``fields`` and size."""
    status = type(response).RegionStatus
    for r in regions:
        response.regions[r.name].CopyFrom(status(
            name=r.name, byte_size=r.byte_size, **{f: getattr(r, f) for f in fields}))
    return response


def _labels(rpc: str, request: Any) -> tuple[str, str]:
    """(model, request_id) of a request, for the frame's metrics and logs."""
    if rpc == "ModelInfer":
        return request.model_name, request.id
    if rpc in ("ModelMetadata", "ModelReady"):
        return request.name, ""
    return "", ""


_version = model_version  # "" = newest; otherwise a positive integer (shared with REST)

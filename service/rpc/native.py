"""The native face, ``embedding.v1.EmbeddingService``.

Methods stay thin: each turns its message into the engine's vocabulary (``Options``,
``Input``s, the ``NativeReply`` its answer is laid out in) and makes one engine call.
Auth, draining, deadline, metrics and status codes are the frame's.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from typing import Any

import grpc

from genproto.embedding.v1 import embedding_pb2 as pb
from service.engine import (
    Engine,
    Input,
    Inputs,
    LoadedModel,
    NativeReply,
    Options,
    Request,
    StreamBudgets,
    StreamTurn,
)
from service.format.tokenizer import TokenizerSpec
from service.rpc.frame import Call, Frame, Undecodable

__all__ = ["SERVICE_NAME", "NativeFront"]

SERVICE_NAME = "embedding.v1.EmbeddingService"
STREAM_WINDOW = 64  # requests of one stream in flight at once: pipelining with backpressure


class NativeFront:
    """Implements embedding.v1.EmbeddingService on the engine; every method runs inside
    the frame (registered by ``handlers``)."""

    def __init__(self, engine: Engine, frame: Frame,
                 stream_budgets: StreamBudgets | None = None) -> None:
        self.engine = engine
        self.frame = frame
        # Bytes of stream answers the clients have not taken yet (engine/budgets.py).
        self.stream_budgets = stream_budgets or StreamBudgets(16 << 20, 256 << 20)

    def handlers(self) -> grpc.GenericRpcHandler:
        """The service's handler table, built from its descriptor, inside the frame."""
        return self.frame.grpc_service(pb.DESCRIPTOR.services_by_name["EmbeddingService"],
                                       self, _labels)

    # -- embedding RPCs -------------------------------------------------------------------

    async def Embed(self, request: pb.EmbedRequest, call: Call,
                    turn: StreamTurn | None = None) -> bytes:
        """One sequence → [T, C]."""
        if isinstance(request, Undecodable):  # a stream item that did not parse
            await request.fail()
        kind = request.WhichOneof("input")
        inputs = [Input("input", text=request.text if kind == "text" else None,
                        ids=request.token_ids.ids if kind == "token_ids" else None,
                        start_position=request.start_position)]
        return await self.engine.embed(Request(
            _options(request), inputs, NativeReply(request), call.start_ns, call.deadline,
            request.request_id, call, turn))

    async def EmbedBatch(self, request: pb.EmbedBatchRequest, call: Call) -> bytes:
        """Many sequences → one packed [ΣT, C] with B+1 offsets, in one job."""
        def inputs() -> list[Input]:  # built once admission has checked their number
            out = []
            for i, inp in enumerate(request.inputs):
                kind = inp.WhichOneof("input")
                out.append(Input(f"inputs[{i}]", text=inp.text if kind == "text" else None,
                                 ids=inp.token_ids.ids if kind == "token_ids" else None,
                                 start_position=inp.start_position))
            return out

        return await self.engine.embed(Request(
            _options(request), Inputs(len(request.inputs), inputs), NativeReply(request),
            call.start_ns, call.deadline, request.request_id, call))

    async def EmbedStream(self, requests: AsyncIterator[pb.EmbedRequest],
                          call: Call) -> AsyncIterator[bytes]:
        """Bidi stream; up to STREAM_WINDOW requests in flight, responses in request order.

        A bad request ends the stream with its status; responses before it were delivered.
        Answers the client has not taken yet are bounded in bytes (``budgets``): past the
        budget, requests wait before their output is allocated, the window fills and the
        stream stops reading.
        """
        window: asyncio.Queue[tuple[int, asyncio.Future[bytes]] | None] = \
            asyncio.Queue(STREAM_WINDOW)
        pacer = self.stream_budgets.pacer()
        loop = asyncio.get_running_loop()
        unsent = 0  # answers read but not yet taken by gRPC

        async def one(request: pb.EmbedRequest, seq: int) -> bytes:
            try:
                return await self.frame.item(
                    call, request.model, request.request_id,
                    lambda item: self.Embed(request, item, StreamTurn(pacer, seq)))
            finally:
                pacer.skip(seq)  # refused before reserving: the next answer's turn

        async def read() -> None:
            nonlocal unsent
            seq = 0
            async for request in requests:
                answer: asyncio.Future[bytes]
                if unsent == 0:
                    # Every earlier answer is sent: there is nothing to overlap this one
                    # with, so it runs here, without a task and its two loop hops (a
                    # client with one request in flight). Otherwise it is pipelined.
                    answer = loop.create_future()
                    try:
                        answer.set_result(await one(request, seq))
                    except Exception as e:  # a Refused item: ends the stream in its turn
                        answer.set_exception(e)
                else:
                    answer = asyncio.ensure_future(one(request, seq))
                unsent += 1
                await window.put((seq, answer))
                seq += 1
            await window.put(None)

        reader = asyncio.ensure_future(read())
        try:
            while (item := await window.get()) is not None:
                seq, answer = item
                yield await answer  # a Refused item ends the stream, after every answer before it
                pacer.release(seq)  # gRPC has taken it
                unsent -= 1
            await reader
        finally:
            reader.cancel()
            while not window.empty():
                pending = window.get_nowait()
                if pending is not None:
                    pending[1].cancel()
            pacer.close()

    # -- tokenizer and model RPCs ---------------------------------------------------------

    async def Tokenize(self, request: pb.TokenizeRequest, call: Call) -> pb.TokenizeResponse:
        """Text → ids and each token's bytes."""
        model, ids = await self.engine.tokenize(request.model, request.version, request.text,
                                                request.allow_special_tokens)
        return pb.TokenizeResponse(token_ids=ids, tokens=model.tokenizer.token_bytes(ids),
                                   model=model.name, version=model.version)

    async def Detokenize(self, request: pb.DetokenizeRequest,
                         call: Call) -> pb.DetokenizeResponse:
        """Ids → text (invalid UTF-8 becomes U+FFFD)."""
        model, text = self.engine.detokenize(request.model, request.version,
                                             request.token_ids)
        return pb.DetokenizeResponse(text=text, model=model.name, version=model.version)

    async def ListModels(self, request: pb.ListModelsRequest,
                         call: Call) -> pb.ListModelsResponse:
        """Every loaded model version."""
        models = self.engine.repo.models
        return pb.ListModelsResponse(models=[self.model_info(models[n]) for n in sorted(models)])

    async def GetModelInfo(self, request: pb.GetModelInfoRequest, call: Call) -> pb.ModelInfo:
        """One model's tables, tokenizer and limits."""
        return self.model_info(self.engine.model(request.model, request.version))

    # -- shared-memory regions ------------------------------------------------------------

    async def RegisterSharedMemory(self, request: pb.RegisterSharedMemoryRequest,
                                   call: Call) -> pb.RegisterSharedMemoryResponse:
        """Map a client's /dev/shm object so requests can name it as their output."""
        r = request.region
        self.engine.cuda_shm.check_free(call, r.name)
        self.engine.shm.register(call, r.name, r.key, r.offset, r.byte_size)
        return pb.RegisterSharedMemoryResponse()

    async def UnregisterSharedMemory(self, request: pb.UnregisterSharedMemoryRequest,
                                     call: Call) -> pb.UnregisterSharedMemoryResponse:
        """Forget one of the caller's regions ("" = all of the caller's own); requests
        already writing to it finish safely."""
        self.engine.shm.unregister(call, request.name)
        return pb.UnregisterSharedMemoryResponse()

    async def ListSharedMemory(self, request: pb.ListSharedMemoryRequest,
                               call: Call) -> pb.ListSharedMemoryResponse:
        """The caller's registered regions."""
        return pb.ListSharedMemoryResponse(regions=[
            pb.SharedMemoryRegion(name=r.name, key=r.key, offset=r.offset,
                                  byte_size=r.byte_size) for r in self.engine.shm.regions(call)])

    async def RegisterCudaSharedMemory(self, request: pb.RegisterCudaSharedMemoryRequest,
                                       call: Call) -> pb.RegisterCudaSharedMemoryResponse:
        """Open a client's device memory (its cudaIpcMemHandle) as a named region."""
        r = request.region
        self.engine.cuda_shm.register(call, r.name, r.raw_handle, r.device_id, r.byte_size)
        return pb.RegisterCudaSharedMemoryResponse()

    async def UnregisterCudaSharedMemory(self, request: pb.UnregisterCudaSharedMemoryRequest,
                                         call: Call) -> pb.UnregisterCudaSharedMemoryResponse:
        """Forget one of the caller's CUDA regions ("" = all of the caller's own)."""
        self.engine.cuda_shm.unregister(call, request.name)
        return pb.UnregisterCudaSharedMemoryResponse()

    async def ListCudaSharedMemory(self, request: pb.ListCudaSharedMemoryRequest,
                                   call: Call) -> pb.ListCudaSharedMemoryResponse:
        """The caller's registered CUDA regions (without their handles)."""
        return pb.ListCudaSharedMemoryResponse(regions=[
            pb.CudaSharedMemoryRegion(name=r.name, device_id=r.device_id, byte_size=r.byte_size)
            for r in self.engine.cuda_shm.regions(call)])

    def model_info(self, model: LoadedModel) -> pb.ModelInfo:
        """The ModelInfo message for a loaded model."""
        m = model.checkpoint.manifest
        untrained = -1 if model.untrained is None else int(model.untrained[: m.vocab_size].sum())
        return pb.ModelInfo(
            model=model.name, version=model.version, checkpoint_id=model.checkpoint_id,
            vocab_size=m.vocab_size, table_rows=m.table_rows, dim=m.dim,
            max_seq_len=m.max_seq_len, position=m.position, storage_dtype=m.dtype,
            device=str(model.tables.device),
            tokenizer=_tokenizer_info(m.tokenizer),
            is_default=model.name == self.engine.repo.default_model,
            max_tokens_per_request=min(self.engine.limits.max_tokens_per_request, m.max_seq_len),
            max_text_bytes=self.engine.limits.max_text_bytes,
            max_message_bytes=self.engine.limits.max_message_bytes,
            provenance_json=json.dumps(m.provenance, sort_keys=True),
            has_row_updates=model.untrained is not None, untrained_rows=untrained,
            family=m.family, rules=m.rules.describe(), hidden_size=m.width,
            has_tokenizer=m.tokenizer is not None)


def _labels(rpc: str, request: Any) -> tuple[str, str]:
    """(model, request_id) of a request, for the frame's metrics and logs."""
    return getattr(request, "model", ""), getattr(request, "request_id", "")


def _options(request: pb.EmbedRequest | pb.EmbedBatchRequest) -> Options:
    """The request-wide settings of an Embed or EmbedBatch request."""
    return Options(request.model, request.version, request.compose, request.dtype,
                   request.truncate, request.allow_special_tokens,
                   add_special_tokens=(request.add_special_tokens
                                       if request.HasField("add_special_tokens") else None),
                   in_message=not request.HasField("output"))


def _tokenizer_info(spec: TokenizerSpec | None) -> pb.TokenizerInfo:
    """ModelInfo's tokenizer (empty, kind "", for an ids-only model)."""
    if spec is None:
        return pb.TokenizerInfo()
    return pb.TokenizerInfo(encoding=spec.encoding, file=spec.file, sha256=spec.sha256,
                            special_tokens=spec.special_tokens, kind=spec.kind)

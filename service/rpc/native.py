"""The native face, ``embedding.v1.EmbeddingService``: validate → tokenize → batch → encode.

Methods stay thin: they turn a message into ``Options`` + ``Input``s and a destination
(the pre-encoded response bytes of ``codec``, or a shared-memory region) and hand them to
the engine. Auth, draining, deadline, metrics and status codes are the frame's.
"""

from __future__ import annotations

import asyncio
import functools
import json
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import grpc
import numpy as np

from genproto.embedding.v1 import embedding_pb2 as pb
from service.engine.admission import Admission, Input, Inputs, Options
from service.engine.engine import Engine
from service.engine.repository import LoadedModel
from service.engine.shm_plan import ShmDestination
from service.engine.validation import Fitted, check_ids
from service.format.tokenizer import TokenizerSpec
from service.rpc import codec
from service.rpc.frame import Call, Frame
from service.rpc.pacing import StreamBudgets

__all__ = ["SERVICE_NAME", "NativeFront"]

SERVICE_NAME = "embedding.v1.EmbeddingService"
STREAM_WINDOW = 64  # requests of one stream in flight at once: pipelining with backpressure
Reserve = Callable[[int], Awaitable[None]]  # wait for room for an answer of n bytes


class NativeFront:
    """Implements embedding.v1.EmbeddingService on the engine; every method runs inside
    the frame (registered by ``handlers``)."""

    def __init__(self, engine: Engine, frame: Frame,
                 stream_budgets: StreamBudgets | None = None) -> None:
        self.engine = engine
        self.frame = frame
        # Bytes of stream answers the clients have not taken yet (pacing.py).
        self.stream_budgets = stream_budgets or StreamBudgets(16 << 20, 256 << 20)

    def handlers(self) -> grpc.GenericRpcHandler:
        """The service's handler table, built from its descriptor, inside the frame."""
        return self.frame.grpc_service(pb.DESCRIPTOR.services_by_name["EmbeddingService"],
                                       self, _labels)

    # -- embedding RPCs -------------------------------------------------------------------

    async def _embed_one(self, request: pb.EmbedRequest, call: Call,
                         reserve: Reserve | None = None) -> bytes:
        if isinstance(request, codec.Undecodable):  # a stream item that did not parse
            await request.fail()
        kind = request.WhichOneof("input")
        admission = await self.engine.admit(_options(request), [Input(
            "input", text=request.text if kind == "text" else None,
            ids=request.token_ids.ids if kind == "token_ids" else None,
            start_position=request.start_position)])
        (fitted,) = admission.sequences
        model = admission.model
        (untrained,) = self.engine.untrained(admission)
        fields = pb.EmbedResponse(
            token_ids=_echo(request, fitted), start_position=fitted.start_position,
            model=model.name,
            version=model.version, checkpoint_id=model.checkpoint_id,
            truncated_tokens=fitted.truncated_tokens, untrained_token_indices=untrained,
            request_id=request.request_id)
        return await self._run(admission, fields, call, _shm_output(request), reserve)

    async def _run(self, admission: Admission, fields: Any, call: Call,
                   output: pb.SharedMemoryOutput | None = None,
                   reserve: Reserve | None = None) -> bytes:
        """Plan where the rows go (the response bytes, or a shared-memory region), then
        batch the lookup into it. ``reserve`` (streams) waits for room for the answer's
        bytes before anything is allocated."""
        shape = (admission.tokens, admission.dim)
        dtype = admission.options.dtype
        if reserve is not None:
            rows = shape[0] * shape[1] * admission.itemsize if output is None else 0
            await reserve(rows + fields.ByteSize() + codec.TIMING_BYTES + 64)
        dest: codec.ResponseWriter | ShmDestination
        if output is None:
            dest = codec.Reply(fields, shape, dtype).allocate()
        else:
            plan = self.engine.plan_shm(call, output.region, output.offset, shape, dtype,
                                        "output")
            fields.embeddings.shape[:] = shape
            fields.embeddings.dtype = dtype
            fields.output.region, fields.output.offset = output.region, output.offset
            fields.output.byte_size = plan.byte_size
            dest = plan.destination(lambda timing: _with_timing(fields, timing))
        data: bytes = await self.engine.run(admission, dest, call.start_ns, call.deadline,
                                             fields.request_id)
        return data

    async def Embed(self, request: pb.EmbedRequest, call: Call) -> bytes:
        """One sequence → [T, C]."""
        return await self._embed_one(request, call)

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

        admission = await self.engine.admit(_options(request),
                                            Inputs(len(request.inputs), inputs))
        model = admission.model
        offsets = np.cumsum([0, *admission.lengths]).tolist()
        untrained = self.engine.untrained(admission)
        items = [pb.BatchItem(token_ids=_echo(inp, f), start_position=f.start_position,
                              truncated_tokens=f.truncated_tokens, untrained_token_indices=u)
                 for inp, f, u in zip(request.inputs, admission.sequences, untrained)]
        fields = pb.EmbedBatchResponse(
            offsets=offsets, items=items, model=model.name, version=model.version,
            checkpoint_id=model.checkpoint_id, request_id=request.request_id)
        return await self._run(admission, fields, call, _shm_output(request))

    async def EmbedStream(self, requests: AsyncIterator[pb.EmbedRequest],
                          call: Call) -> AsyncIterator[bytes]:
        """Bidi stream; up to STREAM_WINDOW requests in flight, responses in request order.

        A bad request ends the stream with its status; responses before it were delivered.
        Answers the client has not taken yet are bounded in bytes (``pacing``): past the
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
                    lambda item: self._embed_one(request, item,
                                                 functools.partial(pacer.reserve, seq)))
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
        model = self.engine.model(request.model, request.version)
        ids = await self.engine.tokenize(model, request.text, request.allow_special_tokens)
        return pb.TokenizeResponse(token_ids=ids, tokens=model.tokenizer.token_bytes(ids),
                                   model=model.name, version=model.version)

    async def Detokenize(self, request: pb.DetokenizeRequest,
                         call: Call) -> pb.DetokenizeResponse:
        """Ids → text (invalid UTF-8 becomes U+FFFD)."""
        model = self.engine.model(request.model, request.version)
        ids = np.array(request.token_ids, dtype=np.int64)
        check_ids(ids, model, "token_ids")
        return pb.DetokenizeResponse(text=model.tokenizer.decode(ids.tolist()),
                                     model=model.name, version=model.version)

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


def _echo(inp: pb.EmbedRequest | pb.EmbedInput, fitted: Fitted) -> Any:
    """The ids an answer echoes: the request's own repeated field when it was kept whole
    (no tensor -> list -> proto round trip), else the ids as fitted (tokenized, truncated)."""
    if inp.WhichOneof("input") == "token_ids" and not fitted.truncated_tokens:
        return inp.token_ids.ids
    return fitted.ids.tolist()


def _shm_output(request: pb.EmbedRequest | pb.EmbedBatchRequest
                ) -> pb.SharedMemoryOutput | None:
    return request.output if request.HasField("output") else None


def _with_timing(fields: Any, timing: Any) -> bytes:
    """A shared-memory response: the small fields plus the timing, serialised."""
    fields.timing.CopyFrom(pb.Timing(queue_ns=timing.queue_ns, tokenize_ns=timing.tokenize_ns,
                                     compute_ns=timing.compute_ns, total_ns=timing.total_ns))
    data: bytes = fields.SerializeToString()
    return data

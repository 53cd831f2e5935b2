"""The EmbeddingService servicer: validate → tokenize → batch → encode.

Handlers stay thin; checks live in ``validation``, the lookup in ``tables`` via the
``batcher``, wire encoding in ``codec``, status mapping in ``errors``. Embedding RPCs
return pre-encoded bytes (see ``codec``), so they are registered with an identity
serializer in ``handlers()``.
"""

from __future__ import annotations

import asyncio
import hmac
import json
import logging
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import grpc
import numpy as np

from genproto.embedding.v1 import embedding_pb2 as pb
from service import tracing
from service.dtypes import BY_WIRE
from service.engine.admission import Admission, Admitter, Input, Options
from service.engine.batcher import Batcher
from service.engine.repository import LoadedModel, Repository
from service.engine.shm import SharedMemoryRegistry, ShmDestination
from service.engine.validation import Limits, check_ids, check_text
from service.errors import EmbedError, Unauthenticated, Unavailable, status_for
from service.format.tokenizer import TokenizerSpec
from service.metrics import Metrics
from service.rpc import codec

__all__ = ["SERVICE_NAME", "UNKNOWN_MODEL", "EmbeddingService"]

SERVICE_NAME = "embedding.v1.EmbeddingService"
UNKNOWN_MODEL = "_unknown"  # metric label for requests naming a model that is not loaded
STREAM_WINDOW = 64  # requests of one stream in flight at once: pipelining with backpressure
log = logging.getLogger("service.rpc.native")


class _Status(Exception):
    """A stream item's failure, carried to the stream's writer to abort in order."""

    def __init__(self, code: grpc.StatusCode, message: str) -> None:
        super().__init__(message)
        self.code, self.message = code, message


class EmbeddingService:
    """Implements embedding.v1.EmbeddingService on a repository and a batcher."""

    def __init__(self, repo: Repository, batcher: Batcher, metrics: Metrics, limits: Limits,
                 tokenize_pool: ThreadPoolExecutor, auth_token: str = "",
                 shm: SharedMemoryRegistry | None = None) -> None:
        self.repo = repo
        self.shm = shm if shm is not None else SharedMemoryRegistry()
        self.batcher = batcher
        self.metrics = metrics
        self.limits = limits
        self._pool = tokenize_pool
        self.admitter = Admitter(repo, limits, tokenize_pool, metrics)
        self._auth = f"Bearer {auth_token}".encode() if auth_token else b""
        self.draining = False

    # -- plumbing shared by every RPC ------------------------------------------------------

    def _admit(self, context: grpc.aio.ServicerContext) -> None:
        if self._auth:
            got = dict(context.invocation_metadata() or ()).get("authorization", "")
            if not hmac.compare_digest(str(got).encode(), self._auth):
                raise Unauthenticated("missing or invalid 'authorization: Bearer <token>'")
        if self.draining:
            raise Unavailable("server is draining for shutdown; retry on another replica")

    async def call(self, rpc: str, model: str, request_id: str,
                    context: grpc.aio.ServicerContext, body: Callable[[], Awaitable[Any]],
                    in_stream: bool = False) -> Any:
        """Run one request's body (any front's) with admission, metrics and the status mapping.

        A failure aborts the RPC, except ``in_stream``: then it is raised as ``_Status``
        for the stream to abort with once the answers before it are out.
        """
        t0 = time.perf_counter()
        self.metrics.inflight += 1
        recorded = False

        def record(code: grpc.StatusCode) -> None:
            nonlocal recorded
            recorded = True
            self.metrics.inflight -= 1
            # A model name from the request becomes a label only if it is loaded: clients
            # must not be able to mint unbounded metric series.
            label = model or self.repo.default_model
            if label not in self.repo.models:
                label = UNKNOWN_MODEL
            self.metrics.requests.labels(rpc, label, code.name).inc()
            self.metrics.request_duration.labels(rpc, label).observe(time.perf_counter() - t0)

        try:
            self._admit(context)
            result = await body()
            record(grpc.StatusCode.OK)
            return result
        except asyncio.CancelledError:
            record(grpc.StatusCode.CANCELLED)  # the client went away; nothing to answer
            raise
        except Exception as e:
            code, message = status_for(e, request_id)
            if not isinstance(e, EmbedError):
                log.exception("internal error in %s request_id=%s", rpc, request_id)
            # Counted before the status leaves: a client that scrapes right after its
            # error must see it in the metrics.
            record(code)
            if in_stream:
                raise _Status(code, message) from e
            await context.abort(code, message)
        finally:
            if not recorded:  # BaseException other than cancellation: still count it
                record(grpc.StatusCode.INTERNAL)

    def deadline(self, context: grpc.aio.ServicerContext) -> float | None:
        """The RPC's deadline as time.monotonic() seconds (None = no deadline)."""
        remaining = context.time_remaining()
        return None if remaining is None else time.monotonic() + remaining

    # -- embedding RPCs -------------------------------------------------------------------

    async def _embed_one(self, request: pb.EmbedRequest, context: grpc.aio.ServicerContext,
                         t0: int) -> bytes:
        if isinstance(request, codec.Undecodable):  # a stream item that did not parse
            await request.fail()
        kind = request.WhichOneof("input")
        admission = await self.admitter.admit(_options(request), [Input(
            "input", text=request.text if kind == "text" else None,
            ids=request.token_ids.ids if kind == "token_ids" else None,
            start_position=request.start_position)])
        (fitted,) = admission.sequences
        model = admission.model
        # Echoing the request's own repeated field skips a tensor -> list -> proto round trip.
        echo = (request.token_ids.ids if kind == "token_ids" and not fitted.truncated_tokens
                else fitted.ids.tolist())
        fields = pb.EmbedResponse(
            token_ids=echo, start_position=fitted.start_position, model=model.name,
            version=model.version, checkpoint_id=model.checkpoint_id,
            truncated_tokens=fitted.truncated_tokens,
            untrained_token_indices=self.admitter.untrained(model, fitted.ids),
            request_id=request.request_id)
        return await self._run(admission, fields, context, t0, _shm_output(request))

    async def _run(self, admission: Admission, fields: Any,
                   context: grpc.aio.ServicerContext, t0: int,
                   output: pb.SharedMemoryOutput | None = None) -> bytes:
        """Plan where the rows go (the response bytes, or a shared-memory region), batch
        the lookup into it, account for it."""
        self.batcher.check_room(admission.tokens)  # before allocating: cheap refusals
        shape = (admission.tokens, admission.dim)
        dest: codec.ResponseWriter | ShmDestination
        if output is None:
            dest = codec.Reply(fields, shape, admission.options.dtype).allocate()
        else:
            rows = self.shm.rows(output.region, output.offset, shape,
                                 BY_WIRE[admission.options.dtype].torch, "output")
            fields.embeddings.shape[:] = shape
            fields.embeddings.dtype = admission.options.dtype
            fields.output.region, fields.output.offset = output.region, output.offset
            fields.output.byte_size = rows.numel() * rows.element_size()
            dest = ShmDestination(rows, lambda timing: _with_timing(fields, timing))
        job = admission.job(dest, t0, self.deadline(context))
        data: bytes = await self.batcher.submit(job)
        tracing.record(admission, job, fields.request_id)  # tracing: spans from job.timing
        self.admitter.account(admission, job)
        return data

    async def Embed(self, request: pb.EmbedRequest,
                    context: grpc.aio.ServicerContext) -> bytes:
        """One sequence → [T, C]."""
        t0 = time.perf_counter_ns()
        return await self.call("Embed", request.model, request.request_id, context,
                                lambda: self._embed_one(request, context, t0))

    async def EmbedBatch(self, request: pb.EmbedBatchRequest,
                         context: grpc.aio.ServicerContext) -> bytes:
        """Many sequences → one packed [ΣT, C] with B+1 offsets, in one job."""
        t0 = time.perf_counter_ns()

        async def body() -> bytes:
            inputs = []
            for i, inp in enumerate(request.inputs):
                kind = inp.WhichOneof("input")
                inputs.append(Input(f"inputs[{i}]", text=inp.text if kind == "text" else None,
                                    ids=inp.token_ids.ids if kind == "token_ids" else None,
                                    start_position=inp.start_position))
            admission = await self.admitter.admit(_options(request), inputs)
            model = admission.model
            offsets = np.cumsum([0, *admission.lengths]).tolist()
            untrained = self.admitter.untrained_per_sequence(admission)
            items = [pb.BatchItem(token_ids=f.ids.numpy(), start_position=f.start_position,
                                  truncated_tokens=f.truncated_tokens,
                                  untrained_token_indices=u)
                     for f, u in zip(admission.sequences, untrained)]
            fields = pb.EmbedBatchResponse(
                offsets=offsets, items=items, model=model.name, version=model.version,
                checkpoint_id=model.checkpoint_id, request_id=request.request_id)
            return await self._run(admission, fields, context, t0, _shm_output(request))

        return await self.call("EmbedBatch", request.model, request.request_id, context, body)

    async def EmbedStream(self, requests: AsyncIterator[pb.EmbedRequest],
                          context: grpc.aio.ServicerContext) -> AsyncIterator[bytes]:
        """Bidi stream; up to STREAM_WINDOW requests in flight, responses in request order.

        A bad request ends the stream with its status; responses before it were delivered.
        """
        window: asyncio.Queue[asyncio.Task[bytes] | None] = asyncio.Queue(STREAM_WINDOW)

        async def read() -> None:
            async for request in requests:
                t0 = time.perf_counter_ns()
                await window.put(asyncio.ensure_future(self.call(
                    "EmbedStream", request.model, request.request_id, context,
                    lambda r=request, t=t0: self._embed_one(r, context, t),  # type: ignore[misc]
                    in_stream=True)))
            await window.put(None)

        reader = asyncio.ensure_future(read())
        try:
            while (task := await window.get()) is not None:
                try:
                    data = await task
                except _Status as failed:  # in order: every answer before it was yielded
                    await context.abort(failed.code, failed.message)
                yield data
            await reader
        finally:
            reader.cancel()
            while not window.empty():
                pending = window.get_nowait()
                if pending is not None:
                    pending.cancel()

    # -- tokenizer and model RPCs ---------------------------------------------------------

    async def Tokenize(self, request: pb.TokenizeRequest,
                       context: grpc.aio.ServicerContext) -> pb.TokenizeResponse:
        """Text → ids and each token's bytes."""
        async def body() -> pb.TokenizeResponse:
            model = self.repo.get(request.model, request.version)
            check_text(request.text, self.limits, "text")
            ids = await asyncio.get_running_loop().run_in_executor(
                self._pool, model.tokenizer.encode, request.text, request.allow_special_tokens)
            return pb.TokenizeResponse(token_ids=ids, tokens=model.tokenizer.token_bytes(ids),
                                       model=model.name, version=model.version)

        return await self.call("Tokenize", request.model, "", context, body)

    async def Detokenize(self, request: pb.DetokenizeRequest,
                         context: grpc.aio.ServicerContext) -> pb.DetokenizeResponse:
        """Ids → text (invalid UTF-8 becomes U+FFFD)."""
        async def body() -> pb.DetokenizeResponse:
            model = self.repo.get(request.model, request.version)
            ids = np.array(request.token_ids, dtype=np.int64)
            check_ids(ids, model, "token_ids")
            return pb.DetokenizeResponse(text=model.tokenizer.decode(ids.tolist()),
                                         model=model.name, version=model.version)

        return await self.call("Detokenize", request.model, "", context, body)

    async def ListModels(self, request: pb.ListModelsRequest,
                         context: grpc.aio.ServicerContext) -> pb.ListModelsResponse:
        """Every loaded model version."""
        async def body() -> pb.ListModelsResponse:
            models = self.repo.models
            infos = [self.model_info(models[name]) for name in sorted(models)]
            return pb.ListModelsResponse(models=infos)

        return await self.call("ListModels", "", "", context, body)

    async def GetModelInfo(self, request: pb.GetModelInfoRequest,
                           context: grpc.aio.ServicerContext) -> pb.ModelInfo:
        """One model's tables, tokenizer and limits."""
        async def body() -> pb.ModelInfo:
            return self.model_info(self.repo.get(request.model, request.version))

        return await self.call("GetModelInfo", request.model, "", context, body)

    # -- shared-memory regions ------------------------------------------------------------

    async def RegisterSharedMemory(self, request: pb.RegisterSharedMemoryRequest,
                                   context: grpc.aio.ServicerContext
                                   ) -> pb.RegisterSharedMemoryResponse:
        """Map a client's /dev/shm object so requests can name it as their output."""
        async def body() -> pb.RegisterSharedMemoryResponse:
            r = request.region
            self.shm.register(r.name, r.key, r.offset, r.byte_size)
            return pb.RegisterSharedMemoryResponse()

        return await self.call("RegisterSharedMemory", "", "", context, body)

    async def UnregisterSharedMemory(self, request: pb.UnregisterSharedMemoryRequest,
                                     context: grpc.aio.ServicerContext
                                     ) -> pb.UnregisterSharedMemoryResponse:
        """Forget a region ("" = all); requests already writing to it finish safely."""
        async def body() -> pb.UnregisterSharedMemoryResponse:
            self.shm.unregister(request.name)
            return pb.UnregisterSharedMemoryResponse()

        return await self.call("UnregisterSharedMemory", "", "", context, body)

    async def ListSharedMemory(self, request: pb.ListSharedMemoryRequest,
                               context: grpc.aio.ServicerContext
                               ) -> pb.ListSharedMemoryResponse:
        """Every registered region."""
        async def body() -> pb.ListSharedMemoryResponse:
            return pb.ListSharedMemoryResponse(regions=[
                pb.SharedMemoryRegion(name=r.name, key=r.key, offset=r.offset,
                                      byte_size=r.byte_size) for r in self.shm.regions()])

        return await self.call("ListSharedMemory", "", "", context, body)

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
            is_default=model.name == self.repo.default_model,
            max_tokens_per_request=min(self.limits.max_tokens_per_request, m.max_seq_len),
            max_text_bytes=self.limits.max_text_bytes,
            max_message_bytes=self.limits.max_message_bytes,
            provenance_json=json.dumps(m.provenance, sort_keys=True),
            has_row_updates=model.untrained is not None, untrained_rows=untrained,
            family=m.family, rules=m.rules.describe(), hidden_size=m.width,
            has_tokenizer=m.tokenizer is not None)

    def handlers(self) -> grpc.GenericRpcHandler:
        """The service's method handlers; embedding RPCs pass pre-encoded bytes through."""
        return grpc.method_handlers_generic_handler(SERVICE_NAME, {
            "Embed": self.unary("Embed", self.Embed, pb.EmbedRequest, True),
            "EmbedBatch": self.unary("EmbedBatch", self.EmbedBatch, pb.EmbedBatchRequest, True),
            "EmbedStream": grpc.stream_stream_rpc_method_handler(
                self.EmbedStream, codec.request_parser(pb.EmbedRequest), codec.identity),
            "Tokenize": self.unary("Tokenize", self.Tokenize, pb.TokenizeRequest),
            "Detokenize": self.unary("Detokenize", self.Detokenize, pb.DetokenizeRequest),
            "ListModels": self.unary("ListModels", self.ListModels, pb.ListModelsRequest),
            "GetModelInfo": self.unary("GetModelInfo", self.GetModelInfo,
                                       pb.GetModelInfoRequest),
            "RegisterSharedMemory": self.unary("RegisterSharedMemory", self.RegisterSharedMemory,
                                               pb.RegisterSharedMemoryRequest),
            "UnregisterSharedMemory": self.unary("UnregisterSharedMemory",
                                                 self.UnregisterSharedMemory,
                                                 pb.UnregisterSharedMemoryRequest),
            "ListSharedMemory": self.unary("ListSharedMemory", self.ListSharedMemory,
                                           pb.ListSharedMemoryRequest),
        })

    def unary(self, rpc: str, fn: Any, request_type: Any,
              raw: bool = False) -> grpc.RpcMethodHandler:
        """A unary handler whose undecodable requests get INVALID_ARGUMENT (any front's);
        ``raw``: the handler returns encoded bytes."""
        async def handler(request: Any, context: grpc.aio.ServicerContext) -> Any:
            if isinstance(request, codec.Undecodable):
                return await self.call(rpc, "", "", context, request.fail)
            return await fn(request, context)

        ser = codec.identity if raw else (lambda m: m.SerializeToString())
        return grpc.unary_unary_rpc_method_handler(handler, codec.request_parser(request_type),
                                                   ser)


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


def _shm_output(request: pb.EmbedRequest | pb.EmbedBatchRequest
                ) -> pb.SharedMemoryOutput | None:
    return request.output if request.HasField("output") else None


def _with_timing(fields: Any, timing: Any) -> bytes:
    """A shared-memory response: the small fields plus the timing, serialised."""
    fields.timing.CopyFrom(pb.Timing(queue_ns=timing.queue_ns, tokenize_ns=timing.tokenize_ns,
                                     compute_ns=timing.compute_ns, total_ns=timing.total_ns))
    data: bytes = fields.SerializeToString()
    return data

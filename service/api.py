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
import torch

from genproto.embedding.v1 import embedding_pb2 as pb
from service import codec
from service.batcher import Batcher, Job
from service.errors import EmbedError, InvalidArgument, Unauthenticated, Unavailable, status_for
from service.metrics import Metrics
from service.repository import LoadedModel, Repository
from service.validation import (
    Fitted,
    Limits,
    check_compose,
    check_enum,
    check_ids,
    check_response_size,
    check_text,
    fit_length,
)

__all__ = ["SERVICE_NAME", "UNKNOWN_MODEL", "EmbeddingService"]

SERVICE_NAME = "embedding.v1.EmbeddingService"
UNKNOWN_MODEL = "_unknown"  # metric label for requests naming a model that is not loaded
STREAM_WINDOW = 64  # requests of one stream in flight at once: pipelining with backpressure
log = logging.getLogger("service.api")


class _Status(Exception):
    """A stream item's failure, carried to the stream's writer to abort in order."""

    def __init__(self, code: grpc.StatusCode, message: str) -> None:
        super().__init__(message)
        self.code, self.message = code, message


class _Input:
    """What Embed and EmbedBatch inputs share: text or ids, and a start position."""

    def __init__(self, msg: Any) -> None:
        self.kind = msg.WhichOneof("input")
        self.text: str = msg.text
        self.ids = msg.token_ids.ids
        self.start_position: int = msg.start_position


class EmbeddingService:
    """Implements embedding.v1.EmbeddingService on a repository and a batcher."""

    def __init__(self, repo: Repository, batcher: Batcher, metrics: Metrics, limits: Limits,
                 tokenize_pool: ThreadPoolExecutor, auth_token: str = "") -> None:
        self.repo = repo
        self.batcher = batcher
        self.metrics = metrics
        self.limits = limits
        self._pool = tokenize_pool
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

    async def _call(self, rpc: str, model: str, request_id: str,
                    context: grpc.aio.ServicerContext, body: Callable[[], Awaitable[Any]],
                    in_stream: bool = False) -> Any:
        """Run one request's body with admission, metrics and the status mapping.

        A failure aborts the RPC, except ``in_stream``: then it is raised as ``_Status``
        for the stream to abort with once the answers before it are out.
        """
        t0 = time.perf_counter()
        self.metrics.inflight += 1
        code = grpc.StatusCode.OK
        try:
            self._admit(context)
            return await body()
        except asyncio.CancelledError:
            code = grpc.StatusCode.CANCELLED  # the client went away; nothing to answer
            raise
        except Exception as e:
            code, message = status_for(e, request_id)
            if not isinstance(e, EmbedError):
                log.exception("internal error in %s request_id=%s", rpc, request_id)
            if in_stream:
                raise _Status(code, message) from e
            await context.abort(code, message)
        finally:
            self.metrics.inflight -= 1
            # A model name from the request becomes a label only if it is loaded: clients
            # must not be able to mint unbounded metric series.
            label = model or self.repo.default_model
            if label not in self.repo.models:
                label = UNKNOWN_MODEL
            self.metrics.requests.labels(rpc, label, code.name).inc()
            self.metrics.request_duration.labels(rpc, label).observe(time.perf_counter() - t0)

    def _deadline(self, context: grpc.aio.ServicerContext) -> float | None:
        remaining = context.time_remaining()
        return None if remaining is None else time.monotonic() + remaining

    async def _tokens(self, model: LoadedModel, inp: _Input, allow_special: bool,
                      field: str) -> tuple[np.ndarray, int]:
        if inp.kind == "text":
            check_text(inp.text, self.limits, f"{field}.text")
            t0 = time.perf_counter_ns()
            ids = await asyncio.get_running_loop().run_in_executor(
                self._pool, model.tokenizer.encode, inp.text, allow_special)
            ns = time.perf_counter_ns() - t0
            self.metrics.tokenize_duration.observe(ns / 1e9)
            return np.asarray(ids, dtype=np.int64), ns
        if inp.kind == "token_ids":
            ids_arr = np.array(inp.ids, dtype=np.int64)  # buffer protocol: ~15x fromiter
            check_ids(ids_arr, model, f"{field}.token_ids.ids")
            return ids_arr, 0
        raise InvalidArgument(f"{field} is empty: set text or token_ids")

    def _untrained(self, model: LoadedModel, ids: torch.Tensor) -> list[int]:
        if model.untrained is None:
            return []
        idx = model.untrained[ids].nonzero().flatten().tolist()  # indices i < T
        if idx:
            self.metrics.untrained_lookups.labels(model.name).inc(len(idx))
        return idx

    def _account(self, model: LoadedModel, job: Job, dtype: int) -> None:
        # On the event loop after the batch: metrics are never touched by two threads.
        nbytes = job.tokens * model.tables.dim * codec.DTYPES[dtype].itemsize
        self.metrics.tokens.labels(model.name).inc(job.tokens)
        self.metrics.output_bytes.labels(model.name, codec.DTYPE_NAMES[dtype]).inc(nbytes)
        self.metrics.queue_duration.observe(job.queue_ns / 1e9)

    # -- embedding RPCs -------------------------------------------------------------------

    async def _embed_one(self, request: pb.EmbedRequest, context: grpc.aio.ServicerContext,
                         t0: int) -> bytes:
        model = self.repo.get(request.model, request.version)
        compose = check_enum(request.compose, pb.Compose, "compose")
        dtype = check_enum(request.dtype, pb.DType, "dtype")
        truncate = check_enum(request.truncate, pb.Truncate, "truncate")
        check_compose(compose, model)
        ids, tokenize_ns = await self._tokens(model, _Input(request),
                                              request.allow_special_tokens, "input")
        fitted = fit_length(ids, request.start_position, truncate, model, self.limits,
                            "input")
        torch_dtype = codec.DTYPES[dtype]
        check_response_size(len(fitted.ids), model, torch_dtype.itemsize, self.limits)
        untrained = self._untrained(model, fitted.ids)
        # Echoing the request's own repeated field skips a tensor -> list -> proto round trip.
        echo = (request.token_ids.ids if request.WhichOneof("input") == "token_ids"
                and not fitted.truncated_tokens else fitted.ids.tolist())

        fields = pb.EmbedResponse(
            token_ids=echo, start_position=fitted.start_position, model=model.name,
            version=model.version, checkpoint_id=model.checkpoint_id,
            truncated_tokens=fitted.truncated_tokens, untrained_token_indices=untrained,
            request_id=request.request_id)
        T = len(fitted.ids)
        job = Job(model.tables, fitted.ids, [(fitted.start_position, T)], compose,
                  codec.Reply(fields, (T, model.tables.dim), dtype), t0, tokenize_ns,
                  self._deadline(context))
        data = await self.batcher.submit(job)
        self._account(model, job, dtype)
        return data

    async def Embed(self, request: pb.EmbedRequest,
                    context: grpc.aio.ServicerContext) -> bytes:
        """One sequence → [T, C]."""
        t0 = time.perf_counter_ns()
        return await self._call("Embed", request.model, request.request_id, context,
                                lambda: self._embed_one(request, context, t0))

    async def EmbedBatch(self, request: pb.EmbedBatchRequest,
                         context: grpc.aio.ServicerContext) -> bytes:
        """Many sequences → one packed [ΣT, C] with B+1 offsets, in one job."""
        t0 = time.perf_counter_ns()

        async def body() -> bytes:
            model = self.repo.get(request.model, request.version)
            compose = check_enum(request.compose, pb.Compose, "compose")
            dtype = check_enum(request.dtype, pb.DType, "dtype")
            truncate = check_enum(request.truncate, pb.Truncate, "truncate")
            check_compose(compose, model)
            if not request.inputs:
                raise InvalidArgument("inputs is empty: give at least one input")
            tokenized = await asyncio.gather(*(
                self._tokens(model, _Input(inp), request.allow_special_tokens, f"inputs[{i}]")
                for i, inp in enumerate(request.inputs)))
            fitted: list[Fitted] = [
                fit_length(ids, inp.start_position, truncate, model, self.limits, f"inputs[{i}]")
                for i, ((ids, _), inp) in enumerate(zip(tokenized, request.inputs))]
            total = sum(len(f.ids) for f in fitted)
            if total > self.limits.max_tokens_per_request:
                raise InvalidArgument(f"inputs have {total} tokens in all; "
                                      f"max_tokens_per_request is "
                                      f"{self.limits.max_tokens_per_request}")
            torch_dtype = codec.DTYPES[dtype]
            check_response_size(total, model, torch_dtype.itemsize, self.limits)
            offsets = np.cumsum([0] + [len(f.ids) for f in fitted]).tolist()
            items = [pb.BatchItem(token_ids=f.ids.tolist(), start_position=f.start_position,
                                  truncated_tokens=f.truncated_tokens,
                                  untrained_token_indices=self._untrained(model, f.ids))
                     for f in fitted]
            tokenize_ns = sum(ns for _, ns in tokenized)

            fields = pb.EmbedBatchResponse(
                offsets=offsets, items=items, model=model.name, version=model.version,
                checkpoint_id=model.checkpoint_id, request_id=request.request_id)
            spans = [(f.start_position, len(f.ids)) for f in fitted]
            job = Job(model.tables, torch.cat([f.ids for f in fitted]), spans, compose,
                      codec.Reply(fields, (total, model.tables.dim), dtype), t0, tokenize_ns,
                      self._deadline(context))
            data = await self.batcher.submit(job)
            self._account(model, job, dtype)
            return data

        return await self._call("EmbedBatch", request.model, request.request_id, context, body)

    async def EmbedStream(self, requests: AsyncIterator[pb.EmbedRequest],
                          context: grpc.aio.ServicerContext) -> AsyncIterator[bytes]:
        """Bidi stream; up to STREAM_WINDOW requests in flight, responses in request order.

        A bad request ends the stream with its status; responses before it were delivered.
        """
        window: asyncio.Queue[asyncio.Task[bytes] | None] = asyncio.Queue(STREAM_WINDOW)

        async def read() -> None:
            async for request in requests:
                t0 = time.perf_counter_ns()
                await window.put(asyncio.ensure_future(self._call(
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

        return await self._call("Tokenize", request.model, "", context, body)

    async def Detokenize(self, request: pb.DetokenizeRequest,
                         context: grpc.aio.ServicerContext) -> pb.DetokenizeResponse:
        """Ids → text (invalid UTF-8 becomes U+FFFD)."""
        async def body() -> pb.DetokenizeResponse:
            model = self.repo.get(request.model, request.version)
            ids = np.array(request.token_ids, dtype=np.int64)
            check_ids(ids, model, "token_ids")
            return pb.DetokenizeResponse(text=model.tokenizer.decode(ids.tolist()),
                                         model=model.name, version=model.version)

        return await self._call("Detokenize", request.model, "", context, body)

    async def ListModels(self, request: pb.ListModelsRequest,
                         context: grpc.aio.ServicerContext) -> pb.ListModelsResponse:
        """Every loaded model version."""
        async def body() -> pb.ListModelsResponse:
            models = self.repo.models
            infos = [self.model_info(models[name]) for name in sorted(models)]
            return pb.ListModelsResponse(models=infos)

        return await self._call("ListModels", "", "", context, body)

    async def GetModelInfo(self, request: pb.GetModelInfoRequest,
                           context: grpc.aio.ServicerContext) -> pb.ModelInfo:
        """One model's tables, tokenizer and limits."""
        async def body() -> pb.ModelInfo:
            return self.model_info(self.repo.get(request.model, request.version))

        return await self._call("GetModelInfo", request.model, "", context, body)

    def model_info(self, model: LoadedModel) -> pb.ModelInfo:
        """The ModelInfo message for a loaded model."""
        m = model.checkpoint.manifest
        untrained = -1 if model.untrained is None else int(model.untrained[: m.vocab_size].sum())
        return pb.ModelInfo(
            model=model.name, version=model.version, checkpoint_id=model.checkpoint_id,
            vocab_size=m.vocab_size, table_rows=m.table_rows, dim=m.dim,
            max_seq_len=m.max_seq_len, position=m.position, storage_dtype=m.dtype,
            device=str(model.tables.device),
            tokenizer=pb.TokenizerInfo(encoding=m.tokenizer.encoding, file=m.tokenizer.file,
                                       sha256=m.tokenizer.sha256,
                                       special_tokens=m.tokenizer.special_tokens),
            is_default=model.name == self.repo.default_model,
            max_tokens_per_request=min(self.limits.max_tokens_per_request, m.max_seq_len),
            max_text_bytes=self.limits.max_text_bytes,
            max_message_bytes=self.limits.max_message_bytes,
            provenance_json=json.dumps(m.provenance, sort_keys=True),
            has_row_updates=model.untrained is not None, untrained_rows=untrained)

    def handlers(self) -> grpc.GenericRpcHandler:
        """The service's method handlers; embedding RPCs pass pre-encoded bytes through."""
        def unary(fn: Any, req: Any, raw: bool) -> grpc.RpcMethodHandler:
            ser = codec.identity if raw else (lambda m: m.SerializeToString())
            return grpc.unary_unary_rpc_method_handler(fn, req.FromString, ser)

        return grpc.method_handlers_generic_handler(SERVICE_NAME, {
            "Embed": unary(self.Embed, pb.EmbedRequest, True),
            "EmbedBatch": unary(self.EmbedBatch, pb.EmbedBatchRequest, True),
            "EmbedStream": grpc.stream_stream_rpc_method_handler(
                self.EmbedStream, pb.EmbedRequest.FromString, codec.identity),
            "Tokenize": unary(self.Tokenize, pb.TokenizeRequest, False),
            "Detokenize": unary(self.Detokenize, pb.DetokenizeRequest, False),
            "ListModels": unary(self.ListModels, pb.ListModelsRequest, False),
            "GetModelInfo": unary(self.GetModelInfo, pb.GetModelInfoRequest, False),
        })

"""Sync and async clients for ``embedding.v1.EmbeddingService`` (grpcio + numpy, no torch).

Both clients take the same options: ``target`` ("host:port"), TLS (``tls=True`` for the
system roots, or ``root_certificates`` / ``client_certificate`` + ``client_key`` as paths or
bytes), ``token`` (sent as ``authorization: Bearer <token>``), a default ``timeout`` in
seconds, ``raw_bfloat16`` (see client.codec) and ``retry`` (a client.retry.RetryPolicy: gRPC
retries UNAVAILABLE itself). Every failed RPC raises EmbeddingError.
"""

from __future__ import annotations

from collections.abc import AsyncIterable, AsyncIterator, Iterable, Iterator, Sequence
from pathlib import Path
from typing import Any, Unpack, overload

import grpc
import grpc.aio

from client.codec import (
    BatchOptions,
    Embedding,
    EmbeddingError,
    EmbedOptions,
    batch_request,
    decode_batch,
    decode_embedding,
    embed_request,
    stream_request,
)
from client.cuda_calls import AsyncCudaCalls, CudaCalls
from client.cuda_shm import CudaEmbedding, CudaSharedMemoryRegion
from client.outputs import decoded as _decoded
from client.outputs import placed as _placed
from client.retry import RetryPolicy
from client.shm import SharedMemoryRegion
from genproto.embedding.v1 import embedding_pb2 as pb
from genproto.embedding.v1 import embedding_pb2_grpc as pb_grpc

__all__ = ["DEFAULT_TARGET", "AsyncEmbeddingClient", "EmbeddingClient", "EmbeddingError"]

DEFAULT_TARGET = "127.0.0.1:50051"

Inputs = Sequence[str | Sequence[int]]
Credential = str | Path | bytes | None


def _read(source: Credential) -> bytes | None:
    if source is None or isinstance(source, bytes):
        return source
    return Path(source).read_bytes()


class _Channel:
    """Channel settings shared by both clients."""

    def __init__(self, target: str = DEFAULT_TARGET, *, tls: bool = False,
                 root_certificates: Credential = None, client_certificate: Credential = None,
                 client_key: Credential = None, token: str | None = None,
                 timeout: float | None = None, raw_bfloat16: bool = False,
                 retry: RetryPolicy | None = None,
                 options: Sequence[tuple[str, Any]] = ()) -> None:
        self.target = target
        self.timeout = timeout
        self.raw_bfloat16 = raw_bfloat16
        # Sent per call rather than as call credentials, which grpc refuses on plaintext.
        self._metadata = (("authorization", f"Bearer {token}"),) if token else ()
        self._credentials: grpc.ChannelCredentials | None = None
        if tls or root_certificates or client_certificate or client_key:
            self._credentials = grpc.ssl_channel_credentials(
                _read(root_certificates), _read(client_key), _read(client_certificate))
        # The server bounds responses by its max_message_bytes; the client takes any size.
        self._options = [("grpc.max_receive_message_length", -1),
                         *(retry.channel_options() if retry else ()), *options]

    def _kw(self, timeout: float | None) -> dict[str, Any]:
        return {"timeout": self.timeout if timeout is None else timeout,
                "metadata": self._metadata}


class EmbeddingClient(_Channel, CudaCalls):
    """Blocking client over one grpc channel; a context manager (or call close())."""

    def __init__(self, target: str = DEFAULT_TARGET, **kwargs: Any) -> None:
        super().__init__(target, **kwargs)
        self._channel = (grpc.secure_channel(target, self._credentials, self._options)
                         if self._credentials else grpc.insecure_channel(target, self._options))
        self._stub = pb_grpc.EmbeddingServiceStub(self._channel)

    def __enter__(self) -> EmbeddingClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        """Close the channel."""
        self._channel.close()

    def _call(self, method: Any, request: Any, timeout: float | None) -> Any:
        try:
            return method(request, **self._kw(timeout))
        except grpc.RpcError as e:
            raise EmbeddingError.from_rpc(e) from e

    @overload
    def embed(self, text: str | None = None, ids: Sequence[int] | None = None, *,
              timeout: float | None = None, shm: SharedMemoryRegion | None = None,
              shm_offset: int = 0, cuda_region: None = None, cuda_offset: int = 0,
              **options: Unpack[EmbedOptions]) -> Embedding: ...
    @overload
    def embed(self, text: str | None = None, ids: Sequence[int] | None = None, *,
              timeout: float | None = None, shm: None = None, shm_offset: int = 0,
              cuda_region: CudaSharedMemoryRegion, cuda_offset: int = 0,
              **options: Unpack[EmbedOptions]) -> CudaEmbedding: ...
    def embed(self, text: str | None = None, ids: Sequence[int] | None = None, *,
              timeout: float | None = None, shm: SharedMemoryRegion | None = None,
              shm_offset: int = 0, cuda_region: CudaSharedMemoryRegion | None = None,
              cuda_offset: int = 0,
              **options: Unpack[EmbedOptions]) -> Embedding | CudaEmbedding:
        """Embed one sequence (exactly one of text or ids): Embedding.array is (T, C).

        options: model, version, start_position, compose ("token+position" | "token" |
        "position"), dtype ("float32" | "float16" | "bfloat16"), truncate ("none" |
        "right" | "left"), allow_special_tokens, add_special_tokens (absent: the model's
        default), request_id. ``shm``: a registered region;
        the server writes the rows there (at ``shm_offset``) and ``array`` is a view of it.
        ``cuda_region``: a registered client.cuda_shm.CudaSharedMemoryRegion; the server's
        device writes the rows there (at ``cuda_offset``) and the answer is a CudaEmbedding
        whose ``rows`` are a view of it on its GPU (``torch.from_dlpack(e.rows)``).
        """
        request = _placed(embed_request(text, ids, **options), shm, shm_offset, cuda_region,
                          cuda_offset)
        resp = self._call(self._stub.Embed, request, timeout)
        return _decoded(resp, shm, self.raw_bfloat16, cuda_region)

    def register_shared_memory(self, region: SharedMemoryRegion, *,
                               timeout: float | None = None) -> None:
        """Let the server write into ``region`` (it maps the same /dev/shm object)."""
        request = pb.RegisterSharedMemoryRequest(region=region.region_message())
        self._call(self._stub.RegisterSharedMemory, request, timeout)

    def unregister_shared_memory(self, name: str = "", *, timeout: float | None = None) -> None:
        """Forget a region on the server ("" = all of this server's regions)."""
        request = pb.UnregisterSharedMemoryRequest(name=name)
        self._call(self._stub.UnregisterSharedMemory, request, timeout)

    def list_shared_memory(self, *, timeout: float | None = None) -> list[pb.SharedMemoryRegion]:
        """The regions the server has registered."""
        return list(self._call(self._stub.ListSharedMemory, pb.ListSharedMemoryRequest(),
                               timeout).regions)

    def embed_batch(self, inputs: Inputs, *, start_positions: int | Sequence[int] = 0,
                    timeout: float | None = None,
                    **options: Unpack[BatchOptions]) -> list[Embedding]:
        """Embed many sequences in one RPC; each array is a view into the one packed tensor."""
        resp = self._call(self._stub.EmbedBatch,
                          batch_request(inputs, start_positions, **options), timeout)
        return decode_batch(resp, self.raw_bfloat16)

    def embed_stream(self, requests: Iterable[Any], *, timeout: float | None = None,
                     **options: Unpack[EmbedOptions]) -> Iterator[Embedding]:
        """Bidi stream of str, id sequences or pb.EmbedRequests; results in request order.

        ``options`` (as in embed()) apply to str and id items, not to ready EmbedRequests.
        """
        reqs = (stream_request(item, **options) for item in requests)
        call = self._stub.EmbedStream(reqs, **self._kw(timeout))
        try:
            for resp in call:
                yield decode_embedding(resp, self.raw_bfloat16)
        except grpc.RpcError as e:
            raise EmbeddingError.from_rpc(e) from e
        finally:
            call.cancel()  # a consumer that stops early must not leave the stream open

    def tokenize(self, text: str, *, model: str = "", version: int = 0,
                 allow_special_tokens: bool = False,
                 timeout: float | None = None) -> tuple[list[int], list[bytes]]:
        """Text -> (token ids, each token's bytes)."""
        req = pb.TokenizeRequest(model=model, version=version, text=text,
                                 allow_special_tokens=allow_special_tokens)
        resp = self._call(self._stub.Tokenize, req, timeout)
        return list(resp.token_ids), list(resp.tokens)

    def detokenize(self, ids: Sequence[int], *, model: str = "", version: int = 0,
                   timeout: float | None = None) -> str:
        """Token ids -> text (invalid UTF-8 becomes U+FFFD)."""
        req = pb.DetokenizeRequest(model=model, version=version, token_ids=[int(i) for i in ids])
        return str(self._call(self._stub.Detokenize, req, timeout).text)

    def list_models(self, *, timeout: float | None = None) -> list[pb.ModelInfo]:
        """Every loaded model version."""
        return list(self._call(self._stub.ListModels, pb.ListModelsRequest(), timeout).models)

    def model_info(self, model: str = "", version: int = 0, *,
                   timeout: float | None = None) -> pb.ModelInfo:
        """One model's tables, tokenizer and limits ("" = default model, 0 = newest)."""
        req = pb.GetModelInfoRequest(model=model, version=version)
        return self._call(self._stub.GetModelInfo, req, timeout)


class AsyncEmbeddingClient(_Channel, AsyncCudaCalls):
    """asyncio client over one grpc.aio channel: EmbeddingClient's methods, awaited."""

    def __init__(self, target: str = DEFAULT_TARGET, **kwargs: Any) -> None:
        super().__init__(target, **kwargs)
        self._channel = (grpc.aio.secure_channel(target, self._credentials, self._options)
                         if self._credentials
                         else grpc.aio.insecure_channel(target, self._options))
        self._stub = pb_grpc.EmbeddingServiceStub(self._channel)

    async def __aenter__(self) -> AsyncEmbeddingClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def close(self) -> None:
        """Close the channel."""
        await self._channel.close()

    async def _call(self, method: Any, request: Any, timeout: float | None) -> Any:
        try:
            return await method(request, **self._kw(timeout))
        except grpc.RpcError as e:
            raise EmbeddingError.from_rpc(e) from e

    @overload
    async def embed(self, text: str | None = None, ids: Sequence[int] | None = None, *,
                    timeout: float | None = None, shm: SharedMemoryRegion | None = None,
                    shm_offset: int = 0, cuda_region: None = None, cuda_offset: int = 0,
                    **options: Unpack[EmbedOptions]) -> Embedding: ...
    @overload
    async def embed(self, text: str | None = None, ids: Sequence[int] | None = None, *,
                    timeout: float | None = None, shm: None = None, shm_offset: int = 0,
                    cuda_region: CudaSharedMemoryRegion, cuda_offset: int = 0,
                    **options: Unpack[EmbedOptions]) -> CudaEmbedding: ...
    async def embed(self, text: str | None = None, ids: Sequence[int] | None = None, *,
                    timeout: float | None = None, shm: SharedMemoryRegion | None = None,
                    shm_offset: int = 0, cuda_region: CudaSharedMemoryRegion | None = None,
                    cuda_offset: int = 0,
                    **options: Unpack[EmbedOptions]) -> Embedding | CudaEmbedding:
        """Embed one sequence; see EmbeddingClient.embed."""
        request = _placed(embed_request(text, ids, **options), shm, shm_offset, cuda_region,
                          cuda_offset)
        resp = await self._call(self._stub.Embed, request, timeout)
        return _decoded(resp, shm, self.raw_bfloat16, cuda_region)

    async def register_shared_memory(self, region: SharedMemoryRegion, *,
                                     timeout: float | None = None) -> None:
        """See EmbeddingClient.register_shared_memory."""
        request = pb.RegisterSharedMemoryRequest(region=region.region_message())
        await self._call(self._stub.RegisterSharedMemory, request, timeout)

    async def unregister_shared_memory(self, name: str = "", *,
                                       timeout: float | None = None) -> None:
        """See EmbeddingClient.unregister_shared_memory."""
        request = pb.UnregisterSharedMemoryRequest(name=name)
        await self._call(self._stub.UnregisterSharedMemory, request, timeout)

    async def embed_batch(self, inputs: Inputs, *, start_positions: int | Sequence[int] = 0,
                          timeout: float | None = None,
                          **options: Unpack[BatchOptions]) -> list[Embedding]:
        """Embed many sequences in one RPC; see EmbeddingClient.embed_batch."""
        resp = await self._call(self._stub.EmbedBatch,
                                batch_request(inputs, start_positions, **options), timeout)
        return decode_batch(resp, self.raw_bfloat16)

    async def embed_stream(self, requests: Iterable[Any] | AsyncIterable[Any], *,
                           timeout: float | None = None,
                           **options: Unpack[EmbedOptions]) -> AsyncIterator[Embedding]:
        """Bidi stream from a sync or async iterable; see EmbeddingClient.embed_stream."""

        async def reqs() -> AsyncIterator[pb.EmbedRequest]:
            if isinstance(requests, AsyncIterable):
                async for item in requests:
                    yield stream_request(item, **options)
            else:
                for item in requests:
                    yield stream_request(item, **options)

        call = self._stub.EmbedStream(reqs(), **self._kw(timeout))
        try:
            async for resp in call:
                yield decode_embedding(resp, self.raw_bfloat16)
        except grpc.RpcError as e:
            raise EmbeddingError.from_rpc(e) from e
        finally:
            call.cancel()  # a consumer that stops early must not leave the stream open

    async def tokenize(self, text: str, *, model: str = "", version: int = 0,
                       allow_special_tokens: bool = False,
                       timeout: float | None = None) -> tuple[list[int], list[bytes]]:
        """Text -> (token ids, each token's bytes)."""
        req = pb.TokenizeRequest(model=model, version=version, text=text,
                                 allow_special_tokens=allow_special_tokens)
        resp = await self._call(self._stub.Tokenize, req, timeout)
        return list(resp.token_ids), list(resp.tokens)

    async def detokenize(self, ids: Sequence[int], *, model: str = "", version: int = 0,
                         timeout: float | None = None) -> str:
        """Token ids -> text (invalid UTF-8 becomes U+FFFD)."""
        req = pb.DetokenizeRequest(model=model, version=version, token_ids=[int(i) for i in ids])
        return str((await self._call(self._stub.Detokenize, req, timeout)).text)

    async def list_models(self, *, timeout: float | None = None) -> list[pb.ModelInfo]:
        """Every loaded model version."""
        resp = await self._call(self._stub.ListModels, pb.ListModelsRequest(), timeout)
        return list(resp.models)

    async def model_info(self, model: str = "", version: int = 0, *,
                         timeout: float | None = None) -> pb.ModelInfo:
        """One model's tables, tokenizer and limits ("" = default model, 0 = newest)."""
        req = pb.GetModelInfoRequest(model=model, version=version)
        return await self._call(self._stub.GetModelInfo, req, timeout)

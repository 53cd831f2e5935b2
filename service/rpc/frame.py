"""The per-RPC frame: auth, draining, deadline, metrics and the error→status map.

Applied where handlers are registered, to every method of every front, never opted into
per handler: ``Frame.grpc_service`` builds a service's handler table from its descriptor
(so an RPC's name is written once, as the servicer's method), and ``Frame.run`` is the
transport-neutral core any other front (HTTP) wraps its bodies in.

Open without credentials: only ``grpc.health.v1.Health`` and server reflection, which are
registered outside the frame (``OPEN_SERVICES``); every other RPC needs the token when one
is set. The frame resolves each caller's identity (``identity.Identities``: a token's name,
a client certificate's subject, or "" when auth is off) and its transport peer onto the
``Call``; shared memory uses both.

Servicer methods take ``(request, call)`` and return a message or pre-encoded bytes (an
answer the engine laid out in place): bytes pass through, messages are serialised. A
request whose bytes do not parse reaches its method as an ``Undecodable``. Stream methods take
``(requests, call)`` and run each item with ``Frame.run`` themselves.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any, TypeVar

import grpc
from google.protobuf.descriptor import ServiceDescriptor
from google.protobuf.message import DecodeError, Message
from google.protobuf.message_factory import GetMessageClass

from service.engine import Engine
from service.errors import (
    EmbedError,
    InvalidArgument,
    Unauthenticated,
    Unavailable,
    quote,
    status_for,
)
from service.rpc.identity import Identities

__all__ = ["OPEN_SERVICES", "UNKNOWN_MODEL", "Call", "Frame", "Refused", "Undecodable",
           "item_call"]

OPEN_SERVICES = ("grpc.health.v1.Health", "grpc.reflection.v1alpha.ServerReflection")
UNKNOWN_MODEL = "_unknown"  # metric label for requests naming a model that is not loaded
log = logging.getLogger("service.frame")
T = TypeVar("T")


class Call:
    """One RPC as the frame sees it, whatever the transport.

    A plain class with slots: one is built per RPC and per stream item, and a frozen
    dataclass's ``__init__`` costs microseconds a request. The peer is read from the
    transport only when asked for (the shared-memory RPCs): it costs a call into grpc."""

    __slots__ = ("_context", "_peer", "authorization", "deadline", "identity", "model",
                 "request_id", "rpc", "start_ns")

    def __init__(self, rpc: str, model: str = "", request_id: str = "",
                 authorization: str = "", deadline: float | None = None, start_ns: int = 0,
                 identity: str = "", peer: str = "", context: Any = None) -> None:
        self.rpc = rpc  # method name, the `rpc` metric label
        self.model = model  # the model the request names ("" = default), for the label
        self.request_id = request_id  # echoed in logs and INTERNAL messages
        self.authorization = authorization  # the `authorization` header/metadata value
        self.deadline = deadline  # time.monotonic() seconds; None = no deadline
        self.start_ns = start_ns  # time.perf_counter_ns() when it arrived
        self.identity = identity  # who is calling (Identities); "" = auth off, one namespace
        self._peer = peer  # e.g. "ipv4:127.0.0.1:5000"; "" = not read yet (or none)
        self._context = context  # the grpc ServicerContext the peer is read from

    @property
    def peer(self) -> str:
        """The transport's peer, e.g. "ipv4:127.0.0.1:5000" (grpc's ``context.peer()``)."""
        if not self._peer and self._context is not None:
            self._peer = self._context.peer() or ""
        return self._peer

    def __repr__(self) -> str:
        return (f"Call({self.rpc!r}, model={self.model!r}, request_id={self.request_id!r}, "
                f"deadline={self.deadline!r}, start_ns={self.start_ns}, "
                f"identity={self.identity!r}, peer={self._peer!r})")


class Refused(Exception):
    """An RPC answered with a non-OK status: the transport turns it into its own form."""

    def __init__(self, code: grpc.StatusCode, message: str) -> None:
        super().__init__(message)
        self.code, self.message = code, message


class Frame:
    """What every RPC of every front passes through, on one engine."""

    def __init__(self, engine: Engine, auth_token: str = "",
                 identities: Identities | None = None) -> None:
        self.engine = engine
        self.identities = identities if identities is not None else Identities(auth_token)

    def authorize(self, call: Call) -> None:
        """Credentials, then draining: the checks before any work."""
        if self.identities.required and not (
                call.identity or self.identities.resolve(call.authorization)):
            raise Unauthenticated("missing or invalid 'authorization: Bearer <token>'")
        if self.engine.draining:
            raise Unavailable("server is draining for shutdown; retry on another replica")

    async def run(self, call: Call, body: Callable[[], Awaitable[T]]) -> T:
        """Run ``body`` under the frame; a failure becomes ``Refused`` with its status."""
        metrics = self.engine.metrics
        counting = metrics.counting  # False with metrics off: nothing of them is paid
        t0 = time.perf_counter() if counting else 0.0
        if counting:
            metrics.inflight += 1
        code = grpc.StatusCode.INTERNAL  # a BaseException other than cancellation
        try:
            self.authorize(call)
            result = await body()
            code = grpc.StatusCode.OK
            return result
        except asyncio.CancelledError:
            code = grpc.StatusCode.CANCELLED  # the client went away; nothing to answer
            raise
        except Exception as e:
            code, message = status_for(e, call.request_id)
            if not isinstance(e, EmbedError):
                log.exception("internal error in %s request_id=%s", call.rpc,
                              quote(call.request_id))
            raise Refused(code, message) from e
        finally:
            # Counted before the status leaves: a client that scrapes right after its
            # error must see it in the metrics.
            if counting:
                metrics.inflight -= 1
                metrics.request_done(call.rpc, self._model_label(call.model), code.name,
                                     time.perf_counter() - t0)

    def _model_label(self, model: str) -> str:
        # A model name from the request becomes a label only if it is loaded: clients
        # must not be able to mint unbounded metric series.
        repo = self.engine.repo
        label = model or repo.default_model
        return label if label in repo.models else UNKNOWN_MODEL

    # -- gRPC registration ----------------------------------------------------------------

    def grpc_service(self, descriptor: ServiceDescriptor, servicer: object,
                     labels: Callable[[str, Any], tuple[str, str]]) -> grpc.GenericRpcHandler:
        """Every method of ``descriptor``, served by the servicer's method of that name,
        inside the frame. ``labels(rpc, request)`` gives (model, request_id)."""
        handlers = {}
        for method in descriptor.methods:
            fn = getattr(servicer, method.name)
            parse = _parser(GetMessageClass(method.input_type))
            if method.client_streaming and method.server_streaming:
                handlers[method.name] = grpc.stream_stream_rpc_method_handler(
                    self._grpc_stream(method.name, fn), parse, _serialize)
            elif not method.client_streaming and not method.server_streaming:
                handlers[method.name] = grpc.unary_unary_rpc_method_handler(
                    self._grpc_unary(method.name, fn, labels), parse, _serialize)
            else:  # the contract has none; refuse to serve what the frame cannot wrap
                raise TypeError(f"{descriptor.full_name}.{method.name}: unsupported shape")
        return grpc.method_handlers_generic_handler(descriptor.full_name, handlers)

    def _grpc_unary(self, rpc: str, fn: Callable[[Any, Call], Awaitable[Any]],
                    labels: Callable[[str, Any], tuple[str, str]]) -> Any:
        async def handler(request: Any, context: grpc.aio.ServicerContext) -> Any:
            start_ns = time.perf_counter_ns()
            if isinstance(request, Undecodable):
                call = grpc_call(rpc, context, start_ns, identities=self.identities)
                body: Callable[[], Awaitable[Any]] = request.fail
            else:
                model, request_id = labels(rpc, request)
                call = grpc_call(rpc, context, start_ns, model, request_id, self.identities)
                body = lambda: fn(request, call)  # noqa: E731
            try:
                return await self.run(call, body)
            except Refused as r:
                await context.abort(r.code, r.message)

        return handler

    def _grpc_stream(self, rpc: str,
                     fn: Callable[[AsyncIterator[Any], Call], AsyncIterator[Any]]) -> Any:
        async def handler(requests: AsyncIterator[Any],
                          context: grpc.aio.ServicerContext) -> AsyncIterator[Any]:
            call = grpc_call(rpc, context, time.perf_counter_ns(), identities=self.identities)
            try:
                try:
                    self.authorize(call)  # the stream's own credentials; each item is framed too
                except EmbedError as e:
                    await self.run(call, _raise(e))  # counted like any refusal
                async for response in fn(requests, call):
                    yield response
            except Refused as r:
                await context.abort(r.code, r.message)

        return handler

    async def item(self, call: Call, model: str, request_id: str,
                   body: Callable[[Call], Awaitable[T]]) -> T:
        """One item of a stream, framed like a unary call of its own: ``body`` gets the
        item's call (its own start time, model and request id)."""
        item = item_call(call, model, request_id, time.perf_counter_ns())
        return await self.run(item, lambda: body(item))


def item_call(call: Call, model: str, request_id: str, start_ns: int) -> Call:
    """``call`` for one item of its stream: the item's model, request id and start time."""
    return Call(call.rpc, model, request_id, call.authorization, call.deadline, start_ns,
                call.identity, call._peer, call._context)


def grpc_call(rpc: str, context: grpc.aio.ServicerContext, start_ns: int, model: str = "",
              request_id: str = "", identities: Identities | None = None) -> Call:
    """The ``Call`` of a gRPC request: its deadline, and its credentials and identity when
    there are any to check (the metadata is read only then: it costs on every RPC); the
    peer when asked for."""
    auth = identity = ""
    if identities is not None and (identities.required or identities.tls_subject):
        for key, value in context.invocation_metadata() or ():
            if key == "authorization" and isinstance(value, str):
                auth = value
        identity = identities.resolve(auth, context.auth_context()
                                      if identities.tls_subject else None)
    remaining = context.time_remaining()
    deadline = None if remaining is None else time.monotonic() + remaining
    return Call(rpc, model, request_id, auth, deadline, start_ns, identity, context=context)


class Undecodable:
    """A request whose bytes did not parse (e.g. bad UTF-8 in a string field). Handlers
    answer it with INVALID_ARGUMENT; grpc would otherwise answer UNKNOWN, or, inside a
    stream, end the request iterator with an exception the servicer never sees."""

    model = ""  # read for metric labels before the request is checked
    request_id = ""

    def __init__(self, message: str) -> None:
        self.message = message

    async def fail(self) -> Any:
        """Raise the request's INVALID_ARGUMENT (as a handler body)."""
        raise InvalidArgument(self.message)


def _parser(message: type[Message]) -> Callable[[bytes], Message | Undecodable]:
    """A request deserializer that turns a DecodeError into an ``Undecodable``."""
    def parse(data: bytes) -> Message | Undecodable:
        try:
            return message.FromString(data)
        except DecodeError as e:
            return Undecodable(str(e))

    return parse


def _serialize(response: Any) -> bytes:
    """Pre-encoded bytes pass through (an answer laid out in place); messages are
    serialised."""
    if isinstance(response, bytes):
        return response
    data: bytes = response.SerializeToString()
    return data


def _raise(e: BaseException) -> Callable[[], Awaitable[Any]]:
    async def body() -> Any:
        raise e
    return body

"""The lookup floors: the lookup no embedding service can skip and nothing else (no
validation, admission, batching, metrics or frame), over each transport the service has:
the most a service can reach there (docs/performance.md). The lookup is the service's own
(``EmbeddingTables.embed_into``) into a reply allocated at its final size, uninitialised,
as the service allocates it; gRPC replies are laid out as the ceiling's (or the rows go
into a registered shared-memory region), REST ones as the service's own captured answer
(the rows in binary after its JSON header, or printed as JSON numbers as the service prints
them) for the ids read from the request's JSON, checked byte for byte on first use (else
500: a floor answering other bytes would measure something else).

    python -m bench.servers.floor --port N --checkpoint MODELS/bench/1 \\
        [--http-port M --captured DIR]
"""

from __future__ import annotations

import ctypes
import functools
import mmap
import os
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import grpc
import numpy as np
import orjson
import torch
from aiohttp import web

from bench.servers.host import (
    Captured,
    HttpHandler,
    reference_args,
    reply_fields,
    reply_handler,
    respond,
    serve_forever,
)
from genproto.embedding.v1 import embedding_pb2 as pb

__all__ = ["Lookup", "main"]

_WIRE: dict[int, torch.dtype] = {pb.DTYPE_FLOAT32: torch.float32,
                                 pb.DTYPE_FLOAT16: torch.float16,
                                 pb.DTYPE_BFLOAT16: torch.bfloat16}
_REST_WIRE = {"FP32": pb.DTYPE_FLOAT32, "FP16": pb.DTYPE_FLOAT16, "BF16": pb.DTYPE_BFLOAT16}
_api = ctypes.pythonapi
_api.PyBytes_FromStringAndSize.restype = ctypes.py_object
_api.PyBytes_FromStringAndSize.argtypes = (ctypes.c_void_p, ctypes.c_ssize_t)
_api.PyBytes_AsString.restype = ctypes.c_void_p
_api.PyBytes_AsString.argtypes = (ctypes.py_object,)
_api.PyMemoryView_FromMemory.restype = ctypes.py_object
_api.PyMemoryView_FromMemory.argtypes = (ctypes.c_void_p, ctypes.c_ssize_t, ctypes.c_int)


class Lookup:
    """The checkpoint's tables and the service's lookup into a reply of any layout."""

    def __init__(self, checkpoint: Path) -> None:
        # The service's two pieces this floor cannot do without: the checkpoint reader and
        # the engine's tables (their one-pass lookup). Nothing else of it is imported.
        from service.engine.tables import EmbeddingTables
        from service.format.checkpoint import read_checkpoint

        torch.set_num_threads(1)  # the service's default --torch-threads
        ckpt = read_checkpoint(checkpoint)
        self.tables = EmbeddingTables(ckpt.token_table, ckpt.position_table,
                                      torch.device("cpu"))
        self.dim = self.tables.dim

    def into(self, rows: torch.Tensor, ids: Sequence[int], start: int) -> None:
        """``rows`` (T, C) = token rows of ``ids`` + position rows from ``start``."""
        index = np.fromiter(ids, np.int64, len(ids))  # (T,), as admission hands them on
        self.tables.embed_into([(index, [(start, len(ids))], rows)], pb.COMPOSE_TOKEN_PLUS_POSITION)

    def reply(self, prefix: bytes, ids: Sequence[int], start: int, dtype: torch.dtype,
              suffix: bytes) -> bytes:
        """A new ``prefix | rows | suffix``, the rows written in place."""
        nbytes = len(ids) * self.dim * dtype.itemsize
        data = _api.PyBytes_FromStringAndSize(None, len(prefix) + nbytes + len(suffix))
        at = _api.PyBytes_AsString(data)  # ours alone until returned: never shared
        ctypes.memmove(at, prefix, len(prefix))
        ctypes.memmove(at + len(prefix) + nbytes, suffix, len(suffix))
        view = _api.PyMemoryView_FromMemory(at + len(prefix), nbytes, 0x200)  # PyBUF_WRITE
        self.into(torch.frombuffer(view, dtype=dtype).view(len(ids), self.dim), ids, start)
        return data


class GrpcFloor:
    """``Embed``/``EmbedStream`` replies and shared-memory regions, for ``Lookup``."""

    def __init__(self, lookup: Lookup) -> None:
        self.lookup = lookup
        self._layouts: dict[tuple[int, int], tuple[bytes, bytes]] = {}
        self._regions: dict[str, tuple[mmap.mmap, int]] = {}

    def _layout(self, T: int, dtype: int) -> tuple[bytes, bytes]:
        """What comes before and after the rows in the ceiling's reply for (T, dtype)."""
        layout = self._layouts.get((T, dtype))
        if layout is None:
            nbytes = T * self.lookup.dim * _WIRE[dtype].itemsize
            whole = pb.EmbedResponse(embeddings=pb.Tensor(
                shape=[T, self.lookup.dim], dtype=dtype,  # type: ignore[arg-type]
                data=bytes(nbytes)))
            whole.MergeFrom(reply_fields(T))
            suffix = reply_fields(T).SerializeToString()  # the tensor (field 1) comes first
            head = whole.SerializeToString()[:-len(suffix) - nbytes]
            layout = self._layouts[(T, dtype)] = (head, suffix)
        return layout

    def reply(self, request: pb.EmbedRequest) -> bytes:
        ids, dtype = request.token_ids.ids, int(request.dtype)
        if request.output.region:
            return self._into_region(request, ids, dtype)
        head, suffix = self._layout(len(ids), dtype)
        return self.lookup.reply(head, ids, request.start_position, _WIRE[dtype], suffix)

    def _into_region(self, request: pb.EmbedRequest, ids: Sequence[int], dtype: int) -> bytes:
        mapping, base = self._regions[request.output.region]
        wire, T, C = _WIRE[dtype], len(ids), self.lookup.dim
        rows = torch.frombuffer(mapping, dtype=wire, count=T * C,
                                offset=base + request.output.offset).view(T, C)
        self.lookup.into(rows, ids, request.start_position)
        del rows  # no export of the mapping may outlive the call
        return pb.EmbedResponse(
            embeddings=pb.Tensor(shape=[T, C], dtype=dtype),  # type: ignore[arg-type]
            output=pb.SharedMemoryRange(region=request.output.region,
                                        offset=request.output.offset,
                                        byte_size=T * C * wire.itemsize)).SerializeToString()

    def register(self, request: pb.RegisterSharedMemoryRequest, context: Any
                 ) -> pb.RegisterSharedMemoryResponse:
        """Map the region's object (MAP_SHARED) from its offset."""
        r = request.region
        fd = os.open(f"/dev/shm/{r.key.lstrip('/')}", os.O_RDWR)
        try:
            self._regions[r.name] = (mmap.mmap(fd, r.offset + r.byte_size), r.offset)
        finally:
            os.close(fd)
        return pb.RegisterSharedMemoryResponse()

    def unregister(self, request: pb.UnregisterSharedMemoryRequest, context: Any
                   ) -> pb.UnregisterSharedMemoryResponse:
        """Unmap one region (every region for an empty name)."""
        for name in [request.name] if request.name else list(self._regions):
            self._regions.pop(name)[0].close()
        return pb.UnregisterSharedMemoryResponse()

    def handlers(self) -> list[grpc.GenericRpcHandler]:
        service = "embedding.v1.EmbeddingService"
        shm = grpc.method_handlers_generic_handler(service, {
            "RegisterSharedMemory": grpc.unary_unary_rpc_method_handler(
                self.register, request_deserializer=pb.RegisterSharedMemoryRequest.FromString,
                response_serializer=pb.RegisterSharedMemoryResponse.SerializeToString),
            "UnregisterSharedMemory": grpc.unary_unary_rpc_method_handler(
                self.unregister,
                request_deserializer=pb.UnregisterSharedMemoryRequest.FromString,
                response_serializer=pb.UnregisterSharedMemoryResponse.SerializeToString)})
        return [reply_handler(service, self.reply), shm]


def rest_handler(lookup: Lookup, captured: Captured) -> HttpHandler:
    """``POST /<cell>``: the rows of the ids the request's JSON carries, in the service's
    own response layout for that cell: binary after its JSON header, or printed as JSON
    numbers as the service prints them. Reading the ids from the body is work every REST
    server does (the gRPC floor's requests are parsed by grpc's deserializer)."""
    plans: dict[str, tuple[Callable[[list[int]], bytes], dict[str, str], int] | str] = {}

    def plan(path: str) -> tuple[Callable[[list[int]], bytes], dict[str, str], int] | str:
        cell = captured.get(path)
        dtype = _WIRE[_REST_WIRE[cell.datatype]]
        answer: Callable[[list[int]], bytes]
        if cell.headers["Content-Type"].startswith("application/json"):
            answer = _json_answer(lookup, cell.body, dtype)
        else:
            head = int(cell.headers["Inference-Header-Content-Length"])
            end = head + len(cell.ids) * lookup.dim * dtype.itemsize
            prefix, suffix = cell.body[:head], cell.body[end:]
            answer = functools.partial(_binary_answer, lookup, prefix, dtype, suffix)
        if answer(cell.ids) != cell.body:
            return f"floor: {path} differs from the service's response"
        return answer, cell.headers, len(cell.ids)

    async def handle(request: web.BaseRequest) -> web.StreamResponse:
        body = await request.read()
        p = plans.get(request.path) or plans.setdefault(request.path, plan(request.path))
        if isinstance(p, str):
            return web.Response(status=500, text=p)
        answer, headers, T = p
        ids = orjson.loads(body)["inputs"][0]["data"]  # (T,)
        if len(ids) != T:  # the captured header states T: another T is another cell
            return web.Response(status=400, text=f"floor: {request.path} serves T={T}")
        return await respond(request, answer(ids), headers)

    return handle


def _binary_answer(lookup: Lookup, prefix: bytes, dtype: torch.dtype, suffix: bytes,
                   ids: list[int]) -> bytes:
    """The service's binary answer for ``ids``: its captured JSON header (and any bytes
    after the rows), the rows looked up anew."""
    return lookup.reply(prefix, ids, 0, dtype, suffix)


def _json_answer(lookup: Lookup, body: bytes,
                 dtype: torch.dtype) -> Callable[[list[int]], bytes]:
    """The service's JSON answer for a request's ids, rows looked up anew each call: its
    header as captured, the rows widened to float64 and printed by orjson, as the service
    does (``engine/rest_reply.py``): the floor of any exact JSON answer printed in Python."""
    header = orjson.loads(body)
    (output,) = [o for o in header["outputs"] if o["name"] == "embeddings"]

    def answer(ids: list[int]) -> bytes:
        rows = torch.empty(len(ids), lookup.dim, dtype=dtype)  # (T, C)
        lookup.into(rows, ids, 0)
        output["data"] = rows.reshape(-1).numpy().astype(np.float64)  # (T*C,)
        return orjson.dumps(header, option=orjson.OPT_SERIALIZE_NUMPY)

    return answer


def main(argv: Sequence[str] | None = None) -> None:
    args = reference_args("python -m bench.servers.floor", argv)
    lookup = Lookup(args.checkpoint)
    rest = rest_handler(lookup, Captured(args.captured)) if args.captured else None
    serve_forever("floor", args.port, GrpcFloor(lookup).handlers(), args.http_port, rest)


if __name__ == "__main__":
    main()

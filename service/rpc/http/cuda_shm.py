"""The REST routes of Triton's CUDA shared-memory extension, on the engine's CUDA registry.

    POST /v2/cudasharedmemory/region/{name}/register
         {"raw_handle": {"b64": "<base64 of the 64 handle bytes>"}, "device_id": 0,
          "byte_size": 4096}
    GET  /v2/cudasharedmemory/status   /v2/cudasharedmemory/region/{name}/status
         [{"name": ..., "device_id": ..., "byte_size": ...}]
    POST /v2/cudasharedmemory/unregister   /v2/cudasharedmemory/region/{name}/unregister

As Triton's HTTP server defines them (tritonclient.http speaks them unchanged): register
and unregister answer 200 with an empty body. The regions are the gRPC fronts' (one
registry): a region registered here is named in a gRPC ModelInfer or Embed.
"""

from __future__ import annotations

import base64
import binascii
import json
from typing import Any

from aiohttp import web

from service.engine import CudaSharedMemoryRegistry, Engine
from service.errors import InvalidArgument
from service.rpc.frame import Call
from service.rpc.http.wire import json_response, read_body

__all__ = ["CUDA_SHM_ROUTES", "CudaShmRoutes", "rest_peer"]

_REGION = r"/v2/cudasharedmemory(?:/region/(?P<region>[^/]+))?"
# (method, pattern, rpc label, CudaShmRoutes method name)
CUDA_SHM_ROUTES = [
    ("POST", r"/v2/cudasharedmemory/region/(?P<region>[^/]+)/register",
     "CudaSharedMemoryRegister", "register"),
    ("GET", _REGION + "/status", "CudaSharedMemoryStatus", "status"),
    ("POST", _REGION + "/unregister", "CudaSharedMemoryUnregister", "unregister"),
]


def rest_peer(request: web.BaseRequest) -> str:
    """The connection's peer in gRPC's form (``ipv4:127.0.0.1:5000``, ``ipv6:[::1]:5``,
    ``unix:...``), which the shared-memory registries' local-peer rule reads."""
    peer = request.transport.get_extra_info("peername") if request.transport else None
    if isinstance(peer, tuple) and len(peer) >= 2:
        host, port = str(peer[0]), peer[1]
        return f"ipv6:[{host}]:{port}" if ":" in host else f"ipv4:{host}:{port}"
    return f"unix:{peer}" if isinstance(peer, str) else ""


class CudaShmRoutes:
    """The three endpoints' bodies (the REST front runs each inside the frame)."""

    def __init__(self, engine: Engine, max_body: int) -> None:
        self.engine = engine
        self.max_body = max_body

    @property
    def registry(self) -> CudaSharedMemoryRegistry:
        """The engine's CUDA registry (the gRPC fronts' too)."""
        return self.engine.cuda_shm

    async def register(self, request: web.BaseRequest, params: dict[str, str],
                       call: Call) -> web.StreamResponse:
        """Open the handle in the body as region ``{name}``."""
        body = await read_body(request, self.max_body, call.deadline)
        raw, device_id, byte_size = _parse_register(body)
        self.registry.register(_caller(request, call), params["region"], raw, device_id,
                               byte_size)
        return web.Response(status=200)

    async def status(self, request: web.BaseRequest, params: dict[str, str],
                     call: Call) -> web.StreamResponse:
        """The caller's CUDA regions (or the one named), as Triton lists them."""
        return json_response([{"name": r.name, "device_id": r.device_id,
                               "byte_size": r.byte_size}
                              for r in self.registry.regions(_caller(request, call),
                                                             params.get("region", ""))])

    async def unregister(self, request: web.BaseRequest, params: dict[str, str],
                         call: Call) -> web.StreamResponse:
        """Forget the region named (none named: every one of the caller's own)."""
        self.registry.unregister(_caller(request, call), params.get("region", ""))
        return web.Response(status=200)


def _caller(request: web.BaseRequest, call: Call) -> Call:
    """``call`` with its peer: the registries serve local peers only (read here, on these
    routes alone, so no other REST request pays for it)."""
    return Call(call.rpc, call.model, call.request_id, call.authorization, call.deadline,
                call.start_ns, call.identity, rest_peer(request))


def _parse_register(body: bytes) -> tuple[bytes, int, int]:
    """(handle bytes, device_id, byte_size) of a register body; INVALID_ARGUMENT naming the
    field otherwise."""
    try:
        value: Any = json.loads(body)
    except (ValueError, UnicodeDecodeError, RecursionError):
        raise InvalidArgument("register body must be a JSON object with raw_handle, "
                              "device_id and byte_size") from None
    if not isinstance(value, dict):
        raise InvalidArgument("register body must be a JSON object with raw_handle, "
                              "device_id and byte_size")
    handle = value.get("raw_handle")
    b64 = handle.get("b64") if isinstance(handle, dict) else None
    try:
        if not isinstance(b64, str):
            raise ValueError
        raw = base64.b64decode(b64, validate=True)
    except (ValueError, binascii.Error):
        raise InvalidArgument('raw_handle must be {"b64": "<base64 of the cudaIpcMemHandle_t>"}'
                              ) from None
    numbers = []
    for field in ("device_id", "byte_size"):
        n = value.get(field)
        if not isinstance(n, int) or isinstance(n, bool):
            raise InvalidArgument(f"{field} must be an integer, got {json.dumps(n)[:32]}")
        numbers.append(n)
    return raw, numbers[0], numbers[1]

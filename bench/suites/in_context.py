"""A whole REST request's cost in context, in-process: the service's front against the
HTTP lookup floor's handler, with no sockets and no load generator.

Each request is the serving grid's T=16 binary infer, fed as raw HTTP bytes to a new
connection's aiohttp protocol (what the server runs on a socket's bytes), and its answer
written to a transport that only counts: every stage of the request runs, one after
another, on the event loop, as a server runs them. The floor's handler
(``bench.servers.floor``) answers the service's own captured bytes for those ids. A
stage's cost here is two to three times its cost in a tight loop of that stage alone (its
code and data out of cache): what removing it would save a server. Minimum over rounds.
"""

from __future__ import annotations

import asyncio
import time
from pathlib import Path
from typing import Any

from aiohttp import web

from bench.harness.checkpoint import MODEL_NAME
from bench.servers.floor import Lookup, rest_handler
from bench.servers.host import CapturedCell
from bench.suites.serving import rest_body

__all__ = ["measure"]


class _Counting(asyncio.Transport):
    """A transport that takes every write and keeps only how many there were."""

    def __init__(self) -> None:
        super().__init__()
        self.writes = 0
        self.last = b""

    def write(self, data: Any) -> None:
        self.writes += 1
        self.last = bytes(data)

    def writelines(self, list_of_data: Any) -> None:
        self.write(b"".join(list_of_data))

    def is_closing(self) -> bool:
        return False

    def close(self) -> None: ...

    def get_extra_info(self, name: str, default: Any = None) -> Any:
        return {"peername": ("127.0.0.1", 1), "sockname": ("127.0.0.1", 2)}.get(name, default)

    def get_write_buffer_size(self) -> int:
        return 0

    def can_write_eof(self) -> bool:
        return True

    def pause_reading(self) -> None: ...

    def resume_reading(self) -> None: ...


async def _per_request(server: web.Server, raw: bytes, n: int,
                       rounds: int) -> tuple[float, bytes]:
    """µs per request on one kept-alive connection (min over ``rounds`` of ``n``), and the
    last answer's body."""
    protocol = server()
    transport = _Counting()
    protocol.connection_made(transport)

    async def one() -> None:
        before = transport.writes
        protocol.data_received(raw)
        while transport.writes == before:  # the answer is written on a later loop turn
            await asyncio.sleep(0)

    for _ in range(n):
        await one()
    best = float("inf")
    for _ in range(rounds):
        t0 = time.perf_counter()
        for _ in range(n):
            await one()
        best = min(best, (time.perf_counter() - t0) / n)
    protocol.connection_lost(None)
    return best * 1e6, transport.last.partition(b"\r\n\r\n")[2]


def _request(path: str, body: bytes) -> bytes:
    return (f"POST {path} HTTP/1.1\r\nHost: bench\r\nContent-Type: application/json\r\n"
            f"Content-Length: {len(body)}\r\n\r\n").encode() + body


async def _measure(front: Any, checkpoint: Path, ids: list[int], n: int,
                   rounds: int) -> dict[str, float]:
    body = rest_body(ids, "float32", True)
    service = front._server  # the front's own aiohttp server: a new connection per call
    raw = _request(f"/v2/models/{MODEL_NAME}/infer", body)
    probe = _Counting()
    protocol = service()
    protocol.connection_made(probe)
    protocol.data_received(raw)
    while not probe.writes:
        await asyncio.sleep(0)
    head, _, answer = probe.last.partition(b"\r\n\r\n")
    protocol.connection_lost(None)
    headers = dict(line.split(": ", 1) for line in head.decode().split("\r\n")[1:])
    cell = CapturedCell(answer, {k: headers[k] for k in ("Content-Type",
                                                         "Inference-Header-Content-Length")},
                        ids, "FP32")

    class _One:  # the floor's captured cells: this one
        def get(self, path: str) -> CapturedCell:
            return cell

    floor = web.Server(rest_handler(Lookup(checkpoint), _One()), access_log=None)  # type: ignore[arg-type]
    service_us, served = await _per_request(service, raw, n, rounds)
    floor_us, floored = await _per_request(floor, _request("/rest", body), n, rounds)
    if not served == floored == answer:  # both must have answered the same bytes throughout
        raise RuntimeError("in_context: the service and the floor answered different bytes")
    return {"service_us": service_us, "floor_us": floor_us}


def measure(handle: Any, checkpoint: Path, ids: list[int], n: int = 3000,
            rounds: int = 5) -> dict[str, float]:
    """µs per REST T=len(ids) binary request, in-process: the service (``handle``: a
    ``service.local.ServerHandle``) and the lookup floor on the same checkpoint."""
    front = handle.server.http
    done = asyncio.run_coroutine_threadsafe(_measure(front, checkpoint, ids, n, rounds),
                                            handle.loop)
    return done.result(timeout=600)

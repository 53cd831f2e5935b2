"""The load generator against a real HTTP server: what it counts and what it retries."""

from __future__ import annotations

import asyncio

from aiohttp import web

from bench.harness.load import http_load, measure


def test_a_429_is_retried_as_a_client_would_and_counted() -> None:
    """The first three answers are "retry later": each is tried again, and only the 200s
    count as replies; anything else still fails the cell."""
    seen: list[int] = []

    async def handle(request: web.BaseRequest) -> web.StreamResponse:
        await request.read()
        seen.append(len(seen))
        if len(seen) <= 3:
            return web.Response(status=429, text='{"error": "retry later"}')
        if request.path == "/broken":
            return web.Response(status=500, text="no")
        return web.Response(body=b"x" * 64)

    async def scenario() -> tuple[int, int, str]:
        server = await asyncio.get_running_loop().create_server(
            web.Server(handle, access_log=None), "127.0.0.1", 0)
        port = server.sockets[0].getsockname()[1]
        try:
            m = await measure(lambda w: http_load(w, f"http://127.0.0.1:{port}/ok", b"{}", 1,
                                                  64), 0.0, 0.3)
            try:
                await measure(lambda w: http_load(
                    w, f"http://127.0.0.1:{port}/broken", b"{}", 1, 64), 0.0, 0.1)
                error = ""
            except* RuntimeError as group:
                e: BaseException = group
                while isinstance(e, BaseExceptionGroup):  # a task group's, in a task group's
                    e = e.exceptions[0]
                error = str(e)
        finally:
            server.close()
        return m.refused, m.requests, error

    refused, requests, error = asyncio.run(scenario())
    assert refused == 3
    assert requests > 0
    assert error.endswith("/broken: HTTP 500, 2 bytes: b'no'")

"""Sending a REST answer: after its headers, never joined to them, inside the request's
in-flight slot; and closing a connection whose body was refused without reading it.

``front.py`` holds the slot and the answer's bytes of ``--max-unsent-bytes``
around ``send``: they are given back once it returns, i.e. once the transport has taken
the last view of the body and drained below its high-water mark (a client that does not
read keeps ``send`` waiting: that is what makes an unread answer count).
"""

from __future__ import annotations

import asyncio
from typing import Any

from aiohttp import web

__all__ = ["LINGER_SECONDS", "BufferAnswer", "linger", "send"]

LINGER_SECONDS = 0.5  # a refused connection, half-closed and never read, before its close


class BufferAnswer(web.StreamResponse):
    """A response whose body is one buffer: the headers are written with its first
    ``HEAD`` bytes, then the rest of the buffer itself in ``SLICE``-byte views, each
    handed to the transport once it has drained below its high-water mark. aiohttp's
    ``web.Response`` joins headers and the whole body into a new buffer first (asyncio's
    ``writelines`` is not used before Python 3.12.9), and the transport copies whatever
    the socket does not take at once: here only the first ``HEAD`` bytes are joined, and
    what the transport copies is at most one slice.

    ``held`` bytes of the server's unsent-answer budget are given back by ``release``
    once the last slice has left (or the client is gone)."""

    HEAD = 1 << 16
    SLICE = 1 << 20
    # Headers wait for the first write and leave with it (one send, not two: a separate
    # send of the headers was a syscall per answer). aiohttp's web.Response does the same;
    # a StreamResponse sends them at prepare() unless told so.
    _send_headers_immediately = False

    def __init__(self, body: bytes, content_type: str, headers: dict[str, str] | None = None,
                 held: int = 0, budgets: Any = None) -> None:
        # The type and length as plain headers: aiohttp's setters parse what they set.
        super().__init__(headers={**(headers or {}), "Content-Type": content_type,
                                  "Content-Length": str(len(body))})
        self._payload = body
        self._held = held
        self._budgets = budgets

    async def send(self, request: web.BaseRequest) -> None:
        """Headers, then the buffer; returns once the transport holds at most its
        high-water mark of it (a client that does not read keeps this waiting)."""
        await self.prepare(request)
        body, self._payload = self._payload, b""
        if len(body) <= self.HEAD:  # headers and body joined: one write, and the end
            await self.write_eof(body)
            return
        view = memoryview(body)
        # The headers leave with the first HEAD bytes (aiohttp joins those two: a copy of
        # at most HEAD bytes, and one packet, not a lone header packet), then the rest.
        await self.write(view[:self.HEAD])
        for at in range(self.HEAD, len(view), self.SLICE):
            await self.write(view[at:at + self.SLICE])
        await self.write_eof()

    def release(self) -> None:
        """Give the held bytes back (once)."""
        if self._held and self._budgets is not None:
            self._budgets.give_back(self._held)
        self._held = 0


async def send(request: web.BaseRequest, response: web.StreamResponse) -> None:
    """Write ``response`` whole, now: the caller holds its in-flight slot (and bytes)
    until this returns. A client that went away is not an error: nobody to answer."""
    try:
        if isinstance(response, BufferAnswer):
            await response.send(request)
        else:
            await response.prepare(request)
            await response.write_eof()
    except ConnectionError:
        pass


def _half_close(request: web.BaseRequest) -> bool:
    """Stop reading and send FIN after the answer; False when the transport cannot."""
    transport = request.transport
    if transport is None or transport.is_closing():
        return False
    transport.pause_reading()
    if not transport.can_write_eof():  # TLS: no half-close; the close follows at once
        return False
    transport.write_eof()
    return True


async def linger(request: web.BaseRequest) -> None:
    """Keep a refused connection open ``LINGER_SECONDS`` without reading from it: its
    answer and FIN reach a client that is still sending before the close resets it
    (closing over unread bytes sends RST, which discards what the client had not read)."""
    if _half_close(request):
        await asyncio.sleep(LINGER_SECONDS)

"""Pacing streams by the bytes of answers their client has not taken yet.

A bidi stream pipelines: up to ``STREAM_WINDOW`` requests are admitted and computed while
earlier answers are still being sent. A client that sends but never reads would otherwise
make the server hold every finished answer (64 of up to MBs each, per stream). Here each
answer reserves its bytes before its output is allocated and gives them back once gRPC
has taken it; a reservation waits while the stream's own budget
(``max_stream_buffer_bytes``) or the budget shared by every stream (``max_unsent_bytes``)
is spent. Waiting answers hold no output, and the stream's window fills, so the stream
stops reading requests: HTTP/2 flow control then pushes back on the client, not on the
server's memory.

Reservations are granted in request order, so a later answer never holds budget an
earlier one needs (answers are sent in order); a stream holding nothing may always take
one answer, however large (it fits the message-size cap), so no stream waits on another
stream's slow reader for ever.

A REST answer is held the same way, as a stream of one (``StreamBudgets.fits`` and
``take``): an HTTP/1.1 connection sends one answer at a time, so it never holds more than
the one answer a stream may always take, and its bytes count in the total every stream
shares until its last byte is handed to the socket. Past the total it waits up to a
second for room, without its in-flight slot (``http_slots``), then is refused (429 naming
``max_unsent_bytes``): a REST request has no window to stop reading, so it cannot wait as
long as a stream's next answer does.
"""

from __future__ import annotations

import asyncio

from service.errors import ResourceExhausted

__all__ = ["StreamBudgets", "StreamPacer"]


class StreamBudgets:
    """The budgets every stream of one server shares: per stream, and over all streams."""

    def __init__(self, per_stream: int, total: int = 0) -> None:
        self.per_stream = per_stream
        self.total = total  # 0 = no cap over all streams
        self.held = 0  # bytes reserved by every stream together
        self._changed: asyncio.Event | None = None  # created on the serving loop

    async def changed(self) -> None:
        """Return once bytes are given back or a turn passes (by any stream)."""
        if self._changed is None:
            self._changed = asyncio.Event()
        await self._changed.wait()

    def notify(self) -> None:
        """Wake every waiting reservation to look again (event-loop thread only)."""
        if self._changed is not None:
            self._changed.set()
            self._changed = None  # the next waiter gets a fresh event

    def fits(self, nbytes: int) -> bool:
        """Whether a REST answer of ``nbytes`` may be held now: within ``total``, or
        alone (any answer that fits the message-size cap goes through, as on a stream)."""
        return not self.total or not self.held or self.held + nbytes <= self.total

    def take(self, nbytes: int) -> int:
        """Hold a REST answer's ``nbytes`` (seen to fit) until ``give_back``."""
        self.held += nbytes
        return nbytes

    def refusal(self, nbytes: int) -> ResourceExhausted:
        """The error for a REST answer that does not fit."""
        return ResourceExhausted(
            f"answers not yet taken by their clients hold {self.held} bytes; this "
            f"one's {nbytes} would pass max_unsent_bytes={self.total}; retry later")

    def give_back(self, nbytes: int) -> None:
        """A held REST answer was sent (or never will be): its bytes are free again."""
        if nbytes:
            self.held -= nbytes
            self.notify()

    def pacer(self) -> StreamPacer:
        """The pacer of one new stream."""
        return StreamPacer(self)


class StreamPacer:
    """One stream's reservations: ``reserve(seq, n)`` in request order, ``release(seq)``
    once gRPC has taken answer ``seq``, ``skip(seq)`` for a request that never got as far
    as reserving, and ``close()`` when the stream ends."""

    def __init__(self, budgets: StreamBudgets) -> None:
        self._budgets = budgets
        self.held = 0  # this stream's reserved bytes
        self._turn = 0  # the next sequence number allowed to reserve
        self._skipped: set[int] = set()
        self._reserved: dict[int, int] = {}  # seq -> bytes

    def _fits(self, nbytes: int) -> bool:
        if self.held == 0:
            return True  # one answer always goes through: the stream can make progress
        b = self._budgets
        return (self.held + nbytes <= b.per_stream
                and (b.total == 0 or b.held + nbytes <= b.total))

    def _advance(self) -> None:
        self._turn += 1
        while self._turn in self._skipped:
            self._skipped.discard(self._turn)
            self._turn += 1

    async def reserve(self, seq: int, nbytes: int) -> None:
        """Wait for answer ``seq``'s turn and room for its ``nbytes``, then hold them."""
        while not (self._turn == seq and self._fits(nbytes)):
            await self._budgets.changed()
        self.held += nbytes
        self._budgets.held += nbytes
        self._reserved[seq] = nbytes
        self._advance()
        self._budgets.notify()  # the next answer of this stream may reserve now

    def skip(self, seq: int) -> None:
        """Answer ``seq`` will not reserve (refused, cancelled): let the next one through."""
        if seq in self._reserved or seq < self._turn:
            return
        if seq == self._turn:
            self._advance()
            self._budgets.notify()
        else:
            self._skipped.add(seq)

    def release(self, seq: int) -> None:
        """gRPC has taken answer ``seq``: give its bytes back."""
        nbytes = self._reserved.pop(seq, 0)
        if nbytes:
            self.held -= nbytes
            self._budgets.held -= nbytes
            self._budgets.notify()

    def close(self) -> None:
        """The stream ended: give back everything it still holds."""
        for seq in list(self._reserved):
            self.release(seq)

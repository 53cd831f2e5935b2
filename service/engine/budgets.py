"""Budgets of answers not yet taken by their clients: the gRPC streams' and REST's.

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
second for room, without its in-flight slot (``RestSlots``), then is refused (429 naming
``max_unsent_bytes``): a REST request has no window to stop reading, so it cannot wait as
long as a stream's next answer does.

The REST in-flight cap: a REST request holds one of ``--max-concurrent-rpcs`` slots from
its admission until the last byte of its answer has left, so an answer its client never
reads keeps its slot (and its bytes of ``--max-unsent-bytes``). A request whose answer does
not fit the budget waits up to a second for room, and it waits without its slot: a slot
held while waiting would let never-reading clients fill the cap with their own waiters,
and an ordinary client beside them would be refused for that second although nothing of
its own was waiting. Waiters are bounded too (no more than the cap: past it a request that
does not fit is refused at once), each holds only its parsed request (within the message
limit), and one that gets room takes a slot back within the same second, or is refused.

A request names its place in these budgets with a ``Hold`` (``StreamTurn``, ``RestHold``):
the engine takes the answer's bytes through it once the request is admitted (its size is
known) and before its output is allocated; the front gives them back once sent.
"""

from __future__ import annotations

import asyncio
from typing import Protocol

from service.errors import ResourceExhausted

__all__ = ["Hold", "RestHold", "RestSlots", "Slot", "StreamBudgets", "StreamPacer",
           "StreamTurn"]

WAIT_SECONDS = 1.0  # for room in the budget: ordinary answers leave within milliseconds


class Hold(Protocol):
    """A request's place in an answer budget: ``take`` waits for room for its bytes."""

    async def take(self, nbytes: int) -> None:
        """Hold ``nbytes`` of the budget (waiting, or refusing, while it is spent)."""



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


class RestSlots:
    """The in-flight count of one REST front, its cap, and the requests waiting for room."""

    def __init__(self, max_inflight: int, budgets: StreamBudgets) -> None:
        self.max_inflight = max_inflight  # 0 = no cap
        self.budgets = budgets  # the unsent-answer budget the gRPC streams share too
        self.inflight = 0  # requests holding a slot (their answer not yet sent)
        self.waiting = 0  # requests waiting, without a slot, for room in the budget
        self.wait_s = WAIT_SECONDS  # how long one waits before its 429

    def _free(self) -> bool:
        return not self.max_inflight or self.inflight < self.max_inflight

    def full_message(self) -> str:
        """The 429 for a request past the cap."""
        return (f"{self.inflight} HTTP requests in flight: "
                f"max_concurrent_rpcs={self.max_inflight}; retry later")

    def take(self) -> Slot | None:
        """A slot for a new request, or None when the cap is reached."""
        if not self._free():
            return None
        self.inflight += 1
        return Slot(self)

    async def hold(self, slot: Slot, nbytes: int) -> int:
        """Hold an answer's ``nbytes`` of the budget until it is given back. When they do
        not fit, wait up to ``wait_s`` without ``slot`` for room and a slot, then refuse
        (RESOURCE_EXHAUSTED naming the limit that is still in the way)."""
        budgets = self.budgets
        if budgets.fits(nbytes):
            return budgets.take(nbytes)
        if self.max_inflight and self.waiting >= self.max_inflight:
            raise budgets.refusal(nbytes)  # as many wait as may be in flight; no more
        slot.release()
        self.waiting += 1
        loop = asyncio.get_running_loop()
        until = loop.time() + self.wait_s
        try:
            while not (budgets.fits(nbytes) and self._free()):
                left = until - loop.time()
                if left <= 0:
                    if not budgets.fits(nbytes):
                        raise budgets.refusal(nbytes)
                    raise ResourceExhausted(self.full_message())
                try:
                    await asyncio.wait_for(budgets.changed(), left)
                except TimeoutError:
                    continue
        finally:
            self.waiting -= 1
        slot.retake()
        return budgets.take(nbytes)


class Slot:
    """One request's slot: given back once (when its answer has left, or while it waits)."""

    def __init__(self, slots: RestSlots) -> None:
        self._slots = slots
        self.held = True

    def release(self) -> None:
        """Give the slot back; a request waiting for one may look again."""
        if self.held:
            self.held = False
            self._slots.inflight -= 1
            if self._slots.waiting:
                self._slots.budgets.notify()

    def retake(self) -> None:
        """Take the slot again (the caller has seen one free)."""
        if not self.held:
            self.held = True
            self._slots.inflight += 1


class StreamTurn:
    """The ``Hold`` of answer ``seq`` of one stream: its bytes are reserved in request
    order (``StreamPacer.reserve``); the stream releases or skips it."""

    __slots__ = ("_pacer", "seq")

    def __init__(self, pacer: StreamPacer, seq: int) -> None:
        self._pacer = pacer
        self.seq = seq

    async def take(self, nbytes: int) -> None:
        """Wait for this answer's turn and room for its ``nbytes``."""
        await self._pacer.reserve(self.seq, nbytes)


class RestHold:
    """The ``Hold`` of one REST answer: its bytes in the budget every stream shares,
    waited for without the request's in-flight ``slot`` (``RestSlots.hold``); given back
    by the front once the answer has left (or never will)."""

    __slots__ = ("_slot", "_slots", "held")

    def __init__(self, slots: RestSlots, slot: Slot) -> None:
        self._slots = slots
        self._slot = slot
        self.held = 0  # bytes of the budget this answer holds

    async def take(self, nbytes: int) -> None:
        """Hold ``nbytes``, waiting up to a second for room (then RESOURCE_EXHAUSTED)."""
        self.held = await self._slots.hold(self._slot, nbytes)

    def settle(self, nbytes: int) -> None:
        """The answer is built and is ``nbytes`` long: what was held past that (the size
        was bounded from above before it was laid out: JSON numbers' widths) is free now,
        so the budget counts the bytes waiting to be sent, not their bound."""
        extra = self.held - nbytes
        if extra > 0:
            self.held = nbytes
            self._slots.budgets.give_back(extra)

    def give_back(self) -> None:
        """The answer will not be sent by its holder: free its bytes now (once)."""
        held, self.held = self.held, 0
        self._slots.budgets.give_back(held)

"""The REST front's in-flight cap, and requests waiting for room in the unsent-answer budget.

A REST request holds one of ``--max-concurrent-rpcs`` slots from its admission until the
last byte of its answer has left, so an answer its client never reads keeps its slot (and
its bytes of ``--max-unsent-bytes``). A request whose answer does not fit the budget
waits up to a second for room, and it waits without its slot: a slot held while waiting
would let never-reading clients fill the cap with their own waiters, and an ordinary
client beside them would be refused for that second although nothing of its own was
waiting. Waiters are bounded too (no more than the cap: past it a request that does not
fit is refused at once), each holds only its parsed request (within the message limit),
and one that gets room takes a slot back within the same second, or is refused.
"""

from __future__ import annotations

import asyncio

from service.errors import ResourceExhausted
from service.rpc.pacing import StreamBudgets

__all__ = ["RestSlots", "Slot"]

WAIT_SECONDS = 1.0  # for room in the budget: ordinary answers leave within milliseconds


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

"""The measurement window every load generator counts in: replies completed between two
instants, each with its latency (the warm-up before the window does not count), and the
one percentile the benchmarks report latencies with."""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

__all__ = ["Measurement", "Window", "percentile"]


def percentile(values: Sequence[float], q: float) -> float:
    """Nearest-rank percentile of unsorted ``values`` (nan when empty)."""
    if not values:
        return float("nan")
    s = sorted(values)
    return s[min(len(s) - 1, max(0, round(q * (len(s) - 1))))]


@dataclass(frozen=True)
class Measurement:
    """Replies completed in a window of ``seconds``, with each one's latency."""

    requests: int
    seconds: float
    latencies_ns: tuple[int, ...]



class Window:
    """Counts completions between ``start`` and ``end`` (perf_counter_ns)."""

    def __init__(self, start: int, end: int, shape: tuple[int, int]) -> None:
        self.start, self.end, self.shape = start, end, shape
        self.latencies: list[int] = []

    def done(self, sent: int, array: np.ndarray) -> None:
        """A reply decoded to ``array`` for a request sent at ``sent``: checked, counted."""
        now = time.perf_counter_ns()
        if array.shape != self.shape:
            raise AssertionError(f"reply shape {array.shape}, expected {self.shape}")
        if self.start <= now < self.end:
            self.latencies.append(now - sent)

    def result(self) -> Measurement:
        """The replies counted in the window."""
        return Measurement(len(self.latencies), (self.end - self.start) / 1e9,
                           tuple(self.latencies))

"""The median time of a piece of device work: CUDA events on a GPU (what the device spent,
not what the host waited), wall time on a CPU."""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable

import torch

__all__ = ["median_seconds"]


def median_seconds(fn: Callable[[], object], device: torch.device, reps: int) -> float:
    """Median seconds of one ``fn()`` over ``reps`` runs, after two warm-ups; on a CUDA
    ``device``, timed by events on the current stream."""
    for _ in range(2):
        fn()
    times = []
    for _ in range(reps):
        if device.type == "cuda":
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            fn()
            end.record()
            end.synchronize()
            times.append(start.elapsed_time(end) / 1e3)
        else:
            t0 = time.perf_counter()
            fn()
            times.append(time.perf_counter() - t0)
    return statistics.median(times)

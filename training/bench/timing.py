"""Step timing for the training benchmarks: wall and process-CPU seconds per step, and the
machine's peak fp32 matmul rate (the denominator of MFU)."""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

__all__ = ["Timing", "peak_matmul_flops", "sync", "timed"]


def sync(device: torch.device) -> None:
    """Wait for the device's queued work (CUDA kernels are asynchronous: time them, not
    their launch); a no-op on CPU."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)


@dataclass(frozen=True)
class Timing:
    """Per-step wall and process-CPU seconds.

    At one CPU thread, CPU time is what the step cost whatever else the machine is doing;
    wall time is what a user waits, and swells when other processes take the cores.
    """

    wall: list[float]
    cpu: list[float]

    @property
    def wall_median(self) -> float:
        """Median wall seconds per step."""
        return statistics.median(self.wall)

    @property
    def cpu_median(self) -> float:
        """Median process-CPU seconds per step."""
        return statistics.median(self.cpu)

    def to_json(self) -> dict[str, Any]:
        """Milliseconds, medians first."""
        return {"wall_ms_median": 1e3 * self.wall_median, "cpu_ms_median": 1e3 * self.cpu_median,
                "wall_ms": [1e3 * t for t in self.wall], "cpu_ms": [1e3 * t for t in self.cpu]}


def timed(step: Callable[[int], None], steps: int, warmup: int, device: torch.device) -> Timing:
    """Run ``step(i)`` ``warmup + steps`` times; the timing of the last ``steps``."""
    wall, cpu = [], []
    for i in range(warmup + steps):
        sync(device)
        t0, c0 = time.perf_counter(), time.process_time()
        step(i)
        sync(device)
        if i >= warmup:
            wall.append(time.perf_counter() - t0)
            cpu.append(time.process_time() - c0)
    return Timing(wall, cpu)


def peak_matmul_flops(device: torch.device, n: int = 2048, reps: int = 5) -> tuple[float, float]:
    """The best fp32 FLOP/s of an (n x n) @ (n x n) matmul, per wall and per CPU second."""
    if device.type == "cuda":
        n = 8192  # a 2048 matmul is too short to fill a datacentre GPU
    a, b = torch.randn(n, n, device=device), torch.randn(n, n, device=device)
    out = torch.empty(n, n, device=device)

    def step(_: int) -> None:
        torch.mm(a, b, out=out)

    t = timed(step, reps, 1, device)  # the warmup faults in the output pages
    return 2 * n**3 / min(t.wall), 2 * n**3 / min(t.cpu)

"""training/bench's clocks: per-step timing after a warm-up, and the measured peak."""

from __future__ import annotations

import torch

from training.bench.timing import Timing, peak_matmul_flops, timed


def test_timed_drops_the_warmup_steps() -> None:
    seen: list[int] = []
    t = timed(seen.append, steps=3, warmup=2, device=torch.device("cpu"))
    assert seen == [0, 1, 2, 3, 4]
    assert len(t.wall) == len(t.cpu) == 3
    assert t.to_json()["wall_ms_median"] == 1e3 * t.wall_median


def test_peak_matmul_flops_is_positive() -> None:
    wall, cpu = peak_matmul_flops(torch.device("cpu"), n=64, reps=2)
    assert wall > 0
    assert cpu > 0
    assert Timing([1.0, 3.0, 2.0], [1.0, 1.0, 1.0]).wall_median == 2.0

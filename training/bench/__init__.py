"""The training benchmarks, beside the job they measure (they import only training/ and the
shared format); the serving benchmarks are bench/.

    python -m training.bench [--preset default|anchor|levers]   tokens/s and MFU (make bench-train)
    python -m training.bench.data [--size-mb 300]               data preparation at scale

``throughput``: the default run's step and a token table's dense vs sparse step; ``anchor``:
nanoGPT's small config side by side, and each speed lever on its own; ``timing``: step
clocks and the measured peak matmul rate; ``data``: tokens/s and peak RSS of training/data.py.
MFU everywhere uses ``training.model.flops_per_token``.
"""

from __future__ import annotations

__all__: list[str] = []

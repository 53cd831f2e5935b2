"""The training benchmarks, beside the job they measure (they import only training/ and the
shared format); the serving benchmarks are bench/.

    python -m training.bench [--preset default|anchor|levers|nanogpt]   tokens/s, MFU, vs nanoGPT
    python -m training.bench.data [--size-mb 300]               data preparation at scale

``throughput``: the default run's step and a token table's dense vs sparse step; ``anchor``:
nanoGPT's small config side by side, and each speed lever on its own; ``timing``: step
clocks and the measured peak matmul rate; ``data``: tokens/s and peak RSS of training/data.py;
``nanogpt``: per-step time beside nanoGPT's own train.py; ``curves``: loss curves of runs in
one plot.
MFU everywhere uses ``training.model.flops_per_token``.
"""

from __future__ import annotations

__all__: list[str] = []

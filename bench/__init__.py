"""Serving benchmarks: ``python -m bench`` (``make bench``; ``--quick``: ``make bench-smoke``)
and the soak (``python -m bench.soak``, ``make soak``); docs/performance.md.

- ``harness/``: what every suite uses: the server launcher, checkpoints, load generation,
  configuration, target verdicts and the plot.
- ``servers/``: the reference servers: transport ceilings, lookup floors, the naive baseline.
- ``suites/``: what ``make bench`` runs, each ending in target lines (serving, scaling,
  overload, memory, profile); and the GPU checks ``scripts/gpu.sh`` runs (gpu_gather,
  cuda_shm).
- ``soak/``: minutes of mixed traffic with reloads, a killed worker, slow readers and
  truncated shared memory, every answer checked bit for bit.

Results go to ``bench/results/`` (git-ignored).
"""

from __future__ import annotations

__all__: list[str] = []

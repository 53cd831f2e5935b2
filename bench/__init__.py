"""Serving benchmarks: ``python -m bench`` (``make bench``; ``--quick``: ``make bench-smoke``)
and the soak (``python -m bench.soak``, ``make soak``).

- ``harness/``: what every suite uses: the one server launcher (``launch``), the benchmark
  checkpoints, load generation (gRPC and REST), the run's configuration, the target
  verdicts (``report``) and the plot.
- ``servers/``: the reference servers the service is measured against: the transport
  ceilings, the lookup floors (gRPC and REST: the transport plus the service's own lookup,
  nothing else) and the naive baseline.
- ``suites/``: what ``make bench`` runs, each ending in target lines: serving, scaling,
  overload, memory; and ``gpu_gather``, the device check ``scripts/gpu.sh`` runs.
- ``soak/``: minutes of mixed traffic with reloads, a killed worker, slow readers and
  truncated shared memory, every answer checked bit for bit.

Results go to ``bench/results/`` (git-ignored).
"""

from __future__ import annotations

__all__: list[str] = []

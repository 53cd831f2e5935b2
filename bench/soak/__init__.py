"""The soak: clients against ``python -m service --workers W`` for minutes, with reloads, a
corrupted version, a killed worker, slow readers and truncated shared memory; every valid
answer checked bit for bit. ``run`` drives it (``python -m bench.soak``, ``make soak``).
"""

from __future__ import annotations

__all__: list[str] = []

"""The soak: clients against ``python -m service --workers W`` for minutes, with reloads,
a corrupted version, a killed worker and a slow reader; every valid answer checked bit
for bit.

    python -m bench.soak --clients 4 --minutes 3 --workers 2 --seed 0   (``make soak``)

``run`` drives it; ``requests`` makes the random requests and their expected answers,
``oracle`` holds every published version's tables, ``traffic`` is the clients and their
tally, ``rest`` the same over OIP REST, ``slow`` the slow readers (large answers held
unread), ``shm_truncate`` the shared-memory scenario, ``server`` publishes versions and
launches the server, ``report`` the summary.
"""

from __future__ import annotations

__all__: list[str] = []

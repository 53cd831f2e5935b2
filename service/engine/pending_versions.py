"""Versions arriving in the repository: "not ready yet" until they stay broken.

A version copied in file by file (``cp -r``, ``rsync``, ``kubectl cp``) is seen by a poll
half written: manifest without tables, a table still growing. Such a version fails to
load, but it is not broken yet, only not ready. :class:`PendingVersions` tells the two
apart: a version that fails is *pending* (logged once at INFO, not counted as a load
failure, and retried every poll) until its files have stayed unchanged for the grace time, judged by
the newest change time (ctime) in its directory, and by this process's own clock since it
first saw that state, whichever says so first. ctime cannot be set back by ``cp -p`` or
``rsync -a`` (mtime can), so a copy that preserves old timestamps still counts as new. A
grace of 0 refuses at the first failure (also used when there is no next poll).
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass
from pathlib import Path

__all__ = ["PendingVersions", "tree_signature"]


def tree_signature(version_dir: Path) -> float:
    """The newest ctime of the version directory and its entries (0.0 if unreadable):
    changes whenever a file is written, added, removed, renamed or has its mode changed."""
    try:
        with os.scandir(version_dir) as entries:
            times = [e.stat(follow_symlinks=False).st_ctime for e in entries]
        return max([os.stat(version_dir).st_ctime, *times])
    except OSError:
        return 0.0


@dataclass
class _Seen:
    signature: float
    since: float  # time.monotonic() when this signature was first seen failing


class PendingVersions:
    """Versions that failed to load but may still be arriving."""

    def __init__(self, grace_seconds: float) -> None:
        self.grace_seconds = grace_seconds
        self._pending: dict[Path, _Seen] = {}
        self._noticed: set[Path] = set()

    def settled(self, version_dir: Path, signature: float) -> bool:
        """Whether a version that just failed to load has stayed as it is for the grace
        time (then it is broken); otherwise it is recorded as pending."""
        if self.grace_seconds <= 0:
            return True
        now = time.monotonic()
        seen = self._pending.get(version_dir)
        if seen is None or seen.signature != signature:
            seen = self._pending[version_dir] = _Seen(signature, now)
        still = now - seen.since >= self.grace_seconds
        old = signature > 0 and time.time() - signature >= self.grace_seconds
        if still or old:
            self.forget(version_dir)
            return True
        return False

    def first_notice(self, version_dir: Path) -> bool:
        """True once per pending version: its "not ready yet" line is logged once, not at
        every poll of a long copy."""
        if version_dir in self._noticed:
            return False
        self._noticed.add(version_dir)
        return True

    def forget(self, version_dir: Path) -> None:
        """The version loaded, was refused, or went away."""
        self._pending.pop(version_dir, None)
        self._noticed.discard(version_dir)

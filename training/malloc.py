"""glibc malloc settings for training: keep multi-MB step buffers instead of unmapping them.

glibc serves big allocations (a step's logits are ~200 MB) with mmap and returns them to
the OS on free, so every step page-faults them in again. Measured here (2 layers, C=128,
8 x 128 tokens per step): ~226k minor faults and 0.39 s of kernel time per step by
default, none with ``mmap_max=0`` (heap only) and a high trim threshold. The tunables
are read once at process start, hence the re-exec.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Sequence

__all__ = ["TUNABLES", "reexec_with_tunables"]

TUNABLES = ("glibc.malloc.mmap_max=0:glibc.malloc.trim_threshold=4294967296:"
            "glibc.malloc.mmap_threshold=33554432")


def reexec_with_tunables(module: str, argv: Sequence[str]) -> None:
    """Restart ``python -m module argv`` with TUNABLES unless GLIBC_TUNABLES is already set.

    Only on Linux with glibc; set GLIBC_TUNABLES (even empty) to opt out.
    """
    if "GLIBC_TUNABLES" in os.environ or not sys.platform.startswith("linux"):
        return
    if os.confstr("CS_GNU_LIBC_VERSION") is None:
        return  # musl or another libc: the variable means nothing there
    env = dict(os.environ, GLIBC_TUNABLES=TUNABLES)
    sys.stdout.flush()
    sys.stderr.flush()
    os.execve(sys.executable, [sys.executable, "-m", module, *argv], env)

"""``python -m bench``: see bench/run.py. Re-executes once with the server's malloc tunables.

The load generator decodes multi-MB replies too; with glibc's adaptive mmap threshold it
would page-fault every reply buffer in again, and that client-side cost would be charged
to whichever server is being measured. The tunables must be set before the process starts.
"""

from __future__ import annotations

import os
import sys

from bench.servers import GLIBC_TUNABLES

__all__: list[str] = []

if __name__ == "__main__":
    if "GLIBC_TUNABLES" not in os.environ:
        os.environ["GLIBC_TUNABLES"] = GLIBC_TUNABLES
        os.execv(sys.executable, [sys.executable, "-m", "bench", *sys.argv[1:]])
    from bench.run import main

    main()

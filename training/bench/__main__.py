"""``python -m training.bench``: see training/bench/throughput.py."""

from __future__ import annotations

import sys

__all__: list[str] = []

if __name__ == "__main__":
    from training.bench.throughput import main

    sys.exit(main())

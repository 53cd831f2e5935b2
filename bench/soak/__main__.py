"""``python -m bench.soak``: see bench/soak/run.py."""

from __future__ import annotations

__all__: list[str] = []

if __name__ == "__main__":
    from bench.soak.run import main

    main()

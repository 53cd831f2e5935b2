"""``python -m service``: parse the config once, set up logging, serve."""

from __future__ import annotations

import asyncio

from service.config import parse_config
from service.logs import setup_logging
from service.workers import run_workers

__all__ = ["main"]


def main(argv: list[str] | None = None) -> None:
    """Entry point."""
    config = parse_config(argv)
    setup_logging(config)
    if config.workers > 1:
        run_workers(config)
        return
    from service.server import serve  # the one-process path: the workers' parent never needs it

    asyncio.run(serve(config))


if __name__ == "__main__":
    main()

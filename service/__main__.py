"""``python -m service``: parse the config once, check it, set up logging, serve.

A configuration that cannot work (a port in use, a repository path that is not there, a
default model or pinned version that is not in the repository, a device torch does not
see) is refused before anything is served: one line on stderr, exit status 2, no
traceback (service/preflight.py).
"""

from __future__ import annotations

import asyncio

from service.config import exit_with, parse_config
from service.logs import setup_logging
from service.preflight import StartupError, check_config, check_device, check_ports
from service.workers import run_workers

__all__ = ["main"]


def main(argv: list[str] | None = None) -> None:
    """Entry point."""
    config = parse_config(argv)
    try:
        check_config(config)
        check_ports(config)
        if config.workers == 1:  # the workers' parent never imports torch: each worker checks
            check_device(config.device)
    except StartupError as e:
        exit_with(str(e))
    setup_logging(config)
    if config.workers > 1:
        run_workers(config)
        return
    from service.server import serve  # the one-process path: the workers' parent never needs it

    try:
        asyncio.run(serve(config))
    except StartupError as e:  # a port taken between the check and the bind
        exit_with(str(e))


if __name__ == "__main__":
    main()

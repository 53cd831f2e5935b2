"""``python -m service``: parse the config once, check it, set up logging, serve.

A configuration that cannot work is refused before anything is served: each flag and
``EMBED_*`` variable by its rule as it is parsed (service/config.py), then what the
filesystem and the machine must hold (a repository path that is not there, a default model
or pinned version not in the repository, a port in use, a device torch does not see:
service/preflight.py). Each is one line on stderr and exit status 2, no traceback. A bug is
one line saying "internal error" and where its traceback is (the server's log once logging
is set up, else a file), exit status 70.
"""

from __future__ import annotations

import asyncio
import logging

from client.flags import internal_error
from service.config import exit_with, parse_config
from service.logs import setup_logging
from service.preflight import StartupError, check_config, check_device, check_ports
from service.workers import run_workers

__all__ = ["main"]

PROG = "python -m service"
log = logging.getLogger("service")


def _run(argv: list[str] | None, logging_ready: list[bool]) -> None:
    config = parse_config(argv)
    try:
        check_config(config)
        check_ports(config)
        if config.workers == 1:  # the workers' parent never imports torch: each worker checks
            check_device(config.device)
    except StartupError as e:
        exit_with(str(e))
    setup_logging(config)
    logging_ready.append(True)
    if config.workers > 1:
        run_workers(config)
        return
    from service.server import serve  # the one-process path: the workers' parent never needs it

    try:
        asyncio.run(serve(config))
    except StartupError as e:  # a port taken between the check and the bind
        exit_with(str(e))


def main(argv: list[str] | None = None) -> None:
    """Entry point."""
    logging_ready: list[bool] = []
    try:
        _run(argv, logging_ready)
    except Exception as e:  # a bug: said once, its traceback where the operator looks
        if not logging_ready:
            raise SystemExit(internal_error(PROG, e)) from None
        log.critical("internal error (%s): the server stopped; the traceback follows in "
                     "this record", type(e).__name__, exc_info=e)
        raise SystemExit(70) from None


if __name__ == "__main__":
    main()

"""Logging setup for the server and its workers: text for people, JSON for machines."""

from __future__ import annotations

import json
import logging
import re
import sys
import time
from typing import Any

from service.config import ServerConfig

__all__ = ["escape_controls", "formatter", "setup_logging"]


class _JsonFormatter(logging.Formatter):
    """One JSON object per line, for log shippers (``json.dumps`` escapes every control
    character, so no value can end the line)."""

    def format(self, record: logging.LogRecord) -> str:
        entry = {"ts": time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created)),
                 "level": record.levelname, "logger": record.name,
                 "message": record.getMessage()}
        if record.exc_info:
            entry["exc"] = self.formatException(record.exc_info)
        return json.dumps(entry)


# C0 and C1 controls, DEL, and the Unicode line/paragraph separators: anything a terminal
# or a log shipper could take as the end of a line or a control sequence.
_CONTROL = re.compile("[\x00-\x1f\x7f-\x9f\u2028\u2029]")


def _escape(match: re.Match[str]) -> str:
    c = match.group()
    named = {"\n": "\\n", "\r": "\\r", "\t": "\\t"}.get(c)
    if named:
        return named
    return f"\\x{ord(c):02x}" if ord(c) < 0x100 else f"\\u{ord(c):04x}"


def escape_controls(text: str) -> str:
    """``text`` with every control character written as its escape (``\\n``, ``\\x1b``):
    one log record stays one line whatever a client put in the values it logs."""
    return _CONTROL.sub(_escape, text)


class _TextFormatter(logging.Formatter):
    """Text for people, one line per record: the message (and so every client-supplied
    value in it, e.g. a request id with a newline) has its control characters escaped.
    A traceback, written by the server itself, follows on its own lines."""

    def formatMessage(self, record: logging.LogRecord) -> str:
        record.message = escape_controls(record.message)
        return super().formatMessage(record)

    def formatException(self, ei: Any) -> str:
        # An exception's message may carry client text, newlines included: every line of
        # the traceback starts with "  | ", which no record's first line does.
        text = super().formatException(ei)
        return "\n".join("  | " + escape_controls(line) for line in text.splitlines())


def formatter(log_format: str) -> logging.Formatter:
    """The formatter of ``--log-format``: ``json`` or ``text``."""
    if log_format == "json":
        return _JsonFormatter()
    return _TextFormatter("%(asctime)s %(levelname)s %(name)s: %(message)s")


def setup_logging(config: ServerConfig) -> None:
    """Text for people, JSON for machines; INFO and up to stderr."""
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(formatter(config.log_format))
    logging.basicConfig(level=logging.INFO, handlers=[handler], force=True)

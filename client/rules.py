"""What a command-line option accepts: :class:`Rule` and the rules every command's table is
made of (integers and numbers within bounds, ports, choices, text, model names, tokens,
devices, files to read, files and directories to write), and what TLS files must hold.

A rule's ``accepts`` is the whole refusal a user reads: "must be <accepts>, got '<value>'".
client/flags.py installs rules into argparse parsers. Standard library only: the light
client (embedctl) installs without the server, and the server and training job import it.
"""

from __future__ import annotations

import math
import os
import re
import ssl
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

__all__ = ["DEVICE", "MODEL_NAME", "SWITCH", "TOKEN", "Rule", "choice", "input_dir",
           "input_file", "integer", "model_name", "number", "output_dir", "output_file",
           "port", "text", "tls_problem"]


def _anything(_: Any) -> bool:
    return True


@dataclass(frozen=True)
class Rule:
    """What one option accepts.

    ``accepts`` completes "must be ...": it is the whole refusal a user reads. ``convert``
    turns the typed text into the value (ValueError when it cannot), ``test`` says whether
    a converted value can work, ``place`` what the filesystem must hold for it (a reason
    when it does not, else None). ``takes_value`` is False for switches (``--tls``).
    ``explains``: ``convert``'s own ValueError message is the refusal (a grammar that
    names the bad item, e.g. the token-id list's).
    """

    accepts: str
    convert: Callable[[str], Any] = str
    test: Callable[[Any], bool] = _anything
    place: Callable[[Any], str | None] | None = None
    takes_value: bool = True
    explains: bool = False

    def parse(self, raw: str) -> Any:
        """The value of ``raw``; ValueError saying what is accepted."""
        try:
            value = self.convert(raw)
        except (ValueError, TypeError, OverflowError) as e:
            if self.explains and str(e):
                raise ValueError(str(e)) from None
            raise ValueError(self.refusal(raw)) from None
        if not self.test(value):
            raise ValueError(self.refusal(raw))
        return value

    def problem(self, value: Any) -> str | None:
        """For an already-typed value (a config built in code): the refusal, or None."""
        return None if self.test(value) else self.refusal(value)

    def refusal(self, value: Any) -> str:
        shown = value if isinstance(value, str) else str(value)
        return f"must be {self.accepts}, got {shown!r}"


SWITCH = Rule("given without a value", takes_value=False)


# --- rule constructors ------------------------------------------------------------------

_INT = re.compile(r"-?[0-9]+")


def _int(raw: str) -> int:
    if isinstance(raw, int) and not isinstance(raw, bool):
        return raw
    if not isinstance(raw, str) or _INT.fullmatch(raw) is None:
        raise ValueError(raw)
    return int(raw)


def _float(raw: str) -> float:
    value = float(raw)
    if not math.isfinite(value):
        raise ValueError(raw)
    return value


def _shown(bound: float) -> str:
    return str(bound) if isinstance(bound, int) else f"{bound:g}"


def _bounds(low: float | None, high: float | None, low_open: bool, high_open: bool) -> str:
    if low is not None and high is not None:
        return (f"in {'(' if low_open else '['}{_shown(low)}, {_shown(high)}"
                f"{')' if high_open else ']'}")
    if low is not None:
        return f"{'>' if low_open else '>='} {_shown(low)}"
    if high is not None:
        return f"{'<' if high_open else '<='} {_shown(high)}"
    return ""


def _within(value: float, low: float | None, high: float | None, low_open: bool = False,
            high_open: bool = False) -> bool:
    if low is not None and (value <= low if low_open else value < low):
        return False
    return not (high is not None and (value >= high if high_open else value > high))


def integer(low: int | None = None, high: int | None = None, *, what: str = "an integer",
            note: str = "") -> Rule:
    """An integer in [low, high] (either end open when None); ``note`` says what 0 means."""
    bounds = _bounds(low, high, False, False)
    accepts = " ".join(filter(None, (what, bounds))) + (f" ({note})" if note else "")
    return Rule(accepts, _int, lambda v: isinstance(v, int) and not isinstance(v, bool)
                and _within(v, low, high))


def number(low: float | None = None, high: float | None = None, *, low_open: bool = False,
           high_open: bool = False, what: str = "a number", note: str = "") -> Rule:
    """A finite number within the bounds (``low_open``: strictly above ``low``)."""
    bounds = _bounds(low, high, low_open, high_open)
    accepts = " ".join(filter(None, (what, bounds))) + (f" ({note})" if note else "")

    def test(v: Any) -> bool:
        return (isinstance(v, int | float) and not isinstance(v, bool) and math.isfinite(v)
                and _within(v, low, high, low_open, high_open))

    return Rule(accepts, _float, test)


def port(*, zero: str = "", off: bool = False) -> Rule:
    """A TCP port; ``zero`` says what 0 does when it is allowed, ``off``: -1 turns it off."""
    notes = [f"0 {zero}" if zero else "", "-1 off" if off else ""]
    note = ", ".join(filter(None, notes))
    accepts = "a port 1..65535" + (f" ({note})" if note else "")
    return Rule(accepts, _int, lambda v: isinstance(v, int) and (
        1 <= v <= 65535 or (v == 0 and bool(zero)) or (v == -1 and off)))


def choice(*names: str) -> Rule:
    """Exactly one of ``names`` (case as written)."""
    return Rule(f"one of {', '.join(names)}", str, lambda v: v in names)


def text(accepts: str = "non-empty text", pattern: str | None = None, *,
         empty: bool = False) -> Rule:
    """A string matching ``pattern`` (whole), non-empty unless ``empty``."""
    regex = re.compile(pattern) if pattern is not None else None

    def test(v: Any) -> bool:
        if not isinstance(v, str):
            return False
        if v == "":
            return empty
        return regex is None or regex.fullmatch(v) is not None

    return Rule(accepts, str, test)


# One directory name under the model repository: the server skips names starting with '.'
# (temporary folders of atomic writes), and a name is a path component and a URL segment.
MODEL_NAME = r"[A-Za-z0-9][A-Za-z0-9._-]*"


def model_name(*, empty: str = "") -> Rule:
    """A model's name (a folder of the repository); ``empty`` says what '' means, if allowed."""
    accepts = ("a model name: letters, digits, '.', '_' or '-', starting with a letter or "
               "digit" + (f" ('' = {empty})" if empty else ""))
    return text(accepts, MODEL_NAME, empty=bool(empty))


# A torch device as this project's programs take it; whether torch sees it is checked later.
DEVICE = text("auto, cpu, cuda or cuda:N", r"auto|cpu|cuda(?::[0-9]+)?")

# A bearer token as gRPC metadata and HTTP headers carry it: visible ASCII, no spaces (a
# newline read from a file along with the token is the usual mistake).
TOKEN = text("a token of visible ASCII characters, without spaces or line breaks "
             "('' = none)", r"[\x21-\x7e]+", empty=True)


def _path_kind(path: Path) -> str:
    return "a directory" if path.is_dir() else "a file"


def input_file(*, convert: Callable[[str], Any] = str, what: str = "a file",
               optional: bool = False) -> Rule:
    """An existing regular file (checked at :func:`check_places`)."""

    def place(value: Any) -> str | None:
        if optional and not value:
            return None
        path = Path(value)
        if not path.exists():
            return "no such file"
        if not path.is_file():
            return f"is {_path_kind(path)}, not a file"
        if not os.access(path, os.R_OK):
            return "is not readable by this user"
        return None

    return Rule(what + (" ('' = none)" if optional else ""), convert,
                lambda v: isinstance(v, str | Path) and (bool(str(v)) or optional), place)


def input_dir(*, convert: Callable[[str], Any] = str, what: str = "a directory",
              hint: str = "") -> Rule:
    """An existing directory (checked at :func:`check_places`); ``hint`` follows a refusal."""

    def place(value: Any) -> str | None:
        path = Path(value)
        if not path.exists():
            return "does not exist" + hint
        if not path.is_dir():
            return "is not a directory" + hint
        return None

    return Rule(what, convert, lambda v: isinstance(v, str | Path) and bool(str(v)), place)


def _parent_problem(path: Path) -> str | None:
    parent = path.parent
    if not parent.exists():
        return f"the directory {parent} does not exist; create it first"
    if not parent.is_dir():
        return f"{parent} is not a directory"
    return None


def output_file(suffixes: Sequence[str] = (), *, convert: Callable[[str], Any] = Path,
                what: str = "a file path") -> Rule:
    """A file to write: in an existing directory, not a directory itself, and ending in
    one of ``suffixes`` when given (the file is then written in that format, at exactly
    that path: nothing is appended)."""
    shown = ", ".join(suffixes[:-1]) + " or " + suffixes[-1] if len(suffixes) > 1 else \
        "".join(suffixes)
    accepts = what + (f" ending in {shown}" if suffixes else "")

    def test(v: Any) -> bool:
        name = str(v)
        return bool(name) and not name.endswith(os.sep) and (
            not suffixes or Path(name).suffix.lower() in suffixes)

    def place(value: Any) -> str | None:
        path = Path(value)
        if path.is_dir():
            return "is a directory; name the file to write"
        return _parent_problem(path)

    return Rule(accepts, convert, test, place)


def output_dir(*, convert: Callable[[str], Any] = str, what: str = "a directory") -> Rule:
    """A directory to write into: one that exists, or a new one in an existing directory."""

    def place(value: Any) -> str | None:
        path = Path(value)
        if path.exists():
            return None if path.is_dir() else "is a file, not a directory"
        return _parent_problem(path)

    return Rule(what, convert, lambda v: isinstance(v, str | Path) and bool(str(v)), place)


def tls_problem(cert: str | None, key: str | None, ca: str | None,
                ca_flag: str) -> str | None:
    """What is wrong with TLS files that exist, as one line, else None: ``cert`` and ``key``
    (--tls-cert, --tls-key) a PEM certificate chain and its unencrypted key that belong
    together, ``ca`` (``ca_flag``) PEM CA certificates. gRPC itself only logs its own lines
    and fails later (the bind, the handshake) with words that point elsewhere."""
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    if cert and key:
        encrypted = f"--tls-key {key}: the key is encrypted; give an unencrypted key (gRPC " \
                    f"cannot ask for its passphrase)"

        def no_passphrase() -> bytes:
            raise ValueError(encrypted)

        try:
            context.load_cert_chain(cert, key, password=no_passphrase)
        except ValueError as e:
            return str(e) if str(e) == encrypted else f"--tls-key {key}: {e}"
        except ssl.SSLError as e:
            detail = f" ({e.reason})" if e.reason else ""
            why = "the key does not belong to the certificate" if "MISMATCH" in str(e) else \
                f"not a PEM certificate chain and its private key{detail}"
            return f"--tls-cert {cert} and --tls-key {key}: {why}; give a certificate and " \
                   f"the key it was made with"
    if ca:
        try:
            context.load_verify_locations(cafile=ca)
        except ssl.SSLError as e:
            detail = f" ({e.reason})" if e.reason else ""
            return f"{ca_flag} {ca}: not PEM CA certificates{detail}"
    return None

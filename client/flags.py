"""What each command-line option accepts, checked when it is parsed: one table per command.

Every Python command of the project (embedctl, ``python -m service``, ``python -m
training``, ``python -m training.inspect``, the examples and scripts) declares its options'
rules as data, ``{dest: Rule}``, and hands the table to :func:`install`. argparse then
converts and checks each value with its rule as it parses, so a value that cannot work is
a usage error before any connection or work: exit status 2 and one line, ``prog: error:
argument --flag: must be <what it accepts>, got '<value>'``. A parser whose options and
table differ is a programming error, raised when the parser is built: an option added
without a rule cannot ship.

Two kinds of check are kept apart from the value's own:

- ``Rule.place``: what the filesystem must hold (an input file that exists, an output's
  directory). :func:`check_places` runs these just before work, not while parsing, since
  a command line may be parsed on another machine than the one it runs on (the deploy
  tests parse every manifest's command with the real parsers).
- :class:`Relation`: an option that another makes meaningless or requires (``--shm-bytes``
  without ``--shm``), checked on what the user actually gave (:func:`given`).

This module is standard library only: the light client (embedctl) installs without the
server, and the server and training job import it from here.
"""

from __future__ import annotations

import argparse
import math
import os
import re
import ssl
import sys
import tempfile
import traceback
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NoReturn

__all__ = ["DEVICE", "MODEL_NAME", "SWITCH", "TOKEN", "OneLineParser", "Relation", "Rule",
           "actions", "check_places", "check_relations", "choice", "conflicts", "from_env", "given",
           "input_dir", "input_file", "install", "integer", "internal_error", "model_name",
           "needs", "number", "one_of", "output_dir", "output_file", "parse", "port", "text",
           "tls_problem"]


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


class _Check:
    """argparse's ``type=``: the rule's conversion, a refusal as argparse's one line."""

    def __init__(self, rule: Rule) -> None:
        self.rule = rule
        self.__name__ = "value"  # argparse reads it when formatting some errors

    def __call__(self, raw: str) -> Any:
        try:
            return self.rule.parse(raw)
        except ValueError as e:
            raise argparse.ArgumentTypeError(str(e)) from None


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


# --- relations between options ----------------------------------------------------------


@dataclass(frozen=True)
class Relation:
    """A rule over several options: ``broken(values, given)`` -> the refusal, or None.
    ``options`` names the dests it reads (the tests exercise each relation)."""

    options: tuple[str, ...]
    broken: Callable[[Mapping[str, Any], set[str]], str | None]


def _flag(dest: str) -> str:
    return "--" + dest.replace("_", "-")


def needs(option: str, other: str, why: str = "") -> Relation:
    """``option``, when given, needs ``other`` set (truthy)."""
    def broken(values: Mapping[str, Any], given_: set[str]) -> str | None:
        if option in given_ and not values.get(other):
            return f"{_flag(option)} needs {_flag(other)}" + (f": {why}" if why else "")
        return None
    return Relation((option, other), broken)


def conflicts(option: str, other: str, why: str) -> Relation:
    """``option`` and ``other`` cannot both be given."""
    def broken(values: Mapping[str, Any], given_: set[str]) -> str | None:
        if option in given_ and other in given_:
            return f"{_flag(option)} and {_flag(other)} cannot go together: {why}"
        return None
    return Relation((option, other), broken)


def one_of(first: str, second: str, names: tuple[str, str] | None = None) -> Relation:
    """Exactly one of two options (or positionals, shown as ``names``), where a command has
    both (a relation is about the options of the command being run)."""
    shown = names or (_flag(first), _flag(second))

    def broken(values: Mapping[str, Any], given_: set[str]) -> str | None:
        if first not in values or second not in values:
            return None
        if (first in given_) == (second in given_):
            return f"give exactly one of {shown[0]} or {shown[1]}"
        return None
    return Relation((first, second), broken)


# --- parsers -----------------------------------------------------------------------------


class OneLineParser(argparse.ArgumentParser):
    """argparse, but a mistake is one line on stderr and exit status 2 (no usage block)."""

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"{self.prog}: error: {message} (see --help)\n")


def actions(parser: argparse.ArgumentParser) -> Iterator[argparse.Action]:
    """Every option and positional of ``parser`` and of its subcommands (not --help)."""
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for sub in dict.fromkeys(action.choices.values()):  # aliases: once
                yield from actions(sub)
        elif not isinstance(action, argparse._HelpAction | argparse._VersionAction):
            yield action


def install(parser: argparse.ArgumentParser, rules: Mapping[str, Rule]) -> None:
    """Make each option's rule its argparse type. Raises LookupError when an option has no
    rule or a rule no option: the table and the parser are kept equal by construction."""
    seen: set[str] = set()
    for action in actions(parser):
        rule = rules.get(action.dest)
        if rule is None:
            raise LookupError(f"{parser.prog}: {action.option_strings or action.dest} has no "
                              f"rule in its table")
        if rule.takes_value != (action.nargs != 0):
            raise LookupError(f"{parser.prog}: {action.dest}: the rule and the option "
                              f"disagree on taking a value")
        if rule.takes_value:
            action.type = _Check(rule)
        seen.add(action.dest)
    if unused := sorted(set(rules) - seen):
        raise LookupError(f"{parser.prog}: rules for no option: {', '.join(unused)}")


_UNSET = object()


def given(parser: argparse.ArgumentParser, argv: Sequence[str] | None) -> set[str]:
    """The dests the command line itself set (not their defaults), for :class:`Relation`."""
    saved = [(a, a.default) for a in actions(parser)]
    try:
        for action, _ in saved:
            action.default = _UNSET
        ns = parser.parse_args(argv)
    finally:
        for action, default in saved:
            action.default = default
    return {k for k, v in vars(ns).items() if v is not _UNSET}


def check_relations(parser: argparse.ArgumentParser, relations: Sequence[Relation],
                    values: Mapping[str, Any], given_: set[str]) -> None:
    """parser.error() with the first broken relation."""
    for relation in relations:
        message = relation.broken(values, given_)
        if message is not None:
            parser.error(message)


def from_env(parser: argparse.ArgumentParser, rule: Rule, var: str,
             environ: Mapping[str, str]) -> Any:
    """``var``'s value by ``rule``, None when unset; a bad one is parser.error() naming it."""
    raw = environ.get(var)
    if raw is None:
        return None
    try:
        return rule.parse(raw)
    except ValueError as e:
        parser.error(f"{var}: {e}")


def check_places(rules: Mapping[str, Rule], values: Mapping[str, Any],
                 names: Mapping[str, str] | None = None) -> str | None:
    """The first filesystem refusal among ``values`` (``names``: how each is shown, e.g.
    an environment variable; default the flag), as ``--flag PATH: reason``; else None."""
    for dest, rule in rules.items():
        value = values.get(dest)
        if rule.place is None or value is None:
            continue
        for item in value if isinstance(value, list | tuple) else (value,):
            reason = rule.place(item)
            if reason is not None:
                shown = (names or {}).get(dest, _flag(dest))
                return f"{shown} {item}: {reason}"
    return None


def parse(parser: argparse.ArgumentParser, rules: Mapping[str, Rule],
          argv: Sequence[str] | None, relations: Sequence[Relation] = (),
          variables: Mapping[str, str] | None = None,
          environ: Mapping[str, str] | None = None) -> argparse.Namespace:
    """A command line, checked in full before any work: each option by its rule (argparse,
    through :func:`install`), the ``relations`` on what was given, each option left unset
    from its environment variable (``variables``: dest -> name, read from ``environ``, by
    default os.environ), then what the filesystem must hold. A mistake is parser.error()."""
    args = parser.parse_args(argv)
    check_relations(parser, relations, vars(args), given(parser, argv))
    env = os.environ if environ is None else environ
    for dest, var in (variables or {}).items():
        if getattr(args, dest) is None:
            setattr(args, dest, from_env(parser, rules[dest], var, env))
    names = {a.dest: a.option_strings[0] if a.option_strings else str(a.metavar or a.dest)
             for a in actions(parser)}
    refusal = check_places(rules, vars(args), names)
    if refusal is not None:
        parser.error(refusal)
    return args


def internal_error(prog: str, error: BaseException) -> int:
    """A bug, not a mistake of the user's: the traceback goes to a log file, and one line
    on stderr names it. Returns exit status 70 (EX_SOFTWARE)."""
    detail = "".join(traceback.format_exception(error))
    slug = re.sub(r"[^A-Za-z0-9]+", "-", prog).strip("-") or "command"
    try:
        fd, path = tempfile.mkstemp(prefix=f"{slug}-internal-error-", suffix=".log")
        with os.fdopen(fd, "w", encoding="utf-8") as log:
            log.write(f"{prog} {' '.join(sys.argv[1:])}\n{detail}")
    except OSError:  # nowhere to write it: the traceback itself, rather than nothing
        print(f"{prog}: internal error ({type(error).__name__}); please report it:\n{detail}",
              file=sys.stderr, end="")
        return 70
    print(f"{prog}: internal error ({type(error).__name__}); please report it with the log "
          f"{path}", file=sys.stderr)
    return 70

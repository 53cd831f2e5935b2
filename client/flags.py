"""What each command-line option accepts, checked when it is parsed: one table per command.

Every Python command of the project (embedctl, ``python -m service``, ``python -m
training``, ``python -m training.inspect``, the examples and scripts) declares its options'
rules as data, ``{dest: Rule}`` (the rules are client/rules.py's, re-exported here), and
hands the table to :func:`install`. argparse then converts and checks each value with its
rule as it parses, so a value that cannot work is a usage error before any connection or
work: exit status 2 and one line, ``prog: error: argument --flag: must be <what it
accepts>, got '<value>'``. A parser whose options and table differ is a programming error,
raised when the parser is built: an option added without a rule cannot ship.

Two kinds of check are kept apart from the value's own:

- ``Rule.place``: what the filesystem must hold (an input file that exists, an output's
  directory). :func:`check_places` runs these just before work, not while parsing, since
  a command line may be parsed on another machine than the one it runs on (the deploy
  tests parse every manifest's command with the real parsers).
- :class:`Relation`: an option that another makes meaningless or requires (``--shm-bytes``
  without ``--shm``), checked on what the user actually gave (:func:`given`).

Standard library only, like client/rules.py.
"""

from __future__ import annotations

import argparse
import os
import re
import sys
import tempfile
import traceback
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, NoReturn

from client.rules import (
    DEVICE,
    MODEL_NAME,
    SWITCH,
    TOKEN,
    Rule,
    choice,
    input_dir,
    input_file,
    integer,
    model_name,
    number,
    output_dir,
    output_file,
    port,
    text,
    tls_problem,
)

__all__ = ["DEVICE", "MODEL_NAME", "SWITCH", "TOKEN", "OneLineParser", "Relation", "Rule",
           "actions", "check_places", "check_relations", "choice", "conflicts", "flag_name",
           "from_env",
           "given", "input_dir", "input_file", "install", "integer", "internal_error",
           "model_name", "needs", "number", "one_of", "output_dir", "output_file", "parse",
           "port", "text", "tls_problem"]


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


# --- relations between options ----------------------------------------------------------


@dataclass(frozen=True)
class Relation:
    """A rule over several options: ``broken(values, given)`` -> the refusal, or None.
    ``options`` names the dests it reads (the tests exercise each relation)."""

    options: tuple[str, ...]
    broken: Callable[[Mapping[str, Any], set[str]], str | None]


def flag_name(dest: str) -> str:
    """The option that sets ``dest``: ``max_batch_tokens`` -> ``--max-batch-tokens``."""
    return "--" + dest.replace("_", "-")


def needs(option: str, other: str, why: str = "") -> Relation:
    """``option``, when given, needs ``other`` set (truthy)."""
    def broken(values: Mapping[str, Any], given_: set[str]) -> str | None:
        if option in given_ and not values.get(other):
            return f"{flag_name(option)} needs {flag_name(other)}" + (f": {why}" if why else "")
        return None
    return Relation((option, other), broken)


def conflicts(option: str, other: str, why: str) -> Relation:
    """``option`` and ``other`` cannot both be given."""
    def broken(values: Mapping[str, Any], given_: set[str]) -> str | None:
        if option in given_ and other in given_:
            return f"{flag_name(option)} and {flag_name(other)} cannot go together: {why}"
        return None
    return Relation((option, other), broken)


def one_of(first: str, second: str, names: tuple[str, str] | None = None) -> Relation:
    """Exactly one of two options (or positionals, shown as ``names``), where a command has
    both (a relation is about the options of the command being run)."""
    shown = names or (flag_name(first), flag_name(second))

    def broken(values: Mapping[str, Any], given_: set[str]) -> str | None:
        if first not in values or second not in values:
            return None
        if (first in given_) == (second in given_):
            return f"give exactly one of {shown[0]} or {shown[1]}"
        return None
    return Relation((first, second), broken)


# --- parsers -----------------------------------------------------------------------------


class OneLineParser(argparse.ArgumentParser):
    """argparse, but a mistake is one line on stderr and exit status 2 (no usage block),
    prefixed with the command's own name: a subcommand's mistake too (``embedctl: error:``,
    never ``embedctl embed: error:``), so each tool has one prefix for all its refusals."""

    def __init__(self, *args: Any, error_prog: str | None = None, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.error_prog = error_prog or self.prog

    def add_subparsers(self, **kwargs: Any) -> Any:
        kwargs.setdefault("action", _Subcommands)
        action = super().add_subparsers(**kwargs)
        if isinstance(action, _Subcommands):
            action.error_prog = self.error_prog
        return action

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"{self.error_prog}: error: {message} (see --help)\n")


if TYPE_CHECKING:
    _SubParsers = argparse._SubParsersAction[argparse.ArgumentParser]
else:  # not subscriptable at run time
    _SubParsers = argparse._SubParsersAction


class _Subcommands(_SubParsers):
    """Subcommand parsers that refuse in their tool's name (``OneLineParser.error_prog``)."""

    error_prog = ""

    def add_parser(self, name: str, **kwargs: Any) -> argparse.ArgumentParser:
        parser = super().add_parser(name, **kwargs)
        if isinstance(parser, OneLineParser):
            parser.error_prog = self.error_prog
        return parser


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
                shown = (names or {}).get(dest, flag_name(dest))
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


def internal_error(prog: str, error: BaseException, note: str = "") -> int:
    """A bug, not a mistake of the user's: the traceback goes to a log file, and one line
    on stderr names it (after ``note``, e.g. "nothing written", when given). Returns exit
    status 70 (EX_SOFTWARE)."""
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
    said = f"{note}; " if note else ""
    print(f"{prog}: internal error ({type(error).__name__}); {said}please report it with the "
          f"log {path}", file=sys.stderr)
    return 70

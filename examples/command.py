"""An example's command line as data, and the one code that builds and checks it.

Each example declares every option once, in order: its rule (client/flags.py's, what a
value must be) with the words ``--help`` shows for it, and the relations between options.
:class:`Command` builds the parser from that and parses with it, as every command of the
project does: a mistake is one line and exit status 2, before any work.
"""

from __future__ import annotations

import argparse
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

from client import flags

__all__ = ["Command", "Option"]


@dataclass(frozen=True)
class Option:
    """One option ``--dest`` (underscores as dashes): its rule, and what --help shows."""

    rule: flags.Rule
    help: str
    default: Any = None
    metavar: str | None = None


@dataclass(frozen=True)
class Command:
    """An example's command line: its name, what it does, its options in --help's order
    (by dest), and the relations between them."""

    prog: str
    description: str
    options: Mapping[str, Option]
    relations: Sequence[flags.Relation] = ()

    @property
    def rules(self) -> dict[str, flags.Rule]:
        """Each option's rule by dest: the table client/flags.py checks the parser with."""
        return {dest: option.rule for dest, option in self.options.items()}

    def build_parser(self) -> argparse.ArgumentParser:
        """The argument parser, each option checked by its rule."""
        parser = flags.OneLineParser(prog=self.prog, description=self.description)
        for dest, o in self.options.items():
            parser.add_argument(flags.flag_name(dest), default=o.default,
                                metavar=o.metavar, help=o.help)
        flags.install(parser, self.rules)
        return parser

    def parse_args(self, argv: Sequence[str] | None = None) -> argparse.Namespace:
        """The command line, checked in full before any work; a mistake exits with status 2
        and one line."""
        return flags.parse(self.build_parser(), self.rules, argv, self.relations)

    def reworded(self, prog: str, description: str, **helps: str) -> Command:
        """The same options, rules and relations for another example, some of the options'
        helps in its own words."""
        if unknown := sorted(set(helps) - set(self.options)):
            raise LookupError(f"{prog}: helps for no option: {', '.join(unknown)}")
        options = {dest: replace(o, help=helps.get(dest, o.help))
                   for dest, o in self.options.items()}
        return replace(self, prog=prog, description=description, options=options)

"""The walk every command's option test makes: over the parser's own list of options, each
one's refused value (exit status 2, the exact one line) and accepted value.

A command's test holds ``CASES``: dest -> [(argv, line)], ``line`` the whole stderr of a
refusal, or ``None`` for an accepted command line. The walk goes over the parser's actions
(``client.flags.actions``), not over ``CASES``: an option added to a parser without cases
here, a rule (client/flags.py refuses to build such a parser) and a refused and an accepted
value fails the walk, naming it.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable, Iterable, Mapping, Sequence

import pytest

from client.flags import actions

Case = tuple[Sequence[str], str | None]
Cases = Mapping[str, Sequence[Case]]
# (option, a value it refuses, what it accepts, a value it accepts)
OneEach = tuple[str, str, str, str]


def one_each(refused: Callable[[str, str, str], Case], rows: Iterable[OneEach]
             ) -> dict[str, list[Case]]:
    """The cases of the options one refused and one accepted value show, by dest: each row's
    refusal as ``refused(option, value, accepts)`` words it, then its accepted value."""
    return {option[2:].replace("-", "_"): [refused(option, bad, accepts), ([option, good], None)]
            for option, bad, accepts, good in rows}


def outcome(run: Callable[[list[str]], object], argv: Sequence[str],
            capsys: pytest.CaptureFixture[str]) -> str | None:
    """None when ``run(argv)`` accepts; the one stderr line of its exit-2 refusal."""
    capsys.readouterr()
    code: object = None
    try:
        run(list(argv))
    except SystemExit as e:
        code = e.code
    err = capsys.readouterr().err
    if code is None:
        return None
    assert code == 2, (argv, code, err)
    assert err.count("\n") == 1, err
    assert "Traceback" not in err
    return err.rstrip("\n")


def walk(parser: argparse.ArgumentParser, cases: Cases, run: Callable[[list[str]], object],
         capsys: pytest.CaptureFixture[str]) -> None:
    """Every option of ``parser``: at least one refused and one accepted case, each as
    written. ``run`` parses (and checks) one command line, raising SystemExit on a mistake."""
    walked = set()
    for action in actions(parser):
        if action.dest in walked:  # an option every subcommand has: its cases ran once
            continue
        name = action.option_strings[0] if action.option_strings else action.dest
        assert action.dest in cases, f"{parser.prog} {name}: no cases in the test"
        own = cases[action.dest]
        assert any(line is None for _, line in own), f"{name}: no accepted case"
        assert any(line is not None for _, line in own), f"{name}: no refused case"
        for argv, line in own:
            assert outcome(run, argv, capsys) == line, (name, argv)
        walked.add(action.dest)
    assert set(cases) <= walked, f"cases for no option: {set(cases) - walked}"


def check_all(cases: Sequence[Case], run: Callable[[list[str]], object],
              capsys: pytest.CaptureFixture[str]) -> None:
    """Relations and environment variables: each case as written."""
    for argv, line in cases:
        assert outcome(run, argv, capsys) == line, argv

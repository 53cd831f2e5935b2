"""client/flags.py, the rules every command's option table is made of: a parser and its
table kept equal, relations on what was given, and a bug said once with its log."""

from __future__ import annotations

import argparse
import re
from pathlib import Path

import pytest

from client import flags
from client.cli import main


def test_a_parser_and_its_table_must_match() -> None:
    parser = flags.OneLineParser(prog="p")
    parser.add_argument("--a")
    parser.add_argument("--b", action="store_true")
    with pytest.raises(LookupError, match=r"^p: \['--a'\] has no rule in its table$"):
        flags.install(parser, {"b": flags.SWITCH})
    with pytest.raises(LookupError, match=r"^p: rules for no option: c$"):
        flags.install(parser, {"a": flags.text(), "b": flags.SWITCH, "c": flags.text()})
    with pytest.raises(LookupError, match=r"^p: b: the rule and the option disagree"):
        flags.install(parser, {"a": flags.text(), "b": flags.text()})


@pytest.mark.parametrize(("rule", "good", "bad", "accepts"), [
    (flags.integer(1), "1", "0", "an integer >= 1"),
    (flags.integer(0, 10, note="0 = off"), "10", "11", "an integer in [0, 10] (0 = off)"),
    (flags.integer(), "-7", "1.0", "an integer"),
    (flags.number(0, low_open=True), "1e-9", "0", "a number > 0"),
    (flags.number(0, 1, high_open=True), "0", "1", "a number in [0, 1)"),
    (flags.number(), "-1.5", "nan", "a number"),
    (flags.port(), "65535", "0", "a port 1..65535"),
    (flags.port(zero="picks one", off=True), "-1", "-2", "a port 1..65535 (0 picks one, -1 off)"),
    (flags.choice("a", "b"), "b", "B", "one of a, b"),
    (flags.model_name(), "Llama-3.2-1B", "a/b", "a model name: letters, digits, '.', '_' or "
     "'-', starting with a letter or digit"),
    (flags.TOKEN, "", "a b", "a token of visible ASCII characters, without spaces or line "
     "breaks ('' = none)"),
    (flags.DEVICE, "cuda:0", "cuda0", "auto, cpu, cuda or cuda:N"),
])
def test_rules_accept_and_refuse_as_they_say(rule: flags.Rule, good: str, bad: str,
                                             accepts: str) -> None:
    assert rule.accepts == accepts
    rule.parse(good)
    with pytest.raises(ValueError) as e:
        rule.parse(bad)
    assert str(e.value) == f"must be {accepts}, got {bad!r}"


def test_relations_read_what_was_given_not_the_defaults(capsys: pytest.CaptureFixture[str]
                                                        ) -> None:
    parser = flags.OneLineParser(prog="p")
    parser.add_argument("--size", default=4)
    parser.add_argument("--on", action="store_true")
    rules = {"size": flags.integer(1), "on": flags.SWITCH}
    flags.install(parser, rules)
    relations = [flags.needs("size", "on", "it sizes what --on makes")]
    assert flags.parse(parser, rules, [], relations).size == 4  # the default: no relation
    assert flags.parse(parser, rules, ["--on", "--size", "8"], relations).size == 8
    with pytest.raises(SystemExit):
        flags.parse(parser, rules, ["--size", "4"], relations)  # given, even as the default
    assert capsys.readouterr().err == "p: error: --size needs --on: it sizes what --on makes " \
                                      "(see --help)\n"


def test_a_bug_is_one_line_naming_the_log_of_its_traceback(
        monkeypatch: pytest.MonkeyPatch, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """embedctl's bug path: one line on stderr, exit status 70, the traceback in the file."""
    monkeypatch.setenv("TMPDIR", str(tmp_path))
    monkeypatch.setattr("tempfile.tempdir", None)

    def broken(*args: object, **kwargs: object) -> None:
        raise KeyError("checkpoint_id")

    monkeypatch.setattr("client.cli.EmbeddingClient", broken)
    assert main(["--target", "127.0.0.1:1", "models"]) == 70
    out, err = capsys.readouterr()
    assert out == ""
    match = re.fullmatch(r"embedctl: internal error \(KeyError\); please report it with the log "
                         r"(\S+)\n", err)
    assert match is not None, err
    log = Path(match.group(1))
    assert log.parent == tmp_path
    assert log.name.startswith("embedctl-internal-error-")
    text = log.read_text()
    assert "Traceback (most recent call last):" in text
    assert "KeyError: 'checkpoint_id'" in text


def test_positionals_are_named_as_the_user_sees_them(tmp_path: Path,
                                                     capsys: pytest.CaptureFixture[str]) -> None:
    parser = flags.OneLineParser(prog="p")
    parser.add_argument("dest", metavar="DEST")
    rules = {"dest": flags.output_file()}
    flags.install(parser, rules)
    with pytest.raises(SystemExit):
        flags.parse(parser, rules, [str(tmp_path / "a" / "b")])
    assert capsys.readouterr().err == (f"p: error: DEST {tmp_path / 'a' / 'b'}: the directory "
                                       f"{tmp_path / 'a'} does not exist; create it first "
                                       f"(see --help)\n")
    assert isinstance(flags.parse(parser, rules, [str(tmp_path / "b")]), argparse.Namespace)

"""The Makefile: every target named in ``.PHONY`` has a rule (make itself only says
"Nothing to be done" for a phony name without one)."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
_RULE = re.compile(r"^([A-Za-z0-9_.%/-]+(?:\s+[A-Za-z0-9_.%/-]+)*)\s*::?(?!=)")


def phony_and_rules(text: str) -> tuple[set[str], set[str]]:
    """The names listed in ``.PHONY`` and the targets that have a rule, from a Makefile."""
    lines = text.replace("\\\n", " ").splitlines()  # continuation lines joined
    phony: set[str] = set()
    rules: set[str] = set()
    for line in lines:
        if line.startswith("\t") or line.lstrip().startswith("#"):
            continue  # recipe lines and comments
        if line.startswith(".PHONY"):
            phony.update(line.split(":", 1)[1].split())
        elif m := _RULE.match(line):
            rules.update(m.group(1).split())
    return phony, rules


def test_every_phony_target_has_a_rule() -> None:
    phony, rules = phony_and_rules((ROOT / "Makefile").read_text())
    assert {"run", "test", "check", "bench", "bench-train", "soak"} <= phony
    assert phony - rules == set()


def test_the_check_finds_a_phony_name_without_a_rule() -> None:
    text = ".PHONY: a b \\\n  c\na: b\n\techo a\nb:\n\techo b\nX := 1\n"
    phony, rules = phony_and_rules(text)
    assert phony == {"a", "b", "c"}
    assert phony - rules == {"c"}


def _comment(target: str) -> str:
    """The ``## ...`` comment on ``target``'s rule line."""
    for line in (ROOT / "Makefile").read_text().splitlines():
        if line.startswith(f"{target}:") and "##" in line:
            return line.split("##", 1)[1].strip()
    raise AssertionError(f"{target}: no ## comment")


def test_run_comment_names_every_port_it_serves() -> None:
    from service.config import ServerConfig

    http = ServerConfig().http_port  # make run does not set it: the server's default
    assert _comment("run") == (f"serve models/ on 127.0.0.1: gRPC :50051, HTTP :{http} "
                               f"(REST, the page), metrics :9464")
    recipe = (ROOT / "Makefile").read_text().split("\nrun:", 1)[1].split("\n\n", 1)[0]
    assert "--grpc-port 50051" in recipe
    assert "--metrics-port 9464" in recipe
    assert "--http-port" not in recipe


def test_bench_comment_names_the_default_suites() -> None:
    from bench.harness.config import BenchConfig

    names = BenchConfig().suites
    assert _comment("bench") == (f"the suites: {', '.join(names)}; one target block "
                                 f"(bench/results/)")

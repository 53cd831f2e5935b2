"""The option-taking scripts (scripts/*.py): each option checked when parsed, an unknown one
refused (``gen_proto.py --chek`` used to regenerate silently). The walk goes over each
parser's own options (tests/option_rules.py)."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path
from types import ModuleType

import pytest

from client import flags
from tests.option_rules import check_all, walk

ROOT = Path(__file__).resolve().parents[2]


def script(name: str) -> ModuleType:
    path = ROOT / "scripts" / f"{name}.py"
    spec = importlib.util.spec_from_file_location(f"script_{name}", path)
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def parse(module: ModuleType) -> object:
    return lambda argv: flags.parse(module.build_parser(), module.RULES, argv)


def test_gen_proto_options(capsys: pytest.CaptureFixture[str]) -> None:
    gen = script("gen_proto")
    walk(gen.build_parser(), {"check": [
        (["--check=yes"], "scripts/gen_proto.py: error: argument --check: ignored explicit "
                          "argument 'yes' (see --help)"),
        (["--check"], None)]}, parse(gen), capsys)
    check_all([(["--chek"], "scripts/gen_proto.py: error: unrecognized arguments: --chek "
                            "(see --help)")], parse(gen), capsys)


def test_gen_proto_refuses_an_unknown_option_as_a_process(tmp_path: Path) -> None:
    proc = subprocess.run([sys.executable, str(ROOT / "scripts" / "gen_proto.py"), "--chek"],
                          cwd=tmp_path, capture_output=True, text=True, timeout=60)
    assert (proc.returncode, proc.stdout) == (2, "")
    assert proc.stderr == ("scripts/gen_proto.py: error: unrecognized arguments: --chek "
                           "(see --help)\n")


def test_fetch_tokenizer_options(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    fetch = script("fetch_tokenizer")
    prog = "scripts/fetch_tokenizer.py: error: "
    walk(fetch.build_parser(), {"dest": [
        ([str(tmp_path / "no" / "r.tiktoken")], f"{prog}DEST {tmp_path / 'no' / 'r.tiktoken'}: "
         f"the directory {tmp_path / 'no'} does not exist; create it first (see --help)"),
        ([str(tmp_path)], f"{prog}DEST {tmp_path}: is a directory; name the file to write "
                          f"(see --help)"),
        ([str(tmp_path / "r.tiktoken")], None)]}, parse(fetch), capsys)
    assert parse(fetch)([]).dest is None  # the default: service/format/assets/, made if needed

"""The shared table of client inputs (tests/vectors/client_inputs.json) through the Python
client and embedctl (targets too: --target and $EMBED_TARGET); client/node/test/
grammar.test.js runs the same table through the Node client and the page's parser
(test_node_client.py runs those tests)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from client.cli import build_parser, parse_args
from client.codec import embed_request
from client.grammar import IDS_FORM, SPELLINGS, TARGET_FORM, enum_value, is_target, parse_ids
from genproto.embedding.v1 import embedding_pb2 as pb

ROOT = Path(__file__).resolve().parents[2]
VECTORS: dict[str, Any] = json.loads(
    (ROOT / "tests" / "vectors" / "client_inputs.json").read_text(encoding="utf-8"))
ENUMS = {"compose": pb.Compose, "dtype": pb.DType, "truncate": pb.Truncate}


def entries(name: str) -> list[dict[str, Any]]:
    return [v for v in VECTORS[name] if "_about" not in v]


def embedctl_error(argv: list[str], capsys: pytest.CaptureFixture[str]) -> str:
    """embedctl's usage error for argv: exit 2 before any connection, one error line."""
    with pytest.raises(SystemExit) as exit_info:
        build_parser().parse_args(argv)
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err
    return err.splitlines()[-1]


def test_the_table_is_not_empty() -> None:
    assert len(entries("id_lists")) >= 20
    assert len(entries("requests")) >= 15
    assert VECTORS["id_form"] == IDS_FORM


@pytest.mark.parametrize("v", entries("id_lists"), ids=lambda v: repr(v["input"]))
def test_id_lists(v: dict[str, Any], capsys: pytest.CaptureFixture[str]) -> None:
    for argv in (["embed", "--ids", v["input"]], ["detokenize", v["input"]]):
        if "error" in v:
            with pytest.raises(ValueError) as info:
                parse_ids(v["input"])
            assert v["error"] in str(info.value)
            line = embedctl_error(argv, capsys)
            assert line.startswith("embedctl: error: argument ")
            assert v["error"] in line
        else:
            assert parse_ids(v["input"]) == v["ids"]
            assert build_parser().parse_args(argv).ids == v["ids"]


def test_spellings_are_the_tables_and_each_is_accepted() -> None:
    table = {field: {name: list(others) for name, others in names.items()}
             for field, names in SPELLINGS.items()}
    assert table == {k: v for k, v in VECTORS["spellings"].items() if k != "_about"}
    for field, names in table.items():
        assert list(names) == list(ENUMS[field].keys())  # every enum value, in order
        for name, others in names.items():
            for spelling in (name, *others):
                assert enum_value(field, spelling) == ENUMS[field].Value(name)
                req = embed_request("a", **{field: spelling})  # type: ignore[misc]
                assert getattr(req, field) == ENUMS[field].Value(name)
                flag = f"--{field}"
                assert getattr(build_parser().parse_args(["embed", "a", flag, spelling]),
                               field) == spelling


@pytest.mark.parametrize("v", VECTORS["bad_spellings"], ids=lambda v: repr(v["input"]))
def test_bad_spellings(v: dict[str, Any], capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(ValueError) as info:
        embed_request("a", **{v["field"]: v["input"]})  # type: ignore[misc]
    assert v["error"] in str(info.value)
    line = embedctl_error(["embed", "a", f"--{v['field']}", v["input"]], capsys)
    assert line.startswith(f"embedctl: error: argument --{v['field']}: {v['error']}")


@pytest.mark.parametrize("v", entries("requests"), ids=lambda v: json.dumps(v["options"]))
def test_request_options(v: dict[str, Any]) -> None:
    if "error" in v:
        # Unknown names are TypeErrors; bad values ValueErrors (documented in docs/client.md).
        kind = TypeError if v["error"].startswith("unknown option") else ValueError
        with pytest.raises(kind) as info:
            embed_request(ids=[1, 2], **v["options"])
        assert v["error"] in str(info.value)
        return
    req = embed_request(ids=[1, 2], **v["options"])
    assert list(req.token_ids.ids) == [1, 2]
    for key, want in v["request"].items():
        got = getattr(req, key)
        if key in ENUMS:
            got = ENUMS[key].Name(got)
        if key == "add_special_tokens":
            assert req.HasField("add_special_tokens")
        assert got == want, key


@pytest.mark.parametrize("v", entries("id_arrays"), ids=lambda v: json.dumps(v["input"]))
def test_id_arrays(v: dict[str, Any]) -> None:
    if "error" in v:
        with pytest.raises(ValueError) as info:
            embed_request(ids=v["input"])
        assert v["error"] in str(info.value)
    else:
        assert list(embed_request(ids=v["input"]).token_ids.ids) == v["ids"]


@pytest.mark.parametrize("v", entries("targets"), ids=lambda v: repr(v["input"]))
def test_targets(v: dict[str, Any], capsys: pytest.CaptureFixture[str]) -> None:
    assert VECTORS["target_form"] == TARGET_FORM
    assert is_target(v["input"]) is v["ok"]
    refusal = f"must be {TARGET_FORM}, got {v['input']!r}"
    if v["ok"]:
        assert build_parser().parse_args(["--target", v["input"], "models"]).target == \
            v["input"]
        assert parse_args(["models"], environ={"EMBED_TARGET": v["input"]}).target == \
            v["input"]
        return
    line = embedctl_error(["--target", v["input"], "models"], capsys)
    assert line == f"embedctl: error: argument --target: {refusal} (see --help)"
    with pytest.raises(SystemExit):
        parse_args(["models"], environ={"EMBED_TARGET": v["input"]})
    assert capsys.readouterr().err == f"embedctl: error: EMBED_TARGET: {refusal} (see --help)\n"

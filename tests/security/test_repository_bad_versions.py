"""Any malformed version is refused with one log line and skipped: the server starts with
the valid ones, and hot reload keeps working for every model, before and after the bad
entry in scan order."""

from __future__ import annotations

import logging
import math
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import grpc
import pytest
import torch

from genproto.embedding.v1 import embedding_pb2 as pb
from service.format.checkpoint import is_version_name, read_checkpoint
from service.format.manifest import EMBEDDINGS_FILE, MANIFEST_FILE
from service.format.tensorfile import CheckpointError, check_finite
from tests.security.shm_helpers import (
    IDS,
    As,
    edit_manifest,
    expected_rows,
    rewrite_entry,
    safetensors_with_header,
)
from tests.tiny_model import MakeCheckpoint, start

LOGGER = "service.engine.repository"


def _header_list(v: Path) -> None:
    rewrite_entry(v, EMBEDDINGS_FILE, safetensors_with_header([1, 2, 3]))


def _header_entry_list(v: Path) -> None:
    rewrite_entry(v, EMBEDDINGS_FILE, safetensors_with_header({"token_embedding": [1]}))


def _header_shape_strings(v: Path) -> None:
    rewrite_entry(v, EMBEDDINGS_FILE, safetensors_with_header({"token_embedding": {
        "dtype": "F32", "shape": ["50304", "16"], "data_offsets": [0, 16]}}, b"\0" * 16))


def _manifest_types(v: Path) -> None:
    edit_manifest(v, lambda m: m.__setitem__("dim", "16"))


def _manifest_bool(v: Path) -> None:
    edit_manifest(v, lambda m: m.__setitem__("max_seq_len", True))


def _manifest_list(v: Path) -> None:
    (v / MANIFEST_FILE).write_text("[]")


def _files_not_a_dict(v: Path) -> None:
    edit_manifest(v, lambda m: m.__setitem__("files", ["embeddings.safetensors"]))


def _missing_file(v: Path) -> None:
    (v / EMBEDDINGS_FILE).unlink()


def _extra_file(v: Path) -> None:
    (v / "notes.txt").write_text("not in the manifest\n")


def _huge_sinusoidal(v: Path) -> None:
    def change(m: dict[str, Any]) -> None:
        m["position"], m["max_seq_len"] = "sinusoidal", 1 << 30  # 2**34 elements to compute
    edit_manifest(v, change)


def _nan_table(v: Path) -> None:
    _set_table_value(v, math.nan)


def _inf_table(v: Path) -> None:
    _set_table_value(v, -math.inf)


def _set_table_value(v: Path, value: float) -> None:
    from safetensors.torch import load_file, save_file
    tables = load_file(str(v / EMBEDDINGS_FILE))
    tables["token_embedding"][123, 4] = value
    save_file(tables, str(v / "x"))
    data = (v / "x").read_bytes()
    (v / "x").unlink()
    rewrite_entry(v, EMBEDDINGS_FILE, data)


BREAKERS: dict[str, Callable[[Path], None]] = {
    "header_list": _header_list, "header_entry_list": _header_entry_list,
    "header_shape_strings": _header_shape_strings, "manifest_types": _manifest_types,
    "manifest_bool": _manifest_bool, "manifest_list": _manifest_list,
    "files_not_a_dict": _files_not_a_dict, "missing_file": _missing_file,
    "extra_file": _extra_file, "huge_sinusoidal": _huge_sinusoidal, "nan_table": _nan_table,
    "inf_table": _inf_table,
}


@pytest.mark.parametrize("breaker", sorted(BREAKERS))
def test_read_checkpoint_refuses_with_checkpoint_error(
        tmp_path: Path, make_checkpoint: MakeCheckpoint, breaker: str) -> None:
    v = make_checkpoint(tmp_path, "m", 1)
    BREAKERS[breaker](v)
    if breaker == "huge_sinusoidal":  # the manifest is fine; the repository bounds it
        return
    with pytest.raises(CheckpointError):
        read_checkpoint(v)


def test_bad_versions_are_skipped_and_hot_reload_keeps_working(
        tmp_path: Path, make_checkpoint: MakeCheckpoint,
        caplog: pytest.LogCaptureFixture) -> None:
    repo = tmp_path / "models"
    # "a": a good v1, then a "²" folder and newer bad versions of every kind on top.
    make_checkpoint(repo, "a", 1, seed=0)
    (repo / "a" / "²").mkdir()
    (repo / "a" / "01").mkdir()
    for i, name in enumerate(sorted(BREAKERS), start=2):
        BREAKERS[name](make_checkpoint(repo, "a", i, seed=i))
    newest_bad = len(BREAKERS) + 1
    # "b" sorts after "a" and is good; "c" has only a bad version.
    make_checkpoint(repo, "b", 1, seed=5)
    _header_list(make_checkpoint(repo, "c", 1, seed=6))
    shutil.rmtree(repo / ".scratch", ignore_errors=True)

    with caplog.at_level(logging.INFO, logger=LOGGER), \
            start(repo, default_model="a") as handle, As.at(handle.target) as client:
        assert client.embed() == expected_rows(IDS, seed=0)  # a/1 serves
        b = client("native", "Embed", pb.EmbedRequest(model="b", token_ids=pb.TokenIds(ids=IDS)))
        assert b.embeddings.data == expected_rows(IDS, seed=5)
        assert client.status("native", "GetModelInfo", pb.GetModelInfoRequest(model="c"))[0] \
            == grpc.StatusCode.NOT_FOUND
        lines = [r.getMessage() for r in caplog.records if r.name == LOGGER]
        for version in range(2, newest_bad + 1):  # one line per bad version, one line each
            assert sum(f"refused model=a version={version}:" in m for m in lines) == 1, version
        assert all("\n" not in m for m in lines)
        assert sum("refused model=c version=1:" in m for m in lines) == 1
        assert sum("²" in m or "\\xb2" in m for m in lines) == 1
        assert sum("/a/01" in m for m in lines) == 1

        # Hot reload still works: a newer good version of "a", a new version of "c", and
        # a new model; each bad one is not retried (no new lines).
        make_checkpoint(repo, "a", newest_bad + 1, seed=1)
        make_checkpoint(repo, "c", 2, seed=7)
        make_checkpoint(repo, "z", 1, seed=8)
        (repo / "b" / "³").mkdir()
        caplog.clear()
        handle.refresh()
        handle.refresh()
        assert client.embed() == expected_rows(IDS, seed=1)
        for model, seed in (("c", 7), ("z", 8)):
            got = client("native", "Embed", pb.EmbedRequest(model=model,
                                                            token_ids=pb.TokenIds(ids=IDS)))
            assert got.embeddings.data == expected_rows(IDS, seed=seed)
        lines = [r.getMessage() for r in caplog.records if r.name == LOGGER]
        assert not [m for m in lines if m.startswith("refused")]
        assert sum("ignored" in m for m in lines) == 1  # the "³" folder, once

        # A bad version appearing above what serves is refused and the served one stays.
        (bad := make_checkpoint(repo, "z", 2, seed=9))
        _header_list(bad)
        handle.refresh()
        got = client("native", "Embed", pb.EmbedRequest(model="z", token_ids=pb.TokenIds(ids=IDS)))
        assert got.embeddings.data == expected_rows(IDS, seed=8)


def test_scan_survives_an_unlistable_model_folder(tmp_path: Path,
                                                  make_checkpoint: MakeCheckpoint) -> None:
    repo = tmp_path / "models"
    make_checkpoint(repo, "good", 1)
    locked = repo / "aaa-locked"
    locked.mkdir()
    locked.chmod(0)
    try:
        if not _unreadable(locked):  # root reads anything: make listing fail another way
            locked.chmod(0o755)
            locked.rmdir()
            locked.write_bytes(b"")  # a file where a model folder would be: skipped
        with start(repo, default_model="good") as handle, As.at(handle.target) as client:
            assert client.embed() == expected_rows(IDS)
    finally:
        if locked.is_dir():
            locked.chmod(0o755)


def _unreadable(path: Path) -> bool:
    try:
        list(path.iterdir())
    except PermissionError:
        return True
    return False


def test_version_folder_names() -> None:
    assert [n for n in ("1", "2", "10", "123456789012345678") if is_version_name(n)] == \
        ["1", "2", "10", "123456789012345678"]
    assert not [n for n in ("0", "01", "²", "١", "1" * 5000, "-1", "+1", " 1", "1.0", "")
                if is_version_name(n)]


def test_nan_check_is_cheap_and_exact() -> None:
    table = torch.randn(1000, 16)
    check_finite("f", "t", table)
    for bad in (math.nan, math.inf, -math.inf):
        t = table.clone()
        t[999, 15] = bad
        with pytest.raises(CheckpointError, match="NaN or Inf"):
            check_finite("f", "t", t)
        with pytest.raises(CheckpointError, match="NaN or Inf"):
            check_finite("f", "t", t.to(torch.bfloat16))

"""A checkpoint file truncated or rewritten in place while it is served can neither crash
the server nor change the rows it serves: the tables are private memory, read once and
hashed over exactly the bytes served (the hash's refusals: tests/service/format/
test_checkpoint.py)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from genproto.embedding.v1 import embedding_pb2 as pb
from service.format.checkpoint import read_checkpoint
from service.format.manifest import EMBEDDINGS_FILE, ROW_UPDATES_FILE
from tests.security.shm_helpers import IDS, As, expected_rows
from tests.tiny_model import TABLE_ROWS, MakeCheckpoint, start

SPREAD = [0, 1, 4095, 4096, 20000, 50256]  # rows on many pages of the table


@pytest.mark.parametrize("how", ["truncate", "rewrite", "unlink"])
def test_served_rows_survive_the_file_changing(tmp_path: Path, make_checkpoint: MakeCheckpoint,
                                               how: str) -> None:
    repo = tmp_path / "models"
    version = make_checkpoint(repo, "tiny", 1)
    path = version / EMBEDDINGS_FILE
    with start(repo) as handle, As.at(handle.target) as client:
        before = client.embed(SPREAD)
        assert before == expected_rows(SPREAD)
        if how == "truncate":
            os.truncate(path, 100)  # in place: the same inode, now 100 bytes
        elif how == "rewrite":
            size = path.stat().st_size
            with path.open("r+b") as f:  # in place: every byte after the header changed
                f.seek(4096)
                f.write(b"\x7f" * (size - 4096))
        else:
            path.unlink()
        for ids in (SPREAD, IDS, list(range(TABLE_ROWS - 64, TABLE_ROWS - 47))):
            ids = [i for i in ids if i < 50257]
            assert client.embed(ids) == expected_rows(ids)
        info = client("native", "GetModelInfo", pb.GetModelInfoRequest())
        assert info.version == 1
        handle.refresh()  # a rescan does not reload (or drop) the version being served
        assert client.embed(SPREAD) == before


def test_tables_are_private_memory_not_a_map_of_the_file(
        tmp_path: Path, make_checkpoint: MakeCheckpoint) -> None:
    version = make_checkpoint(tmp_path, "tiny", 1)
    ckpt = read_checkpoint(version)
    maps = Path(f"/proc/{os.getpid()}/maps").read_text()
    assert str(version / EMBEDDINGS_FILE) not in maps
    assert str(version / ROW_UPDATES_FILE) not in maps
    assert ckpt.token_table.shape == (TABLE_ROWS, 16)

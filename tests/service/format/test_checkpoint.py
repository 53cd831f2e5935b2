"""The checkpoint format: round trip, hashes, atomicity, validation."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from service.format.checkpoint import list_versions, read_checkpoint, verify_checkpoint
from service.format.manifest import EMBEDDINGS_FILE, MANIFEST_FILE, ROW_UPDATES_FILE, Manifest
from service.format.tensorfile import CheckpointError, read_safetensors
from service.format.tokenizer import GPT2_RANKS_SHA256, gpt2_spec
from service.format.writer import next_version, write_checkpoint
from tests.tiny_model import DIM, MAX_SEQ_LEN, TABLE_ROWS, VOCAB_SIZE, MakeCheckpoint, tiny_tables


def test_round_trip_is_bit_exact(tmp_path: Path, make_checkpoint: MakeCheckpoint) -> None:
    version_dir = make_checkpoint(tmp_path)
    token_table, position_table = tiny_tables(0)
    ckpt = read_checkpoint(version_dir)
    assert torch.equal(ckpt.token_table, token_table)
    assert torch.equal(ckpt.position_table, position_table)
    assert ckpt.token_table.shape == (TABLE_ROWS, DIM)
    assert ckpt.row_updates is not None
    assert int(ckpt.row_updates.sum()) == 7 * 1000
    m = ckpt.manifest
    assert (m.vocab_size, m.table_rows, m.dim, m.max_seq_len) == (VOCAB_SIZE, TABLE_ROWS, DIM,
                                                                   MAX_SEQ_LEN)
    assert m.tokenizer.sha256 == GPT2_RANKS_SHA256
    assert sorted(m.files) == ["embeddings.safetensors", "row_updates.safetensors",
                               "tokenizer.tiktoken"]


def test_mmap_reader_agrees_with_reference_loader(tmp_path: Path,
                                                  make_checkpoint: MakeCheckpoint) -> None:
    path = make_checkpoint(tmp_path) / EMBEDDINGS_FILE
    ours, reference = read_safetensors(path), load_file(str(path))
    assert sorted(ours) == sorted(reference) == ["position_embedding", "token_embedding"]
    for name in ours:
        assert torch.equal(ours[name], reference[name])


def test_checkpoint_id_is_sha256_of_manifest(tmp_path: Path,
                                             make_checkpoint: MakeCheckpoint) -> None:
    import hashlib

    version_dir = make_checkpoint(tmp_path)
    _, checkpoint_id = verify_checkpoint(version_dir)
    assert checkpoint_id == hashlib.sha256((version_dir / MANIFEST_FILE).read_bytes()).hexdigest()


def test_one_changed_byte_is_refused_naming_the_file(tmp_path: Path,
                                                      make_checkpoint: MakeCheckpoint) -> None:
    """The hash is computed over the very bytes that are kept: one changed byte of any
    table's file refuses the version; the byte put back, it loads again."""
    version_dir = make_checkpoint(tmp_path)
    read_checkpoint(version_dir)
    for name in (EMBEDDINGS_FILE, ROW_UPDATES_FILE):
        path = version_dir / name
        data = bytearray(path.read_bytes())
        data[-1] ^= 0x01
        path.write_bytes(bytes(data))
        with pytest.raises(CheckpointError, match=f"{re.escape(name)}: sha256 .* does not match"):
            read_checkpoint(version_dir)
        data[-1] ^= 0x01
        path.write_bytes(bytes(data))
    read_checkpoint(version_dir)


def test_versions_are_immutable_and_written_atomically(tmp_path: Path,
                                                       make_checkpoint: MakeCheckpoint) -> None:
    make_checkpoint(tmp_path)
    with pytest.raises(FileExistsError):
        make_checkpoint(tmp_path)
    # No temporary directory is left behind, and temp names never count as versions.
    assert sorted(p.name for p in (tmp_path / "tiny").iterdir()) == ["1"]
    (tmp_path / "tiny" / ".2.tmp-abc").mkdir()
    assert list_versions(tmp_path / "tiny") == [1]
    assert next_version(tmp_path / "tiny") == 2
    assert next_version(tmp_path / "new") == 1


def test_failed_write_leaves_nothing(tmp_path: Path, gpt2_ranks: Path) -> None:
    token_table, _ = tiny_tables(0)
    with pytest.raises(FileNotFoundError):
        write_checkpoint(tmp_path / "m" / "1", token_table=token_table, position="none",
                         max_seq_len=8, vocab_size=VOCAB_SIZE, tokenizer_spec=gpt2_spec(),
                         tokenizer_ranks=tmp_path / "missing.tiktoken")
    assert list((tmp_path / "m").iterdir()) == []


def test_writer_refuses_inconsistent_tables(tmp_path: Path, gpt2_ranks: Path) -> None:
    token_table, _position_table = tiny_tables(0)
    common = {"tokenizer_spec": gpt2_spec(), "tokenizer_ranks": gpt2_ranks,
              "max_seq_len": MAX_SEQ_LEN}
    with pytest.raises(ValueError, match="rows < vocab_size"):
        write_checkpoint(tmp_path / "a" / "1", token_table=token_table[:100], position="none",
                         vocab_size=VOCAB_SIZE, **common)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="required exactly when"):
        write_checkpoint(tmp_path / "b" / "1", token_table=token_table, position="learned",
                         vocab_size=VOCAB_SIZE, **common)  # type: ignore[arg-type]


@pytest.mark.parametrize(("field", "value", "message"), [
    ("format", "other/9", "format 'other/9'"),
    ("position", "alibi", "position 'alibi'"),
    ("vocab_size", 60000, "vocab_size <= table_rows"),
])
def test_manifest_validation(tmp_path: Path, make_checkpoint: MakeCheckpoint, field: str,
                             value: object, message: str) -> None:
    raw = json.loads((make_checkpoint(tmp_path) / MANIFEST_FILE).read_bytes())
    raw[field] = value
    with pytest.raises(CheckpointError, match=message):
        Manifest.from_json(json.dumps(raw).encode())

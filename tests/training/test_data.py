"""Corpus -> shard: exact tokens, document separators, cache reuse, train/val split."""

from __future__ import annotations

import json
import os
import stat
from pathlib import Path

import numpy as np
import pytest

from service.format.tokenizer import Tokenizer
from tests.training.conftest import corpus_text
from training.data import default_corpus_text, iter_blocks, load_tokens, resolve_sources
from training.errors import UsageError

EOT = 50256


def test_cutting_blocks_changes_no_token(tokenizer: Tokenizer) -> None:
    text = default_corpus_text()[:60_000]
    blocks = list(iter_blocks(iter([iter([text[:7_000], text[7_000:]])]), block_chars=997))
    assert len(blocks) > 50
    assert "".join(b for b, _ in blocks) == text
    assert [ends for _, ends in blocks].count(True) == 1
    ids = [i for ids in tokenizer.encode_batch([b for b, _ in blocks]) for i in ids]
    assert ids == tokenizer.encode(text)


def test_files_dirs_globs_and_jsonl(tmp_path: Path, tokenizer: Tokenizer) -> None:
    (tmp_path / "d").mkdir()
    (tmp_path / "d" / "a.txt").write_text("Hello world.\n")
    (tmp_path / "d" / "b.txt").write_text("Second file")
    (tmp_path / "x.jsonl").write_text(
        json.dumps({"text": "one"}) + "\n\n" + json.dumps({"text": " two", "id": 2}) + "\n")
    assert [p.name for p in resolve_sources([str(tmp_path / "d"), str(tmp_path / "*.jsonl"),
                                             str(tmp_path / "d" / "a.txt")])] == [
        "a.txt", "b.txt", "x.jsonl"]
    data = load_tokens([str(tmp_path / "d"), str(tmp_path / "x.jsonl")], tokenizer,
                       tmp_path / "cache", val_fraction=0.25, progress=False)
    want = [*tokenizer.encode("Hello world.\n"), EOT, *tokenizer.encode("Second file"),
            EOT, *tokenizer.encode("one"), EOT, *tokenizer.encode(" two")]
    assert np.concatenate([data.train, data.val]).tolist() == want
    assert len(data.train) == int(len(want) * 0.75)
    assert data.train.dtype == np.uint16
    assert data.path.stat().st_size == 2 * len(want)


def test_jsonl_without_text_is_an_error(tmp_path: Path, tokenizer: Tokenizer) -> None:
    (tmp_path / "bad.jsonl").write_text('{"body": "x"}\n')
    with pytest.raises(ValueError, match=r"bad.jsonl:1: need a JSON object with a 'text'"):
        load_tokens([str(tmp_path / "bad.jsonl")], tokenizer, tmp_path / "c", 0.1,
                    progress=False)


def test_missing_input_is_an_error(tmp_path: Path) -> None:
    with pytest.raises(UsageError, match=r"nope\.txt: no such file or directory"):
        resolve_sources([str(tmp_path / "nope.txt")])


def test_cache_is_keyed_by_content(tmp_path: Path, tokenizer: Tokenizer) -> None:
    src = tmp_path / "c.txt"
    src.write_text(corpus_text(50))
    first = load_tokens([str(src)], tokenizer, tmp_path / "cache", 0.1, progress=False)
    again = load_tokens([str(src)], tokenizer, tmp_path / "cache", 0.1, progress=False)
    assert (first.reused, again.reused) == (False, True)
    assert again.path == first.path
    assert first.path.parent.name == first.corpus_sha256
    copy = tmp_path / "renamed.txt"  # same bytes, other name: same shard
    copy.write_bytes(src.read_bytes())
    assert load_tokens([str(copy)], tokenizer, tmp_path / "cache", 0.1,
                       progress=False).path == first.path
    src.write_text(corpus_text(51))
    changed = load_tokens([str(src)], tokenizer, tmp_path / "cache", 0.1, progress=False)
    assert changed.reused is False
    assert changed.corpus_sha256 != first.corpus_sha256
    assert len(list((tmp_path / "cache").iterdir())) == 2  # no temp dirs left behind


def test_default_corpus_is_pydoc_topics(tmp_path: Path, tokenizer: Tokenizer) -> None:
    data = load_tokens([], tokenizer, tmp_path / "cache", 0.1, progress=False)
    n = len(data.train) + len(data.val)
    assert n == len(tokenizer.encode(default_corpus_text()))
    assert len(data.train) == int(n * 0.9)


def test_text_without_whitespace_is_still_cut(tokenizer: Tokenizer) -> None:
    text = "x" * 5_000  # no safe cut point anywhere: memory must stay bounded anyway
    blocks = list(iter_blocks(iter([iter([text])]), block_chars=100))
    assert [len(b) for b, _ in blocks] == [100] * 35 + [1_500]  # never over 16 blocks
    assert "".join(b for b, _ in blocks) == text


def test_many_small_jobs_keep_order(tmp_path: Path, tokenizer: Tokenizer,
                                    monkeypatch: pytest.MonkeyPatch) -> None:
    # Tiny blocks and jobs: ~100 jobs through the thread pool, more than can be in flight.
    monkeypatch.setattr("training.data._BLOCK_CHARS", 64)
    monkeypatch.setattr("training.data._JOB_CHARS", 200)
    text = corpus_text(120)
    docs = [f"Document {i}: " + corpus_text(i % 5 + 1) for i in range(40)]
    (tmp_path / "a.txt").write_text(text)
    (tmp_path / "b.jsonl").write_text("".join(json.dumps({"text": d}) + "\n" for d in docs))
    data = load_tokens([str(tmp_path / "a.txt"), str(tmp_path / "b.jsonl")], tokenizer,
                       tmp_path / "cache", 0.1, progress=False)
    want = tokenizer.encode(text)
    for d in docs:
        want += [EOT, *tokenizer.encode(d)]
    assert np.concatenate([data.train, data.val]).tolist() == want


def test_the_cached_shard_gets_the_usual_modes(tmp_path: Path, tokenizer: Tokenizer) -> None:
    """Its directory is made by mkdtemp and renamed into place: 0777 less the umask, like
    any directory (it was mkdtemp's 0700)."""
    (tmp_path / "c.txt").write_text(corpus_text())
    old = os.umask(0o022)
    try:
        data = load_tokens([str(tmp_path / "c.txt")], tokenizer, tmp_path / "cache", 0.1,
                           progress=False)
    finally:
        os.umask(old)
    assert stat.S_IMODE(data.path.parent.stat().st_mode) == 0o755
    assert {p.name: stat.S_IMODE(p.stat().st_mode) for p in data.path.parent.iterdir()} == {
        "tokens.bin": 0o644, "meta.json": 0o644}

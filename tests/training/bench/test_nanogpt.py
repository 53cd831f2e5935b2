"""The nanogpt preset's parts that need no nanoGPT: locating it, its log format, the corpus."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from training.bench import nanogpt
from training.data import default_corpus_ids


def test_missing_checkout_says_how_to_place_it(tmp_path: Path,
                                               monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("NANOGPT_DIR", str(tmp_path / "absent"))
    with pytest.raises(SystemExit) as err:
        nanogpt.nanogpt_dir()
    text = str(err.value)
    assert f"nanoGPT not found at {tmp_path / 'absent'} (no train.py)" in text
    assert f"checkout {nanogpt.NANOGPT_COMMIT}" in text
    (tmp_path / "train.py").write_text("")
    monkeypatch.setenv("NANOGPT_DIR", str(tmp_path))
    assert nanogpt.nanogpt_dir() == tmp_path


def test_iteration_lines_are_parsed() -> None:
    log = ("step 0: train loss 10.9, val loss 10.9\n"
           "iter 0: loss 10.9512, time 5646.10ms, mfu -100.00%\n"
           "iter 1: loss 10.8000, time 812.50ms, mfu -100.00%\n")
    assert nanogpt._ITER.findall(log) == [("0", "5646.10"), ("1", "812.50")]


def test_corpus_is_the_projects_split_in_uint16(tmp_path: Path) -> None:
    assert nanogpt._write_corpus(tmp_path) == "embed_pydoc"
    ids = np.asarray(default_corpus_ids(), dtype=np.uint16)
    train = np.fromfile(tmp_path / "data/embed_pydoc/train.bin", dtype=np.uint16)
    val = np.fromfile(tmp_path / "data/embed_pydoc/val.bin", dtype=np.uint16)
    assert len(train) == 125_113
    assert len(val) == 13_902
    assert np.array_equal(np.concatenate([train, val]), ids)

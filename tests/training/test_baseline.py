"""The unigram baseline on hand-made splits: exact values."""

from __future__ import annotations

import math

import numpy as np
import pytest

from training.baseline import unigram_cross_entropy


def test_add_one_smoothing_exact() -> None:
    # train counts over V=3: [2, 1, 0], N=3 -> p = [3/6, 2/6, 1/6]
    train = np.array([0, 0, 1], dtype=np.uint16)
    val = np.array([0, 2], dtype=np.uint16)
    got = unigram_cross_entropy(train, val, vocab_size=3)
    assert got == pytest.approx((math.log(2) + math.log(6)) / 2, rel=1e-15)
    assert got == pytest.approx(math.log(12) / 2, rel=1e-15)


def test_unseen_val_token_costs_log_of_n_plus_v() -> None:
    train = np.array([1, 1, 1, 1], dtype=np.uint16)
    got = unigram_cross_entropy(train, np.array([4], dtype=np.uint16), vocab_size=6)
    assert got == pytest.approx(math.log(10), rel=1e-15)


def test_id_past_vocab_is_refused() -> None:
    with pytest.raises(ValueError, match="vocab_size 3"):
        unigram_cross_entropy(np.array([3]), np.array([0]), vocab_size=3)

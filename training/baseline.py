"""The unigram baseline: what a model that ignores context scores on the val split.

A language model must beat it to have learned anything from context. The distribution is
fit on the train split with add-one (Laplace) smoothing over the whole vocabulary, so a
val token never seen in training still has a finite cost.
"""

from __future__ import annotations

import math

import numpy as np

__all__ = ["unigram_cross_entropy"]


def unigram_cross_entropy(train: np.ndarray, val: np.ndarray, vocab_size: int) -> float:
    """Mean -ln p(val token), p(v) = (count_train(v) + 1) / (N_train + vocab_size); nats."""
    counts = np.bincount(np.asarray(train, dtype=np.int64), minlength=vocab_size)
    if counts.size > vocab_size:
        raise ValueError(f"train has ids >= vocab_size {vocab_size}")
    log_p = np.log(counts + 1.0) - math.log(len(train) + vocab_size)  # (vocab_size,)
    return float(-log_p[np.asarray(val, dtype=np.int64)].mean())

"""Fixtures for the training job: the real tokenizer, a small corpus, a tiny config."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from service.format.tokenizer import Tokenizer, default_ranks_path, gpt2_spec, load_tokenizer
from training.config import TrainConfig

MakeConfig = Callable[..., TrainConfig]

# ~3k GPT-2 tokens of varied, repetitive English: a tiny model learns it within 20 steps.
_ANIMALS = ["cat", "dog", "bird", "fish", "horse", "mouse", "sheep", "goat"]
_PLACES = ["garden", "house", "river", "field", "forest", "barn"]


def corpus_text(lines: int = 300) -> str:
    """Deterministic sentences: the same few patterns with rotating words."""
    out = []
    for i in range(lines):
        a, p = _ANIMALS[i % len(_ANIMALS)], _PLACES[(i * 7) % len(_PLACES)]
        out.append(f"The {a} walks to the {p}. The {a} sleeps in the {p} at night.")
    return "\n".join(out) + "\n"


@pytest.fixture(scope="session")
def tokenizer() -> Tokenizer:
    """GPT-2 from the ranks file on disk (never tiktoken's downloading registry)."""
    return load_tokenizer(gpt2_spec(), default_ranks_path())


@pytest.fixture
def corpus_file(tmp_path: Path) -> Path:
    """A small text corpus on disk."""
    path = tmp_path / "corpus.txt"
    path.write_text(corpus_text())
    return path


@pytest.fixture
def make_config(tmp_path: Path, corpus_file: Path) -> MakeConfig:
    """A tiny config (C=16, 1 layer, T=16): ~20 steps take about a second on 2 cores."""

    def make(**overrides: Any) -> TrainConfig:
        base = TrainConfig(
            data=(str(corpus_file),), n_layer=1, n_head=2, n_embd=16, block_size=16,
            batch_size=4, max_steps=20, warmup_steps=2, lr=1e-2, eval_every=10,
            eval_tokens=512, seed=7, device="cpu", threads=1,
            cache_dir=str(tmp_path / "cache"), out_repository=str(tmp_path / "models"),
            runs_dir=str(tmp_path / "runs"), progress=False)
        return dataclasses.replace(base, **overrides)

    return make

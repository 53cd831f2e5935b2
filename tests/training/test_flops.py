"""One flops_per_token for every MFU figure: the head's matmul counts once, tied or not; the
input tables' gathers never."""

from __future__ import annotations

import pytest

from training.model import GPT, ModelConfig, flops_per_token, matmul_params

_SHAPE = {"vocab_size": 100, "table_rows": 128, "block_size": 16, "n_layer": 2, "n_head": 2,
          "n_embd": 8}


@pytest.mark.parametrize("position", ["learned", "sinusoidal", "none"])
def test_untied_counts_the_head_not_the_token_table(position: str) -> None:
    model = GPT(ModelConfig(**_SHAPE, position=position))
    total = sum(p.numel() for p in model.parameters())
    tables = sum(p.numel() for p in model.embedding_parameters())
    assert matmul_params(model) == total - tables
    C, L, T = 8, 2, 16
    assert flops_per_token(model) == 6 * (total - tables) + 12 * L * C * T


def test_tied_counts_the_shared_table_once_as_the_head() -> None:
    tied = GPT(ModelConfig(**_SHAPE, tie_weights=True))
    untied = GPT(ModelConfig(**_SHAPE))
    # Same matmuls either way: the head [table_rows, C] is one matmul whether or not it
    # shares its weight with the token table.
    assert matmul_params(tied) == matmul_params(untied)
    assert flops_per_token(tied) == flops_per_token(untied)
    assert matmul_params(tied) == sum(p.numel() for p in tied.parameters()) - 16 * 8  # - wpe

"""Sparse embeddings: a row absent from a step's inputs is bit-identical after that step."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
import torch

from service.format.tokenizer import Tokenizer
from tests.training.conftest import MakeConfig
from training.config import TrainConfig
from training.data import load_tokens
from training.model import GPT
from training.train import Batches, train


def _table_after(cfg: TrainConfig, tokenizer: Tokenizer, step: int) -> torch.Tensor:
    data = load_tokens(cfg.data, tokenizer, Path(cfg.cache_dir), cfg.val_fraction,
                       progress=False)
    result = train(dataclasses.replace(cfg, stop_at=step, name=f"{cfg.name}-{step}"),
                   tokenizer, data)
    assert result.step == step
    return result.model.wte.weight.detach().clone()


def _inputs_of_step(cfg: TrainConfig, tokenizer: Tokenizer, step: int) -> torch.Tensor:
    data = load_tokens(cfg.data, tokenizer, Path(cfg.cache_dir), cfg.val_fraction,
                       progress=False)
    replay = Batches(data.train, cfg.block_size, cfg.seed)
    for _ in range(step - 1):
        replay.draw(cfg.batch_size)
    return torch.unique(replay.draw(cfg.batch_size)[:, :-1])


@pytest.mark.parametrize("sparse", [True, False])
def test_rows_idle_in_a_step_do_not_move_in_it(make_config: MakeConfig, tokenizer: Tokenizer,
                                               sparse: bool) -> None:
    cfg = make_config(sparse_embeddings=sparse, max_steps=10, name=f"s{sparse}")
    before = _table_after(cfg, tokenizer, 5)
    after = _table_after(cfg, tokenizer, 6)
    used = torch.zeros(cfg.table_rows, dtype=torch.bool)
    used[_inputs_of_step(cfg, tokenizer, 6)] = True
    earlier = torch.zeros(cfg.table_rows, dtype=torch.bool)
    for s in range(1, 6):
        earlier[_inputs_of_step(cfg, tokenizer, s)] = True
    moved = (after != before).any(dim=1)  # (table_rows,)
    assert torch.equal(moved[used], torch.ones(int(used.sum()), dtype=torch.bool))
    idle_but_seen = earlier & ~used  # rows with Adam momentum from steps 1..5
    assert int(idle_but_seen.sum()) > 0
    if sparse:  # SparseAdam touches only the rows in this step's gradient
        assert torch.equal(moved, used)
    else:  # dense AdamW keeps moving them through momentum
        assert bool(moved[idle_but_seen].all())
        assert not bool(moved[~earlier & ~used].any())  # never-seen rows: still exact


def test_sparse_needs_untied_head(make_config: MakeConfig) -> None:
    with pytest.raises(ValueError, match="untied head"):
        make_config(sparse_embeddings=True, tie_weights=True)


@pytest.mark.parametrize(("tie", "rows"), [(True, 50304), (False, 8)])
def test_rows_with_gradient_in_one_step(tokenizer: Tokenizer, tie: bool, rows: int) -> None:
    torch.manual_seed(0)
    cfg = TrainConfig(n_layer=1, n_head=2, n_embd=16, block_size=16, tie_weights=tie)
    model = GPT(cfg.model_config(tokenizer.n_vocab))
    ids = torch.tensor([tokenizer.encode("The cat sat on the mat. " * 3)[:17]])  # (1, 17)
    _, loss = model(ids[:, :-1], ids[:, 1:])
    assert loss is not None
    loss.backward()
    grad = model.wte.weight.grad
    assert grad is not None
    rows_with_grad = int((grad != 0).any(dim=1).sum())
    assert rows_with_grad == rows  # tied: all table_rows, through the softmax
    assert len(set(ids[0, :-1].tolist())) == 8  # untied: just the distinct inputs

"""position "none" is RoPE: order matters inside attention, and the export has no table."""

from __future__ import annotations

from pathlib import Path

import torch

from service.format.checkpoint import read_checkpoint
from service.format.manifest import EMBEDDINGS_FILE, MODEL_FILE
from service.format.tensorfile import read_safetensors
from service.format.tokenizer import Tokenizer, default_ranks_path, gpt2_spec
from tests.training.conftest import MakeConfig
from training.data import load_tokens
from training.export import export_model
from training.model import GPT, CausalSelfAttention, ModelConfig
from training.train import train

TINY = ModelConfig(vocab_size=64, table_rows=64, block_size=8, n_layer=1, n_head=2,
                   n_embd=16, position="none")


def _model() -> GPT:
    """A random RoPE model whose attention is sharp enough for order to show in its output."""
    torch.manual_seed(0)
    model = GPT(TINY).eval()
    with torch.no_grad():
        # GPT-2's init (std 0.02) gives near-zero scores, i.e. near-uniform attention,
        # where any position encoding changes the output only in the 5th decimal.
        _attention(model).c_attn.weight.normal_(std=0.5)
    return model


def _attention(model: GPT) -> CausalSelfAttention:
    attn = model.blocks[0].attn
    assert isinstance(attn, CausalSelfAttention)
    return attn


def _without_positions(model: GPT) -> GPT:
    """The same weights with RoPE made the identity rotation (angle 0 at every position)."""
    assert isinstance(model.rope_cos, torch.Tensor)
    model.rope_cos = torch.ones_like(model.rope_cos)
    model.rope_sin = torch.zeros_like(model.rope_cos)
    return model


@torch.no_grad()
def _last_logits(model: GPT, ids: list[int]) -> torch.Tensor:
    logits, _ = model(torch.tensor([ids]))  # (1, T, table_rows)
    return logits[0, -1]  # (table_rows,)


def test_rope_model_has_no_position_parameters() -> None:
    model = _model()
    assert model.wpe is None
    assert not any("wpe" in name or "rope" in name for name, _ in model.named_parameters())
    assert not any("rope" in name for name in model.state_dict())  # recomputed, not saved
    assert model.input_embeddings(torch.tensor([[3, 5]])).equal(model.wte.weight[[3, 5]][None])


def test_swapping_earlier_tokens_changes_the_last_output() -> None:
    rope = _model()
    a = _last_logits(rope, [3, 5, 7, 11])
    b = _last_logits(rope, [5, 3, 7, 11])
    assert (a - b).abs().max() > 1e-3
    # Control: without any position information causal attention is a weighted sum over
    # a set, so the same swap cannot change the last output. The difference above is RoPE.
    flat = _without_positions(_model())
    torch.testing.assert_close(_last_logits(flat, [3, 5, 7, 11]),
                               _last_logits(flat, [5, 3, 7, 11]), rtol=0, atol=1e-6)


@torch.no_grad()
def test_attention_depends_on_relative_position_only() -> None:
    model = _model()
    assert isinstance(model.rope_cos, torch.Tensor)
    assert isinstance(model.rope_sin, torch.Tensor)
    cos, sin = model.rope_cos, model.rope_sin  # (block_size, hd/2)
    attn = _attention(model)
    x = torch.randn(1, 4, TINY.n_embd, generator=torch.Generator().manual_seed(1))  # (1, T, C)
    at_0 = attn(x, (cos, sin))  # positions 0..3
    at_4 = attn(x, (cos[4:], sin[4:]))  # the same tokens at positions 4..7
    torch.testing.assert_close(at_4, at_0, rtol=0, atol=1e-6)
    flat = attn(x, (torch.ones_like(cos), torch.zeros_like(sin)))
    assert (flat - at_0).abs().max() > 0.1 * at_0.abs().max()  # rotating changes the scores


def test_rope_export_has_no_position_table_and_reloads(make_config: MakeConfig,
                                                       tokenizer: Tokenizer) -> None:
    cfg = make_config(max_steps=2, eval_every=2, position="none")
    data = load_tokens(cfg.data, tokenizer, Path(cfg.cache_dir), cfg.val_fraction,
                       progress=False)
    result = train(cfg, tokenizer, data)
    version_dir, manifest = export_model(result, cfg, gpt2_spec(), default_ranks_path(),
                                         50257)
    assert manifest.position == "none"
    ckpt = read_checkpoint(version_dir)
    assert ckpt.position_table is None
    assert set(read_safetensors(version_dir / EMBEDDINGS_FILE)) == {"token_embedding"}
    rest = read_safetensors(version_dir / MODEL_FILE)
    assert not any("wpe" in k or "rope" in k for k in rest)
    # The checkpoint is the whole model: a fresh GPT loads it strictly and gives the same
    # logits, the rotations being recomputed from block_size and the head dimension.
    fresh = GPT(cfg.model_config(50257)).eval()
    fresh.load_state_dict({**rest, "wte.weight": ckpt.token_table.clone()}, strict=True)
    ids = torch.tensor([[262, 3797, 262, 318, 257]])
    with torch.no_grad():
        want, _ = result.model.eval()(ids)
        got, _ = fresh(ids)
    assert torch.equal(got, want)

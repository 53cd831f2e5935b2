"""The chunked linear cross-entropy against F.cross_entropy on materialised logits."""

from __future__ import annotations

import dataclasses
import math

import pytest
import torch
import torch.nn.functional as F

from tests.training.conftest import MakeConfig
from training.loss import linear_cross_entropy
from training.model import GPT

N, C, V = 50, 8, 97  # 50 rows: chunks of 16 leave a ragged last chunk of 2


def _inputs(seed: int = 0) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    hidden = torch.randn(N, C, generator=gen)  # (N, C)
    weight = 0.5 * torch.randn(V, C, generator=gen)  # (V, C)
    targets = torch.randint(0, V, (N,), generator=gen)  # (N,)
    return hidden, weight, targets


def _grads(fn: str, chunk: int = 16, scale: float = 1.0
           ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    hidden, weight, targets = _inputs()
    h, w = hidden.requires_grad_(), weight.requires_grad_()
    if fn == "reference":
        loss = F.cross_entropy(h @ w.t(), targets)  # (N, V) logits materialised
    else:
        loss = linear_cross_entropy(h, w, targets, chunk)
    (scale * loss).backward()
    assert h.grad is not None
    assert w.grad is not None
    return loss.detach(), h.grad, w.grad


@pytest.mark.parametrize("chunk", [1, 7, 16, 50, 64])
def test_matches_f_cross_entropy_to_float32_rounding(chunk: int) -> None:
    ref_loss, ref_h, ref_w = _grads("reference")
    loss, gh, gw = _grads("chunked", chunk)
    # Same per-row log-softmax kernel; only the order of sums differs: a few float32 ulps.
    torch.testing.assert_close(loss, ref_loss, rtol=1e-6, atol=0.0)
    torch.testing.assert_close(gh, ref_h, rtol=1e-5, atol=1e-8)
    torch.testing.assert_close(gw, ref_w, rtol=1e-5, atol=1e-8)


def test_float64_oracle() -> None:
    """The same maths in float64 (softmax - onehot) agrees to float32 precision."""
    hidden, weight, targets = (t.double() if t.is_floating_point() else t for t in _inputs())
    logits = hidden @ weight.t()  # (N, V) float64
    lse = torch.logsumexp(logits, dim=1)  # (N,)
    want_loss = (lse - logits.gather(1, targets[:, None])[:, 0]).mean()
    p = torch.softmax(logits, dim=1) - F.one_hot(targets, V)  # (N, V)
    want_h, want_w = p @ weight / N, p.t() @ hidden / N  # (N, C), (V, C)
    loss, gh, gw = _grads("chunked", 16)
    assert abs(float(loss) - float(want_loss)) < 2e-6 * float(want_loss)
    torch.testing.assert_close(gh.double(), want_h, rtol=1e-5, atol=1e-8)
    torch.testing.assert_close(gw.double(), want_w, rtol=1e-5, atol=1e-8)


def test_zero_hidden_gives_log_v_and_exact_gradients() -> None:
    """All logits 0: the loss is log(V); d/dh_i = (mean of W's rows - W[t_i]) / N."""
    _, weight, targets = _inputs()
    h = torch.zeros(N, C, requires_grad=True)
    loss = linear_cross_entropy(h, weight, targets, 16)
    loss.backward()
    assert float(loss.detach()) == pytest.approx(math.log(V), rel=1e-7)
    want = (weight.double().mean(0) - weight.double()[targets]) / N  # (N, C)
    assert h.grad is not None
    torch.testing.assert_close(h.grad.double(), want, rtol=1e-6, atol=1e-9)


def test_upstream_gradient_scales_both_gradients() -> None:
    _, gh1, gw1 = _grads("chunked", 16)
    _, gh3, gw3 = _grads("chunked", 16, scale=3.0)
    assert torch.equal(gh3, gh1 * 3.0)
    assert torch.equal(gw3, gw1 * 3.0)


def test_no_grad_path_gives_the_same_loss_bits() -> None:
    hidden, weight, targets = _inputs()
    with torch.no_grad():
        plain = linear_cross_entropy(hidden, weight, targets, 16)
    trained, _, _ = _grads("chunked", 16)
    assert torch.equal(plain, trained)


def test_bad_arguments() -> None:
    hidden, weight, targets = _inputs()
    with pytest.raises(ValueError, match="chunk"):
        linear_cross_entropy(hidden, weight, targets, 0)
    with pytest.raises(ValueError, match="want"):
        linear_cross_entropy(hidden, weight, targets[:-1], 16)


@pytest.mark.parametrize("tie", [True, False])
def test_model_gradients_match_the_full_logits_path(make_config: MakeConfig, tie: bool
                                                    ) -> None:
    """Whole model, tied or untied head: every parameter's gradient, loss_chunk 0 vs 5
    (both fp32: the bf16 head has its own bounds above)."""
    cfg = make_config(tie_weights=tie, head_precision="fp32")
    ids = torch.randint(0, 50257, (2, 17), generator=torch.Generator().manual_seed(1))
    grads = {}
    for chunk in (0, 5):
        torch.manual_seed(cfg.seed)
        model = GPT(dataclasses.replace(cfg, loss_chunk=chunk).model_config(50257))
        logits, loss = model(ids[:, :-1], ids[:, 1:])
        assert logits is None  # with targets the model returns only the loss
        assert loss is not None
        loss.backward()
        grads[chunk] = (loss.detach(), {n: p.grad for n, p in model.named_parameters()})
    torch.testing.assert_close(grads[5][0], grads[0][0], rtol=1e-6, atol=0.0)
    for name, g in grads[0][1].items():
        # Rounding differences of the head spread through the blocks; relative to each
        # gradient's largest entry they stay at float32 level (measured: <= 1e-5; a bias
        # whose true gradient is 0 shows large elementwise relative noise, hence this scale).
        err = float((grads[5][1][name] - g).abs().max())
        assert err <= 2e-5 * float(g.abs().max()), (name, err)


def test_bf16_head_is_fp32_within_bfloat16_rounding() -> None:
    """bf16 matmuls + softmax: loss and gradients within bf16's 2^-8 relative of the
    fp32 path, returned in fp32; without a gradient the loss is the fp32 path's, bit for bit."""
    hidden, weight, targets = _inputs()
    out = {}
    for precision in ("fp32", "bf16"):
        h, w = hidden.clone().requires_grad_(), weight.clone().requires_grad_()
        loss = linear_cross_entropy(h, w, targets, 16, precision)
        loss.backward()
        assert h.grad is not None
        assert w.grad is not None
        out[precision] = (loss.detach(), h.grad, w.grad)
        assert loss.dtype == h.grad.dtype == w.grad.dtype == w.dtype == torch.float32
    (l32, gh32, gw32), (l16, gh16, gw16) = out["fp32"], out["bf16"]
    eps = 2.0 ** -8
    assert abs(float(l16 - l32)) <= eps * float(l32)
    assert float((gh16 - gh32).norm()) <= 2 * eps * float(gh32.norm())
    assert float((gw16 - gw32).norm()) <= 2 * eps * float(gw32.norm())
    assert not torch.equal(gh16, gh32)  # the bf16 path really ran
    with torch.no_grad():
        ev16 = linear_cross_entropy(hidden, weight, targets, 16, "bf16")
        ev32 = linear_cross_entropy(hidden, weight, targets, 16, "fp32")
    assert torch.equal(ev16, ev32)


def test_bf16_head_needs_the_chunked_loss(make_config: MakeConfig) -> None:
    with pytest.raises(ValueError, match="needs the chunked loss"):
        make_config(loss_chunk=0, head_precision="bf16")
    with pytest.raises(ValueError, match="precision 'fp16' not in"):
        linear_cross_entropy(*_inputs(), 16, "fp16")

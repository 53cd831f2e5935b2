"""Training a tiny GPT for real: loss falls, row counts are exact, idle rows never move."""

from __future__ import annotations

import dataclasses
import os
import stat
from pathlib import Path

import numpy as np
import pytest
import torch

from service.format.tokenizer import Tokenizer
from tests.training.conftest import MakeConfig
from training.config import TrainConfig, compiler_available
from training.data import load_tokens
from training.loss import auto_head_precision, cpu_has_native_bf16
from training.model import GPT
from training.state import TrainerState, load_state, save_state
from training.train import Batches, TrainResult, train


def _run(cfg: TrainConfig, tokenizer: Tokenizer) -> TrainResult:
    data = load_tokens(cfg.data, tokenizer, Path(cfg.cache_dir), cfg.val_fraction,
                       progress=False)
    return train(cfg, tokenizer, data)


def _init_model(cfg: TrainConfig, tokenizer: Tokenizer) -> GPT:
    torch.manual_seed(cfg.seed)  # train() seeds the same way before building the model
    return GPT(cfg.model_config(tokenizer.n_vocab))


@pytest.fixture
def tiny_run(make_config: MakeConfig, tokenizer: Tokenizer) -> tuple[TrainConfig, TrainResult]:
    cfg = make_config()
    return cfg, _run(cfg, tokenizer)


def test_loss_falls(tiny_run: tuple[TrainConfig, TrainResult]) -> None:
    cfg, result = tiny_run
    losses = [h["train_loss"] for h in result.history]
    assert len(losses) == cfg.max_steps == result.step
    assert losses[0] == pytest.approx(np.log(cfg.table_rows), abs=0.3)  # uniform at init
    assert np.mean(losses[-5:]) < losses[0] - 2.0
    evals = [(h["step"], h["val_loss"]) for h in result.history if "val_loss" in h]
    assert [s for s, _ in evals] == [10, 20]
    assert evals[1][1] < evals[0][1] < np.log(cfg.table_rows) - 1.0
    assert result.val_loss == evals[1][1]
    assert result.tokens == cfg.max_steps * cfg.batch_size * cfg.block_size


def test_row_updates_count_steps_that_used_each_row(
        tiny_run: tuple[TrainConfig, TrainResult], tokenizer: Tokenizer) -> None:
    cfg, result = tiny_run
    data = load_tokens(cfg.data, tokenizer, Path(cfg.cache_dir), cfg.val_fraction,
                       progress=False)
    replay = Batches(data.train, cfg.block_size, cfg.seed)
    want = torch.zeros(cfg.table_rows, dtype=torch.int64)
    for _ in range(cfg.max_steps):
        xy = replay.draw(cfg.batch_size)
        for row in set(xy[:, :-1].flatten().tolist()):
            want[row] += 1
    assert torch.equal(result.row_updates, want)
    assert int(result.row_updates.max()) == cfg.max_steps  # " the" is in every batch
    assert int((result.row_updates > 0).sum()) == len(set(data.train.tolist()))


def test_untouched_rows_are_bit_identical_to_init(
        tiny_run: tuple[TrainConfig, TrainResult], tokenizer: Tokenizer) -> None:
    cfg, result = tiny_run
    init = _init_model(cfg, tokenizer).wte.weight.detach()
    trained = result.model.wte.weight.detach()
    idle = result.row_updates == 0
    used = ~idle
    assert int(idle.sum()) > 50_000  # the corpus uses a few dozen of 50304 rows
    assert torch.equal(trained[idle], init[idle])  # bit for bit, padding rows included
    assert not torch.equal(trained[used], init[used])
    assert (trained[used] != init[used]).any(dim=1).all()  # every used row moved


@pytest.mark.parametrize(("head", "blocks"), [("fp32", "fp32"), ("bf16", "fp32"),
                                             ("bf16", "bf16")])
def test_resume_is_exact(make_config: MakeConfig, tokenizer: Tokenizer, head: str,
                         blocks: str) -> None:
    precision = {"head_precision": head, "block_precision": blocks}
    full = _run(make_config(name="full", **precision), tokenizer)
    stopped = _run(make_config(name="split", stop_at=8, checkpoint_every=4, **precision),
                   tokenizer)
    assert stopped.step == 8
    resumed = _run(make_config(name="split", resume=True, **precision), tokenizer)
    assert resumed.step == 20
    assert resumed.history == full.history  # every loss, val loss and lr, exactly
    assert resumed.train_loss == full.train_loss
    assert torch.equal(resumed.row_updates, full.row_updates)
    for (name, a), b in zip(full.model.state_dict().items(),
                            resumed.model.state_dict().values()):
        assert torch.equal(a, b), name
        assert a.dtype == b.dtype == torch.float32, name  # fp32 master weights either way


def test_resume_if_present_starts_fresh_then_resumes_exactly(
        make_config: MakeConfig, tokenizer: Tokenizer) -> None:
    """The Kubernetes job's flag: no state -> step 0; a state -> from it, bit for bit."""
    full = _run(make_config(name="full-rip"), tokenizer)
    first = _run(make_config(name="rip", stop_at=8, checkpoint_every=4,
                             resume_if_present=True), tokenizer)
    assert first.step == 8
    assert first.history == full.history[:8]  # started at step 0: nothing was there
    resumed = _run(make_config(name="rip", resume_if_present=True), tokenizer)
    assert resumed.step == 20
    assert resumed.history == full.history
    for (name, a), b in zip(full.model.state_dict().items(),
                            resumed.model.state_dict().values()):
        assert torch.equal(a, b), name


def test_grad_accumulation_matches_one_big_batch(make_config: MakeConfig,
                                                 tokenizer: Tokenizer) -> None:
    # fp32 head: the bound is fp32 rounding (a bf16 head rounds each micro-batch's product)
    one = _run(make_config(name="one", max_steps=5, head_precision="fp32"), tokenizer)
    acc = _run(make_config(name="acc", max_steps=5, grad_accum=2, head_precision="fp32"),
               tokenizer)
    a = [h["train_loss"] for h in one.history]
    b = [h["train_loss"] for h in acc.history]
    assert b == pytest.approx(a, rel=1e-5)


def test_config_rejects_uneven_accumulation() -> None:
    with pytest.raises(ValueError, match="not divisible by --grad-accum 3"):
        dataclasses.replace(TrainConfig(), batch_size=8, grad_accum=3)


def test_the_state_records_the_head_precision_that_ran(
        tiny_run: tuple[TrainConfig, TrainResult]) -> None:
    """The default, auto, is resolved before the first step: the state (and so the
    export's provenance) names bf16 or fp32, what this CPU got."""
    cfg, result = tiny_run
    assert cfg.head_precision == "auto"
    assert result.state_file is not None
    recorded = load_state(result.state_file).config["head_precision"]
    assert recorded == auto_head_precision("cpu", cfg.loss_chunk)
    assert recorded == ("bf16" if cpu_has_native_bf16() else "fp32")


def test_compile_without_a_compiler_trains_eagerly_with_one_warning(
        make_config: MakeConfig, tokenizer: Tokenizer, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    """--compile where no C++ compiler is (the runtime image): the same run as without
    it, bit for bit, and one line saying so; nothing fails at the first step."""
    eager = _run(make_config(name="eager", max_steps=3), tokenizer)
    monkeypatch.delenv("CXX", raising=False)
    monkeypatch.delenv("CC", raising=False)
    monkeypatch.setattr("training.config.shutil.which", lambda name: None)
    fallback = _run(make_config(name="fallback", max_steps=3, compile=True), tokenizer)
    assert capsys.readouterr().err.count(
        "python -m training: warning: --compile: no compiler for torch.compile's code "
        "(g++ or c++ not found); training eagerly") == 1
    assert fallback.history == eager.history
    for (name, a), b in zip(eager.model.state_dict().items(),
                            fallback.model.state_dict().values()):
        assert torch.equal(a, b), name


@pytest.mark.slow
def test_a_compiled_run_resumes_exactly(make_config: MakeConfig, tokenizer: Tokenizer) -> None:
    """torch.compile (as long runs get it by default where a compiler is): stop at 8 and
    resume, every loss and weight equal to the uninterrupted compiled run."""
    if not compiler_available("cpu"):
        pytest.skip("no C++ compiler: --compile trains eagerly (tested above)")
    full = _run(make_config(name="full-c", compile=True), tokenizer)
    stopped = _run(make_config(name="split-c", stop_at=8, checkpoint_every=4, compile=True),
                   tokenizer)
    resumed = _run(make_config(name="split-c", resume=True, compile=True), tokenizer)
    assert (stopped.step, resumed.step) == (8, 20)
    assert load_state(resumed.state_file).config["compile"] is True  # type: ignore[arg-type]
    assert resumed.history == full.history
    for (name, a), b in zip(full.model.state_dict().items(),
                            resumed.model.state_dict().values()):
        assert torch.equal(a, b), name


def test_long_runs_compile_where_a_compiler_is(monkeypatch: pytest.MonkeyPatch) -> None:
    """The run-length rule, resolved as the run records it."""
    long, short = TrainConfig(max_steps=600), TrainConfig(max_steps=100)
    monkeypatch.setattr("training.config.shutil.which", lambda name: f"/usr/bin/{name}")
    assert long.resolved("cpu").compile is True
    assert short.resolved("cpu").compile is False
    assert dataclasses.replace(long, compile_min_steps=0).resolved("cpu").compile is False
    assert dataclasses.replace(short, compile=True).resolved("cpu").compile is True
    monkeypatch.setattr("training.config.shutil.which", lambda name: None)
    monkeypatch.delenv("CXX", raising=False)
    monkeypatch.delenv("CC", raising=False)
    assert long.resolved("cpu").compile is False  # no compiler: eager, recorded so


def test_the_trainer_state_gets_the_usual_mode(tmp_path: Path) -> None:
    """0666 less the umask, like any file the job writes (it was mkstemp's 0600)."""
    state = TrainerState(step=3, tokens=96, model={"w": torch.ones(2, 2)}, optimizers=[],
                         row_updates=torch.zeros(4, dtype=torch.int64),
                         batch_rng=torch.get_rng_state(), torch_rng=torch.get_rng_state(),
                         cuda_rng=None, corpus_sha256="0" * 64)
    path = tmp_path / "runs" / "r" / "state" / "trainer.pt"
    for mask, mode in ((0o022, 0o644), (0o077, 0o600)):
        old = os.umask(mask)
        try:
            save_state(path, state)
        finally:
            os.umask(old)
        assert stat.S_IMODE(path.stat().st_mode) == mode
        assert [p.name for p in path.parent.iterdir()] == ["trainer.pt"]
    assert load_state(path).step == 3

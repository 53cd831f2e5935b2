"""Export writes a version the server's reader accepts, with the tables the model trained."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from service.format.checkpoint import read_checkpoint
from service.format.manifest import MODEL_FILE
from service.format.positions import sinusoidal_table
from service.format.tensorfile import read_safetensors
from service.format.tokenizer import Tokenizer, default_ranks_path, gpt2_spec
from tests.training.conftest import MakeConfig
from training.config import TrainConfig
from training.data import load_tokens
from training.default_model import main as default_model_main
from training.export import export_model
from training.train import TrainResult, train

REPO_ROOT = Path(__file__).resolve().parents[2]


def _train(cfg: TrainConfig, tokenizer: Tokenizer) -> TrainResult:
    data = load_tokens(cfg.data, tokenizer, Path(cfg.cache_dir), cfg.val_fraction,
                       progress=False)
    return train(cfg, tokenizer, data)


def test_export_round_trips_through_read_checkpoint(make_config: MakeConfig,
                                                    tokenizer: Tokenizer) -> None:
    cfg = make_config(max_steps=6, eval_every=3)
    result = _train(cfg, tokenizer)
    version_dir, _ = export_model(result, cfg, gpt2_spec(), default_ranks_path(), 50257)
    assert version_dir == Path(cfg.out_repository) / "default" / "1"
    ckpt = read_checkpoint(version_dir)  # verifies every sha256
    m = ckpt.manifest
    assert (m.vocab_size, m.table_rows, m.dim, m.max_seq_len, m.position, m.dtype) == (
        50257, 50304, 16, 16, "learned", "float32")
    assert torch.equal(ckpt.token_table, result.model.wte.weight.detach())
    assert ckpt.position_table is not None
    assert torch.equal(ckpt.position_table, result.model.wpe.weight.detach())  # type: ignore[union-attr]
    assert ckpt.row_updates is not None
    assert torch.equal(ckpt.row_updates, result.row_updates)
    p = m.provenance
    assert p["source"] == "training"
    assert p["step"] == 6
    assert p["seed"] == 7
    assert p["tokens"] == 6 * 4 * 16
    assert p["val_loss"] == result.val_loss
    assert p["train_loss"] == result.train_loss
    assert p["unigram_val_loss"] == result.unigram_val_loss
    assert p["corpus_sha256"] == result.corpus_sha256
    assert len(p["corpus_sha256"]) == 64
    assert p["config"] == json.loads(json.dumps(cfg.to_dict()))
    rest = read_safetensors(version_dir / MODEL_FILE)
    want = {k for k in result.model.state_dict() if k not in ("wte.weight", "wpe.weight")}
    assert set(rest) == want
    assert "lm_head.weight" in rest
    assert torch.equal(rest["ln_f.weight"], result.model.ln_f.weight.detach())
    assert sorted(q.name for q in version_dir.iterdir()) == [
        "embeddings.safetensors", "manifest.json", "model.safetensors",
        "row_updates.safetensors", "tokenizer.tiktoken"]  # no trainer state in here
    again, _ = export_model(result, cfg, gpt2_spec(), default_ranks_path(), 50257)
    assert again.name == "2"


@pytest.mark.parametrize(("position", "tie"), [("sinusoidal", False), ("none", True)])
def test_computed_positions_export_no_table(make_config: MakeConfig, tokenizer: Tokenizer,
                                            position: str, tie: bool) -> None:
    cfg = make_config(max_steps=2, eval_every=2, position=position, tie_weights=tie)
    result = _train(cfg, tokenizer)
    assert result.model.wpe is None
    version_dir, _ = export_model(result, cfg, gpt2_spec(), default_ranks_path(), 50257)
    ckpt = read_checkpoint(version_dir)
    assert ckpt.manifest.position == position
    assert ckpt.position_table is None
    rest = read_safetensors(version_dir / MODEL_FILE)
    assert ("lm_head.weight" in rest) is (not tie)  # tied: the head is the token table
    if position == "sinusoidal":  # the model adds exactly what the server will compute
        ids = torch.tensor([[262, 3797, 262]])
        got = result.model.input_embeddings(ids)[0]  # (T, C)
        assert torch.equal(got, ckpt.token_table[ids[0]] + sinusoidal_table(16, 16)[:3])


def test_default_model_trains_only_when_repository_is_empty(
        tmp_path: Path, corpus_file: Path, capsys: pytest.CaptureFixture[str]) -> None:
    repo = tmp_path / "models"
    tiny = ["--data", str(corpus_file), "--n-layer", "1", "--n-embd", "16", "--n-head", "2",
            "--block-size", "16", "--batch-size", "2", "--max-steps", "2", "--threads", "1",
            "--eval-every", "2", "--no-progress", "--cache-dir", str(tmp_path / "cache"),
            "--runs-dir", str(tmp_path / "runs")]
    assert default_model_main(["--model-repository", str(repo), *tiny]) == 0
    assert read_checkpoint(repo / "default" / "1").manifest.provenance["step"] == 2
    capsys.readouterr()
    assert default_model_main(["--model-repository", str(repo), *tiny]) == 0
    assert capsys.readouterr().out == f"{repo / 'default' / '1'} present\n"
    assert not (repo / "default" / "2").exists()


def test_cli_end_to_end(tmp_path: Path, corpus_file: Path) -> None:
    out = subprocess.run(
        [sys.executable, "-m", "training", "--data", str(corpus_file), "--n-layer", "1",
         "--n-embd", "16", "--n-head", "2", "--block-size", "16", "--batch-size", "2",
         "--max-steps", "3", "--eval-every", "3", "--threads", "1", "--name", "cli",
         "--out-repository", str(tmp_path / "m"), "--runs-dir", str(tmp_path / "runs"),
         "--cache-dir", str(tmp_path / "cache")],
        cwd=REPO_ROOT, capture_output=True, text=True, timeout=120, check=True)
    assert "unigram baseline (val)" in out.stdout
    assert f"exported: {tmp_path / 'm' / 'cli' / '1'}" in out.stdout
    assert f"loss curve: {tmp_path / 'runs' / 'cli' / 'loss.png'}" in out.stdout
    assert (tmp_path / "runs" / "cli" / "loss.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert (tmp_path / "runs" / "cli" / "state" / "trainer.pt").is_file()
    assert "train: 100%" in out.stderr  # the tqdm bar

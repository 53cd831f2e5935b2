"""TrainConfig parsing: flags beat EMBED_TRAIN_* variables, which beat the defaults."""

from __future__ import annotations

import pytest

from training.config import TrainConfig, parse_config


def test_defaults() -> None:
    cfg = parse_config([], env={})
    assert cfg == TrainConfig()
    assert (cfg.n_layer, cfg.n_head, cfg.n_embd, cfg.block_size) == (2, 4, 128, 128)
    assert (cfg.table_rows, cfg.tie_weights, cfg.position) == (50304, False, "learned")
    assert cfg.data == ()


def test_flags_env_and_precedence() -> None:
    env = {"EMBED_TRAIN_MAX_STEPS": "7", "EMBED_TRAIN_N_EMBD": "64",
           "EMBED_TRAIN_TIE_WEIGHTS": "1", "EMBED_TRAIN_DATA": "a.txt:b/*.jsonl"}
    cfg = parse_config(["--n-embd", "32", "--lr", "0.5", "--position", "none"], env=env)
    assert (cfg.max_steps, cfg.n_embd, cfg.lr, cfg.position) == (7, 32, 0.5, "none")
    assert cfg.tie_weights is True
    assert cfg.data == ("a.txt", "b/*.jsonl")
    assert parse_config(["--no-tie-weights"], env=env).tie_weights is False


@pytest.mark.parametrize("argv", [["--position", "rotary"], ["--n-embd", "30"],
                                  ["--sparse-embeddings", "--tie-weights"],
                                  ["--batch-size", "6", "--grad-accum", "4"]])
def test_bad_values_exit_with_usage(argv: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exc:
        parse_config(argv, env={})
    assert exc.value.code == 2
    assert "python -m training: error:" in capsys.readouterr().err

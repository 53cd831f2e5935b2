"""TrainConfig parsing: flags beat EMBED_TRAIN_* variables, which beat the defaults."""

from __future__ import annotations

import pytest

from training.config import TrainConfig, parse_config
from training.loss import auto_head_precision, cpu_has_native_bf16

# /proc/cpuinfo excerpts: this project's CI CPU (AMD EPYC, AVX-512 BF16), a Sapphire Rapids
# core (AMX), and a Skylake server core (AVX-512 without bf16: emulated, slower).
EPYC = "processor\t: 0\nflags\t\t: fpu sse2 avx2 avx512f avx512bw avx512_bf16 vaes\n"
SPR = "flags\t\t: fpu avx512f avx512_fp16 amx_bf16 amx_tile amx_int8\n"
SKYLAKE = "flags\t\t: fpu sse2 avx2 avx512f avx512bw avx512vl\n"


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


def test_head_precision_auto_is_bf16_only_where_the_cpu_has_it() -> None:
    assert TrainConfig().head_precision == "auto"
    assert [cpu_has_native_bf16(c) for c in (EPYC, SPR, SKYLAKE, "")] == [
        True, True, False, False]
    assert auto_head_precision("cpu", 512, EPYC) == "bf16"
    assert auto_head_precision("cpu", 512, SPR) == "bf16"
    assert auto_head_precision("cpu", 512, SKYLAKE) == "fp32"
    assert auto_head_precision("cpu", 0, EPYC) == "fp32"  # full logits: no bf16 path
    assert auto_head_precision("cuda", 512, EPYC) == "fp32"  # CUDA autocasts the model
    cfg = parse_config(["--head-precision", "fp32", "--block-precision", "bf16"], env={})
    assert (cfg.head_precision, cfg.block_precision) == ("fp32", "bf16")
    assert cfg.resolved("cpu") is cfg  # nothing to resolve
    assert TrainConfig().resolved("cpu").head_precision == auto_head_precision("cpu", 512)


@pytest.mark.parametrize("argv", [["--position", "rotary"], ["--n-embd", "30"],
                                  ["--head-precision", "fp16"], ["--block-precision", "auto"],
                                  ["--sparse-embeddings", "--tie-weights"],
                                  ["--batch-size", "6", "--grad-accum", "4"]])
def test_bad_values_exit_with_usage(argv: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exc:
        parse_config(argv, env={})
    assert exc.value.code == 2
    assert "python -m training: error:" in capsys.readouterr().err

"""training.importers: real HF / nanoGPT saves in, real checkpoints out, read back bit for bit."""

from __future__ import annotations

import hashlib
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import torch
import transformers  # in requirements-dev.txt: missing is an error, never a skip
from safetensors.torch import save_file

from service.format.checkpoint import read_checkpoint
from service.format.tokenizer import GPT2_PAT_STR, default_ranks_path, load_tokenizer
from training.importers import main

REPO_ROOT = Path(__file__).resolve().parents[3]
GPT2_VOCAB = 50257


def _sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _gpt2_config(vocab_size: int = GPT2_VOCAB) -> Any:
    return transformers.GPT2Config(vocab_size=vocab_size, n_embd=8, n_layer=1, n_head=2,
                                   n_positions=64)


def _saved(model_class: Any, seed: int, tmp_path_factory: pytest.TempPathFactory,
           name: str) -> tuple[Path, Any]:
    torch.manual_seed(seed)
    model = model_class(_gpt2_config()).eval()
    out = tmp_path_factory.mktemp(name)
    model.save_pretrained(out, safe_serialization=True)
    return out, model


@pytest.fixture(scope="module")
def gpt2_model(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Any]:
    """A tiny random GPT2Model saved as safetensors (names wte.weight / wpe.weight)."""
    return _saved(transformers.GPT2Model, 0, tmp_path_factory, "hf-gpt2")


@pytest.fixture(scope="module")
def gpt2_lm_model(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Any]:
    """A tiny GPT2LMHeadModel (transformer. prefix; lm_head tied and not saved)."""
    return _saved(transformers.GPT2LMHeadModel, 1, tmp_path_factory, "hf-gpt2-lm")


def test_hf_gpt2_tables_bit_exact(gpt2_model: tuple[Path, Any], tmp_path: Path,
                                  capsys: pytest.CaptureFixture[str]) -> None:
    src, model = gpt2_model
    out = tmp_path / "models" / "gpt2" / "1"
    assert main(["hf-gpt2", str(src), "--out", str(out)]) == 0
    ckpt = read_checkpoint(out)
    assert torch.equal(ckpt.token_table, model.wte.weight.detach())
    assert ckpt.position_table is not None
    assert torch.equal(ckpt.position_table, model.wpe.weight.detach())
    m = ckpt.manifest
    assert (m.vocab_size, m.table_rows, m.dim, m.max_seq_len, m.position, m.dtype) == (
        50257, 50257, 8, 64, "learned", "float32")
    assert m.tokenizer.encoding == "gpt2"
    assert m.tokenizer.sha256 == _sha256(default_ranks_path())
    prov = m.provenance
    assert prov["source"] == "hf"
    assert m.family == "gpt2"
    assert prov["hf_config"]["n_embd"] == 8
    assert prov["source_files"] == {"config.json": _sha256(src / "config.json"),
                                    "model.safetensors": _sha256(src / "model.safetensors")}
    assert prov["tensor_names"] == {"token_embedding": "wte.weight",
                                    "position_embedding": "wpe.weight"}
    assert f"checkpoint_id={ckpt.checkpoint_id}" in capsys.readouterr().out


def test_hf_gpt2_matches_hidden_states_zero(gpt2_model: tuple[Path, Any],
                                            tmp_path: Path) -> None:
    """The imported tables reproduce HF's own input embedding, with a position offset."""
    src, model = gpt2_model
    out = tmp_path / "gpt2" / "1"
    assert main(["hf-gpt2", str(src), "--out", str(out)]) == 0
    ckpt = read_checkpoint(out)
    assert ckpt.position_table is not None
    ids = torch.tensor([[31373, 995, 50256, 0]])
    pos = torch.arange(5, 9).unsqueeze(0)
    with torch.no_grad():
        hf = model(input_ids=ids, position_ids=pos, output_hidden_states=True).hidden_states[0]
    ours = ckpt.token_table[ids[0]] + ckpt.position_table[pos[0]]  # (T, C)
    assert torch.equal(ours, hf[0])


def test_hf_gpt2_lm_head_model(gpt2_lm_model: tuple[Path, Any], tmp_path: Path) -> None:
    src, model = gpt2_lm_model
    from safetensors import safe_open
    with safe_open(str(src / "model.safetensors"), framework="pt") as f:
        saved = set(f.keys())
    assert "transformer.wte.weight" in saved
    assert "lm_head.weight" not in saved  # tied: the importer must not need it
    out = tmp_path / "gpt2-lm" / "3"
    assert main(["hf-gpt2", str(src), "--out", str(out)]) == 0
    ckpt = read_checkpoint(out)
    assert torch.equal(ckpt.token_table, model.transformer.wte.weight.detach())
    assert ckpt.position_table is not None
    assert torch.equal(ckpt.position_table, model.transformer.wpe.weight.detach())
    assert ckpt.manifest.provenance["tensor_names"]["token_embedding"] == "transformer.wte.weight"


def test_hf_gpt2_sharded(tmp_path: Path) -> None:
    torch.manual_seed(2)
    model = transformers.GPT2LMHeadModel(_gpt2_config()).eval()
    src = tmp_path / "sharded"
    model.save_pretrained(src, safe_serialization=True, max_shard_size="1MB")
    assert (src / "model.safetensors.index.json").is_file()
    assert not (src / "model.safetensors").exists()
    out = tmp_path / "m" / "1"
    assert main(["hf-gpt2", str(src), "--out", str(out)]) == 0
    ckpt = read_checkpoint(out)
    assert torch.equal(ckpt.token_table, model.transformer.wte.weight.detach())
    weight_map = json.loads((src / "model.safetensors.index.json").read_text())["weight_map"]
    shard = weight_map["transformer.wte.weight"]
    assert shard in ckpt.manifest.provenance["source_files"]


def test_hf_gpt2_dtype_cast(gpt2_model: tuple[Path, Any], tmp_path: Path) -> None:
    src, model = gpt2_model
    out = tmp_path / "half" / "1"
    assert main(["hf-gpt2", str(src), "--out", str(out), "--dtype", "float16"]) == 0
    ckpt = read_checkpoint(out)
    assert ckpt.manifest.dtype == "float16"
    assert torch.equal(ckpt.token_table, model.wte.weight.detach().half())


def test_name_map_check_writes_nothing(gpt2_lm_model: tuple[Path, Any], tmp_path: Path,
                                       capsys: pytest.CaptureFixture[str]) -> None:
    src, _ = gpt2_lm_model
    before = sorted(tmp_path.iterdir())
    assert main(["hf-gpt2", str(src), "--name-map-check"]) == 0
    assert capsys.readouterr().out.splitlines() == [
        "transformer.wte.weight -> token_embedding [50257, 8] float32",
        "transformer.wpe.weight -> position_embedding [64, 8] float32"]
    assert sorted(tmp_path.iterdir()) == before


def _fake_hf_dir(path: Path, tensors: dict[str, torch.Tensor], vocab_size: int = GPT2_VOCAB,
                 ) -> Path:
    path.mkdir()
    _gpt2_config(vocab_size).save_pretrained(path)
    save_file(tensors, str(path / "model.safetensors"))
    return path


def test_missing_tensor_named(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    src = _fake_hf_dir(tmp_path / "src", {"wte.weight": torch.zeros(GPT2_VOCAB, 8)})
    assert main(["hf-gpt2", str(src), "--out", str(tmp_path / "m" / "1")]) == 2
    err = capsys.readouterr().err
    assert "no tensor for position_embedding" in err
    assert "'wpe.weight', 'transformer.wpe.weight'" in err
    assert not (tmp_path / "m").exists()


def test_shape_mismatch_named(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    src = _fake_hf_dir(tmp_path / "src", {"wte.weight": torch.zeros(GPT2_VOCAB, 8),
                                          "wpe.weight": torch.zeros(32, 8)})
    assert main(["hf-gpt2", str(src), "--out", str(tmp_path / "m" / "1")]) == 2
    err = capsys.readouterr().err
    assert "wpe.weight has shape (32, 8), expected (64, 8) = [n_positions, n_embd]" in err


def test_corrupt_safetensors(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    src = _fake_hf_dir(tmp_path / "src", {"wte.weight": torch.zeros(4, 8)})
    (src / "model.safetensors").write_bytes(b"\x10\x00\x00\x00\x00\x00\x00\x00not json")
    assert main(["hf-gpt2", str(src), "--out", str(tmp_path / "m" / "1")]) == 2
    assert capsys.readouterr().err.startswith("python -m training.importers: error: ")
    assert not (tmp_path / "m").exists()


def test_not_safetensors(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    src = tmp_path / "src"
    src.mkdir()
    _gpt2_config().save_pretrained(src)
    (src / "pytorch_model.bin").write_bytes(b"a pickle we must never open")
    assert main(["hf-gpt2", str(src), "--out", str(tmp_path / "m" / "1")]) == 2
    assert "no model.safetensors or model.safetensors.index.json" in capsys.readouterr().err


def test_vocab_smaller_than_tokenizer(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    src = _fake_hf_dir(tmp_path / "src", {"wte.weight": torch.zeros(1000, 8),
                                          "wpe.weight": torch.zeros(64, 8)}, vocab_size=1000)
    assert main(["hf-gpt2", str(src), "--out", str(tmp_path / "m" / "1")]) == 2
    err = capsys.readouterr().err
    assert "wte.weight: 1000 rows < the tokenizer's n_vocab 50257" in err
    assert not (tmp_path / "m").exists()


def test_out_required_to_write(gpt2_model: tuple[Path, Any],
                               capsys: pytest.CaptureFixture[str]) -> None:
    src, _ = gpt2_model
    with pytest.raises(SystemExit) as exc:
        main(["hf-gpt2", str(src)])
    assert exc.value.code == 2
    assert "--out models/<name>/<version> is required" in capsys.readouterr().err


def test_existing_version_refused(gpt2_model: tuple[Path, Any], tmp_path: Path,
                                  capsys: pytest.CaptureFixture[str]) -> None:
    src, _ = gpt2_model
    out = tmp_path / "m" / "1"
    out.mkdir(parents=True)
    with pytest.raises(SystemExit) as exc:
        main(["hf-gpt2", str(src), "--out", str(out)])
    assert exc.value.code == 2
    assert capsys.readouterr().err == (
        f"python -m training.importers: error: --out {out}: exists; versions are "
        f"immutable, name a new version (see --help)\n")
    assert list(out.iterdir()) == []


def test_module_entry_point(gpt2_model: tuple[Path, Any]) -> None:
    src, _ = gpt2_model
    proc = subprocess.run([sys.executable, "-m", "training.importers", "hf-gpt2", str(src),
                           "--name-map-check"], cwd=REPO_ROOT,
                          capture_output=True, text=True, timeout=120, check=False)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.splitlines()[0] == "wte.weight -> token_embedding [50257, 8] float32"


# --- hf-llama ---------------------------------------------------------------------------

@pytest.mark.parametrize(("cls_name", "tensor_name"), [
    ("LlamaForCausalLM", "model.embed_tokens.weight"), ("LlamaModel", "embed_tokens.weight")])
def test_hf_llama(cls_name: str, tensor_name: str, tmp_path: Path) -> None:
    torch.manual_seed(3)
    config = transformers.LlamaConfig(vocab_size=GPT2_VOCAB, hidden_size=8,
                                      intermediate_size=16, num_hidden_layers=1,
                                      num_attention_heads=2, num_key_value_heads=2,
                                      max_position_embeddings=64)
    model = getattr(transformers, cls_name)(config).eval()
    src = tmp_path / "llama"
    model.save_pretrained(src, safe_serialization=True)
    out = tmp_path / "models" / "llama" / "1"
    special = json.dumps({"<|endoftext|>": 50256})
    assert main(["hf-llama", str(src), "--out", str(out), "--tokenizer",
                 str(default_ranks_path()), "--pat-str", GPT2_PAT_STR,
                 "--special-tokens", special, "--encoding", "gpt2-ranks"]) == 0
    ckpt = read_checkpoint(out)
    assert torch.equal(ckpt.token_table, model.get_input_embeddings().weight.detach())
    assert ckpt.position_table is None
    m = ckpt.manifest
    assert (m.vocab_size, m.table_rows, m.dim, m.max_seq_len, m.position) == (
        50257, 50257, 8, 64, "none")
    assert m.provenance["tensor_names"] == {"token_embedding": tensor_name}
    assert m.tokenizer.special_tokens == {"<|endoftext|>": 50256}
    tok = load_tokenizer(m.tokenizer, ckpt.tokenizer_path)
    assert tok.encode("hello world") == [31373, 995]
    assert tok.encode("<|endoftext|>", allow_special_tokens=True) == [50256]


def test_hf_llama_bad_special_tokens(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    src = tmp_path / "src"
    src.mkdir()
    transformers.LlamaConfig(vocab_size=GPT2_VOCAB, hidden_size=8,
                              num_attention_heads=2).save_pretrained(src)
    save_file({"embed_tokens.weight": torch.zeros(GPT2_VOCAB, 8)}, str(src / "model.safetensors"))
    with pytest.raises(SystemExit) as exc:
        main(["hf-llama", str(src), "--out", str(tmp_path / "m" / "1"), "--tokenizer",
              str(default_ranks_path()), "--special-tokens", "[1, 2]"])
    assert exc.value.code == 2
    assert capsys.readouterr().err == (
        "python -m training.importers: error: --special-tokens '[1, 2]': accepts a "
        "JSON object of token -> id (id >= 0), or a file holding one; only with --tokenizer "
        "(see --help)\n")
    assert not (tmp_path / "m").exists()


# --- nanoGPT -----------------------------------------------------------------------------

def _nanogpt_ckpt(path: Path) -> dict[str, torch.Tensor]:
    """What nanoGPT's train.py saves after torch.compile: _orig_mod. prefixes, tied lm_head."""
    torch.manual_seed(4)
    wte = torch.randn(50304, 8)  # padded from 50257 to a multiple of 64
    state = {"transformer.wte.weight": wte, "transformer.wpe.weight": torch.randn(16, 8),
             "transformer.h.0.attn.c_attn.weight": torch.randn(24, 8),
             "transformer.ln_f.weight": torch.ones(8), "lm_head.weight": wte}
    model_args = {"n_layer": 1, "n_head": 2, "n_embd": 8, "block_size": 16, "bias": False,
                  "vocab_size": 50304, "dropout": 0.0}
    config = {"out_dir": "out", "dataset": "openwebtext", "learning_rate": 6e-4,
              "compile": True, "max_iters": 5000}
    torch.save({"model": {f"_orig_mod.{k}": v for k, v in state.items()},
                "optimizer": {"state": {}, "param_groups": [{"lr": 6e-4}]},
                "model_args": model_args, "iter_num": 2000,
                "best_val_loss": torch.tensor(2.875), "config": config}, path)
    return state


def test_nanogpt(tmp_path: Path) -> None:
    path = tmp_path / "ckpt.pt"
    state = _nanogpt_ckpt(path)
    out = tmp_path / "models" / "nano" / "1"
    assert main(["nanogpt", str(path), "--out", str(out)]) == 0
    ckpt = read_checkpoint(out)
    assert torch.equal(ckpt.token_table, state["transformer.wte.weight"])
    assert ckpt.position_table is not None
    assert torch.equal(ckpt.position_table, state["transformer.wpe.weight"])
    m = ckpt.manifest
    assert (m.vocab_size, m.table_rows, m.dim, m.max_seq_len) == (50257, 50304, 8, 16)
    prov = m.provenance
    assert (prov["source"], prov["step"], prov["val_loss"]) == ("nanogpt", 2000, 2.875)
    assert prov["model_args"]["block_size"] == 16
    assert prov["train_config"]["dataset"] == "openwebtext"
    assert prov["source_files"] == {"ckpt.pt": _sha256(path)}
    assert prov["tensor_names"]["token_embedding"] == "transformer.wte.weight"


class _NotAllowed:
    """An arbitrary class: weights_only=True must refuse to unpickle it."""


def test_nanogpt_refuses_pickled_objects(tmp_path: Path,
                                         capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "evil.pt"
    torch.save({"model": {}, "model_args": {}, "payload": _NotAllowed()}, path)
    assert main(["nanogpt", str(path), "--out", str(tmp_path / "m" / "1")]) == 2
    assert capsys.readouterr().err == (
        f"python -m training.importers: error: {path}: holds Python objects besides "
        f"tensors and plain containers "
        f"(tests.training.importers.test_importers._NotAllowed): refused; a checkpoint is read as "
        f"data, never as code\n")
    assert not (tmp_path / "m").exists()


def test_nanogpt_shape_mismatch(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "ckpt.pt"
    torch.save({"model": {"transformer.wte.weight": torch.zeros(50304, 8),
                          "transformer.wpe.weight": torch.zeros(16, 8)},
                "model_args": {"n_embd": 8, "block_size": 32, "vocab_size": 50304}}, path)
    assert main(["nanogpt", str(path), "--out", str(tmp_path / "m" / "1")]) == 2
    assert ("transformer.wpe.weight has shape (16, 8), expected (32, 8) = "
            "[block_size, n_embd] from model_args") in capsys.readouterr().err


# --- options: every one checked when parsed -----------------------------------------------

def _cases(tmp: Path) -> dict[str, list[tuple[list[str], str]]]:
    """Per option (its dest): argv fragments that cannot work, and what the one line says.
    Every option of every subcommand must have at least one (test_every_option_has_a_rule)."""
    a_file = tmp / "ranks.tiktoken"
    a_file.write_text("")
    out = str(tmp / "models" / "m" / "1")
    return {
        "dir": [([str(tmp / "missing")], f"DIR {tmp / 'missing'}: not a directory; accepts "
                                        f"an existing directory")],
        "ckpt": [([str(tmp / "missing.pt")], f"CKPT {tmp / 'missing.pt'}: not a file; "
                                             f"accepts an existing file")],
        "out": [(["--out", str(tmp / "models" / "m" / "01")], "argument --out: '"),
                (["--out", "1"], "argument --out: '1': accepts models/<name>/<version>"),
                (["--out", str(tmp / "models" / "m" / "latest")], "argument --out: '"),
                (["--out", str(tmp / "existing" / "m" / "1")], "--out "
                 f"{tmp / 'existing' / 'm' / '1'}: exists; versions are immutable"),
                (["--out", str(a_file / "m" / "1")], f"--out {a_file / 'm' / '1'}: cannot "
                 f"be created: {a_file} is not a directory")],
        "dtype": [(["--out", out, "--dtype", "float64"], "argument --dtype: invalid choice"),
                  (["--name-map-check", "--dtype", "float16"],
                   "--name-map-check writes nothing: --dtype would not be used")],
        "name_map_check": [(["--name-map-check", "--out", out],
                            "--name-map-check writes nothing: --out would not be used"),
                           ([], "--out models/<name>/<version> is required (or "
                                "--name-map-check)")],
        "tokenizer": [(["--out", out, "--tokenizer", str(tmp / "none.tiktoken")],
                       f"--tokenizer {tmp / 'none.tiktoken'}: not a file"),
                      (["--name-map-check", "--tokenizer", str(a_file)],
                       "--name-map-check writes nothing: --tokenizer would not be used")],
        "no_tokenizer": [(["--out", out, "--no-tokenizer", "--tokenizer", str(a_file)],
                          "--no-tokenizer imports ids-only: --tokenizer would not be used"),
                         (["--name-map-check", "--no-tokenizer"],
                          "--name-map-check writes nothing: --no-tokenizer would not")],
        "max_seq_len": [(["--out", out, "--max-seq-len", v],
                         f"argument --max-seq-len: '{v}': accepts an integer from 1 to "
                         f"2147483647") for v in ("0", "-5", "x", "2147483648")],
        "pat_str": [(["--out", out, "--pat-str", r"\w+"],
                     "--pat-str: a regular expression; only with --tokenizer"),
                    (["--out", out, "--tokenizer", str(a_file), "--pat-str", "(["],
                     "argument --pat-str: '([' is not a regular expression")],
        "special_tokens": [(["--out", out, "--special-tokens", "{}"],
                            "--special-tokens: a JSON object of token -> id (id >= 0), or a "
                            "file holding one; only with --tokenizer"),
                           *[(["--out", out, "--tokenizer", str(a_file), "--special-tokens",
                               v], f"--special-tokens {v!r}: accepts a JSON object")
                             for v in ('{"<s>": -1}', '{"<s>": true}', "[1]",
                                       str(tmp / "missing.json"))]],
        "encoding": [(["--out", out, "--tokenizer", str(a_file), "--encoding", "my enc"],
                      "argument --encoding: 'my enc': accepts a name of letters, digits"),
                     (["--out", out, "--encoding", "gpt2"],
                      "--encoding: a name of letters, digits, '_', '-' or '.'; only with "
                      "--tokenizer")],
        "discover": [(["--out", out, "--discover=yes"],
                      "argument --discover: ignored explicit argument 'yes'")],
    }


def _subcommands() -> dict[str, Any]:
    import argparse

    from training.importers.options import build_parser

    for action in build_parser()._actions:
        if isinstance(action, argparse._SubParsersAction):
            return dict(action.choices)
    raise AssertionError("no subcommands")


def test_every_option_has_a_rule(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                 capsys: pytest.CaptureFixture[str]) -> None:
    """Walks the parser's own options: each has a rule in options.RULES and cases here,
    and each case is exit 2 with one line naming the option, before any file is read."""
    from training.importers import cli
    from training.importers.options import RULES

    def no_work(*args: Any, **kwargs: Any) -> Any:
        raise AssertionError("work started before the options were checked")
    monkeypatch.setattr(cli, "load_hf", no_work)
    monkeypatch.setattr(cli, "load_nanogpt", no_work)
    cases = _cases(tmp_path)
    (tmp_path / "existing" / "m" / "1").mkdir(parents=True)
    (tmp_path / "src").mkdir()
    (tmp_path / "ckpt.pt").write_bytes(b"")
    checked = 0
    for command, sub in _subcommands().items():
        source = str(tmp_path / ("ckpt.pt" if command == "nanogpt" else "src"))
        for action in sub._actions:
            if action.dest == "help":
                continue
            assert action.dest in RULES, f"{command} {action.dest}: no rule in options.RULES"
            assert action.dest in cases, f"{command} {action.dest}: no case in this test"
            for fragment, expected in cases[action.dest]:
                if action.dest in ("dir", "ckpt"):
                    argv = [command, *fragment, "--out", str(tmp_path / "models" / "m" / "1")]
                else:
                    argv = [command, source, *fragment]
                with pytest.raises(SystemExit) as exc:
                    main(argv)
                err = capsys.readouterr().err
                assert exc.value.code == 2, argv
                assert err.startswith("python -m training.importers: error: "
                                      f"{expected}"), (argv, err)
                assert err.endswith(" (see --help)\n"), err
                assert err.count("\n") == 1, err
                checked += 1
    assert checked >= 60


def test_valid_options_reach_the_import(tmp_path: Path,
                                        monkeypatch: pytest.MonkeyPatch) -> None:
    """The same checks let a sensible command line through (the walk above is not a
    parser that refuses everything)."""
    from training.importers import cli

    seen: list[Any] = []

    def load_hf(*args: Any, **kwargs: Any) -> Any:
        seen.append(args)
        raise KeyboardInterrupt  # stop here: the options were all accepted
    monkeypatch.setattr(cli, "load_hf", load_hf)
    (tmp_path / "src").mkdir()
    ranks = tmp_path / "ranks.tiktoken"
    ranks.write_text("")
    special = tmp_path / "special.json"
    special.write_text('{"<|end|>": 7}')
    assert main(["hf", str(tmp_path / "src"), "--out", str(tmp_path / "new" / "m" / "3"),
                 "--tokenizer", str(ranks), "--pat-str", r"\p{L}+", "--special-tokens",
                 str(special), "--encoding", "my-enc.1", "--max-seq-len", "8",
                 "--dtype", "bfloat16", "--discover"]) == 130
    assert seen == [(tmp_path / "src", 8, None)]


def test_internal_error_is_one_line_and_a_log(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                              capsys: pytest.CaptureFixture[str]) -> None:
    from training.importers import cli

    def bug(*args: Any, **kwargs: Any) -> Any:
        raise RuntimeError("a bug\n  File \"x.py\", line 3\n    y = x[0]")
    monkeypatch.setattr(cli, "load_hf", bug)
    monkeypatch.setenv("TMPDIR", str(tmp_path))
    import tempfile
    monkeypatch.setattr(tempfile, "tempdir", None)
    (tmp_path / "src").mkdir()
    assert main(["hf", str(tmp_path / "src"), "--out", str(tmp_path / "m" / "1")]) == 70
    err = capsys.readouterr().err
    [log] = list(tmp_path.glob("python-m-training-importers-internal-error-*.log"))
    assert err == (f"python -m training.importers: internal error (RuntimeError); nothing "
                   f"written; please report it with the log {log}\n")
    text = log.read_text()
    assert "Traceback (most recent call last)" in text
    assert 'RuntimeError: a bug\n  File "x.py", line 3' in text
    assert not (tmp_path / "m").exists()


def test_writes_exactly_the_version_named(gpt2_model: tuple[Path, Any], tmp_path: Path,
                                          capsys: pytest.CaptureFixture[str]) -> None:
    """The version directory named by --out (its missing parents made, nothing else), and
    the one line on stdout names it."""
    src, _ = gpt2_model
    out = tmp_path / "repo" / "gpt2" / "1"
    assert main(["hf-gpt2", str(src), "--out", str(out)]) == 0
    [line] = capsys.readouterr().out.splitlines()
    assert line.startswith(f"wrote {out}: family=gpt2 rules='none' vocab_size=50257 ")
    written = sorted(str(p.relative_to(tmp_path)) for p in tmp_path.rglob("*"))
    assert written == ["repo", "repo/gpt2", "repo/gpt2/1", "repo/gpt2/1/embeddings.safetensors",
                       "repo/gpt2/1/manifest.json", "repo/gpt2/1/tokenizer.tiktoken"]

"""``python -m training.importers hf``: every family's tensors, rules and refusals."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import torch
import transformers as tf
from safetensors.torch import save_file

from service.format.checkpoint import read_checkpoint
from tests.hf_models import FAMILY_MODELS, HIDDEN, MAX_POS, VOCAB, build, save
from training.importers import FAMILIES, main

# What each family's manifest must say: (family, rules, position, hidden_size or 0).
EXPECTED: dict[str, tuple[str, dict[str, Any], str, int]] = {
    "gpt2": ("gpt2", {}, "learned", 0),
    "opt": ("opt", {"position_offset": 2}, "learned", 0),
    "opt-proj": ("opt", {"position_offset": 2, "project_in": True}, "learned", HIDDEN),
    "llama": ("llama", {}, "none", 0),
    "mistral": ("mistral", {}, "none", 0),
    "qwen2": ("qwen2", {}, "none", 0),
    "gemma": ("gemma", {"embed_scale": HIDDEN ** 0.5}, "none", 0),
    "phi3": ("phi3", {}, "none", 0),
    "gpt_neox": ("gpt_neox", {}, "none", 0),
    "bloom": ("bloom", {"layernorm": {"eps": 1e-5}}, "none", 0),
    "falcon": ("falcon", {}, "none", 0),
    "bert": ("bert", {"token_type": True, "layernorm": {"eps": 1e-12}}, "learned", 0),
}


def _import(src: Path, out: Path, *extra: str) -> int:
    return main(["hf", str(src), "--out", str(out), *extra])


@pytest.mark.parametrize("name", list(FAMILY_MODELS))
def test_manifest_records_family_and_rules(name: str, tmp_path: Path) -> None:
    model = build(name)
    src = save(model, tmp_path / "src")
    extra = ["--max-seq-len", str(MAX_POS)] if name == "bloom" else []
    assert _import(src, tmp_path / "m" / "1", *extra) == 0
    raw = json.loads((tmp_path / "m" / "1" / "manifest.json").read_text())
    family, rules, position, hidden = EXPECTED[name]
    assert (raw["family"], raw.get("rules", {}), raw["position"]) == (family, rules, position)
    assert raw.get("hidden_size", 0) == hidden
    assert (raw["vocab_size"], raw["max_seq_len"], raw["tokenizer"]) == (VOCAB, MAX_POS, None)
    ckpt = read_checkpoint(tmp_path / "m" / "1")
    assert torch.equal(ckpt.token_table, model.get_input_embeddings().weight.detach())


def test_sharded_checkpoints(tmp_path: Path) -> None:
    """save_pretrained(max_shard_size=...) writes an index; only the shards holding the
    embedding tensors are read (and recorded)."""
    for name in ("llama", "bert"):
        model = build(name, seed=4)
        src = save(model, tmp_path / name, max_shard_size="4KB")
        index = json.loads((src / "model.safetensors.index.json").read_text())["weight_map"]
        assert len(set(index.values())) > 2  # one shard per tensor or so
        out = tmp_path / "m" / name / "1"
        assert _import(src, out) == 0
        ckpt = read_checkpoint(out)
        assert torch.equal(ckpt.token_table, model.get_input_embeddings().weight.detach())
        read = set(ckpt.manifest.provenance["source_files"]) - {"config.json"}
        wanted = {index[n] for n in ckpt.manifest.provenance["tensor_names"].values()}
        assert read == wanted
        assert read < set(index.values())
    ln = model.embeddings.LayerNorm
    assert torch.equal(ckpt.rule_tensors["layernorm_weight"], ln.weight.detach())
    assert torch.equal(ckpt.rule_tensors["layernorm_bias"], ln.bias.detach())
    row0 = model.embeddings.token_type_embeddings.weight.detach()[:1]
    assert torch.equal(ckpt.rule_tensors["token_type_embedding"], row0)
    assert ckpt.position_table is not None


def test_unknown_model_type_named(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A model_type without an entry goes to discovery; one it cannot reproduce (T5, an
    encoder-decoder whose forward needs decoder ids) or one transformers does not know is
    refused, never guessed, and nothing is written."""
    src = tmp_path / "t5"
    src.mkdir()
    tf.T5Config(vocab_size=VOCAB, d_model=8).save_pretrained(src)
    save_file({"shared.weight": torch.zeros(VOCAB, 8)}, str(src / "model.safetensors"))
    assert _import(src, tmp_path / "m" / "1") == 2
    err = capsys.readouterr().err
    assert "model_type 't5' has no hand-written entry (those: bert, bloom, falcon, gemma, " \
           "gpt2, gpt_neox, llama, mistral, opt, phi3, qwen2) and discovery refused it: " in err
    assert "the reference (T5Model) failed on a probe (You must specify exactly one of " \
           "input_ids or inputs_embeds)" in err
    unknown = tmp_path / "unknown"
    unknown.mkdir()
    (unknown / "config.json").write_text('{"model_type": "no-such-family", "vocab_size": 8}')
    save_file({"embed.weight": torch.zeros(8, 4)}, str(unknown / "model.safetensors"))
    assert _import(unknown, tmp_path / "m" / "1") == 2
    err = capsys.readouterr().err
    assert "model_type 'no-such-family' has no hand-written entry" in err
    assert err == (
        f"python -m training.importers: error: {unknown / 'config.json'}: model_type "
        f"'no-such-family' has no hand-written "
        f"entry (those: {', '.join(sorted(FAMILIES))}) and discovery refused it: "
        f"{unknown / 'config.json'}: transformers {tf.__version__} cannot read it (The "
        f"checkpoint you are trying to load has model type `no-such-family` but Transformers "
        f"does not recognize this architecture.)\n")
    assert not (tmp_path / "m").exists()
    assert sorted(FAMILIES) == ["bert", "bloom", "falcon", "gemma", "gpt2", "gpt_neox",
                                "llama", "mistral", "opt", "phi3", "qwen2"]


def test_pickled_weights_refused(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    src = tmp_path / "src"
    src.mkdir()
    FAMILY_MODELS["llama"][1].save_pretrained(src)
    (src / "pytorch_model.bin").write_bytes(b"a pickle we must never open")
    assert _import(src, tmp_path / "m" / "1") == 2
    err = capsys.readouterr().err
    assert "found pytorch_model.bin: pickled weights are never opened" in err
    assert "save_pretrained(safe_serialization=True)" in err


def test_max_seq_len_flag(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    bloom = save(build("bloom"), tmp_path / "bloom")
    capsys.readouterr()
    assert _import(bloom, tmp_path / "b" / "1") == 2
    assert capsys.readouterr().err == (
        f"python -m training.importers: error: {bloom / 'config.json'}: bloom states no "
        f"context length (none of "
        f"max_position_embeddings, n_positions, n_ctx, max_seq_len, max_sequence_length, "
        f"max_seq_length, seq_length, context_length, model_max_length); pass --max-seq-len "
        f"(e.g. 2048 for BLOOM)\n")
    gpt2 = save(build("gpt2"), tmp_path / "gpt2")
    assert _import(gpt2, tmp_path / "g" / "1", "--max-seq-len", "8") == 2
    assert "gpt2 has a learned position table" in capsys.readouterr().err
    llama = save(build("llama"), tmp_path / "llama")
    assert _import(llama, tmp_path / "l" / "1", "--max-seq-len", "4096") == 0
    assert read_checkpoint(tmp_path / "l" / "1").manifest.max_seq_len == 4096


def test_aliases_check_the_family(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A Gemma directory has Llama's tensor names but not its rules: hf-llama refuses it."""
    gemma = save(build("gemma"), tmp_path / "gemma")
    assert main(["hf-llama", str(gemma), "--out", str(tmp_path / "m" / "1")]) == 2
    assert "model_type 'gemma', but hf-llama imports only 'llama'" in capsys.readouterr().err


def test_name_map_check_lists_rule_tensors(tmp_path: Path,
                                           capsys: pytest.CaptureFixture[str]) -> None:
    src = save(build("opt-proj"), tmp_path / "opt")
    assert main(["hf", str(src), "--name-map-check"]) == 0
    assert capsys.readouterr().out.splitlines() == [
        f"decoder.embed_tokens.weight -> token_embedding [{VOCAB}, 8] float32",
        f"decoder.embed_positions.weight -> position_embedding [{MAX_POS + 2}, {HIDDEN}] "
        f"float32",
        f"decoder.project_in.weight -> project_in_weight [{HIDDEN}, 8] float32"]


def test_rule_tensor_shape_checked(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    src = tmp_path / "bloom"
    src.mkdir()
    FAMILY_MODELS["bloom"][1].save_pretrained(src)
    save_file({"word_embeddings.weight": torch.zeros(VOCAB, HIDDEN),
               "word_embeddings_layernorm.weight": torch.ones(HIDDEN - 1),
               "word_embeddings_layernorm.bias": torch.zeros(HIDDEN)},
              str(src / "model.safetensors"))
    assert _import(src, tmp_path / "m" / "1", "--max-seq-len", "8") == 2
    assert (f"word_embeddings_layernorm.weight has shape ({HIDDEN - 1},), expected "
            f"({HIDDEN},) = [hidden_size]") in capsys.readouterr().err


@pytest.mark.parametrize("key", ["seq_length", "max_sequence_length", "n_ctx"])
def test_context_length_under_another_key(tmp_path: Path, key: str) -> None:
    """A config.json that states the context length under another name than the
    family's own (BLOOM states none; Llama's max_position_embeddings removed) is read
    without --max-seq-len; a tokenizer's "no limit" sentinel is not a length."""
    bloom = save(build("bloom"), tmp_path / "bloom")
    config = json.loads((bloom / "config.json").read_text())
    (bloom / "config.json").write_text(json.dumps({**config, key: 77}))
    assert _import(bloom, tmp_path / "b" / "1") == 0
    assert read_checkpoint(tmp_path / "b" / "1").manifest.max_seq_len == 77
    llama = save(build("llama"), tmp_path / "llama")
    config = json.loads((llama / "config.json").read_text())
    del config["max_position_embeddings"]
    (llama / "config.json").write_text(json.dumps(
        {**config, "model_max_length": int(1e30), key: 55}))
    assert _import(llama, tmp_path / "l" / "1") == 0
    assert read_checkpoint(tmp_path / "l" / "1").manifest.max_seq_len == 55

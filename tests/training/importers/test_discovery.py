"""Families without a hand-written entry, imported through discovery only (the family's
own transformers code run on probes decides the rule) and served by a real server, equal
transformers bit for bit: the default compose ``hidden_states[0]`` (with position
offsets), COMPOSE_TOKEN_ONLY ``get_input_embeddings()(ids)``, in fp32 and in bf16, and
text ids equal AutoTokenizer's. Among them: MPT, whose config states its context length
as max_seq_len (read without --max-seq-len); ALBERT, ELECTRA, ConvBERT and RoFormer,
whose embedding is projected to the hidden size after its LayerNorm; ConvBERT and
SqueezeBERT, which add the token-type row after the position rows. Discovery on the
eleven hand-written families agrees with their entries; a family outside the rule
vocabulary is refused and nothing is written."""

from __future__ import annotations

import json
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
import transformers as tf

from client import EmbeddingClient
from service.format.manifest import MANIFEST_FILE
from service.local import ServerHandle
from tests.hf_models import (
    DISCOVERY_MODELS,
    FAMILY_MODELS,
    HIDDEN,
    MAX_POS,
    VOCAB,
    build,
    metaspace_bpe,
    one_thread,  # noqa: F401  (autouse: the reference on the server's one thread)
    reference,
    save,
    served_models,
    served_rows,
)
from training.importers import main as import_main
from training.importers.source import SafetensorsDir

IDS = [5, 17, 0, 95, 42, 42, 7, 63, 1, 88, 30]  # T=11: id 0, the last row, a repeat
LEARNED = {"gpt_neo", "gpt_bigcode", "biogpt", "albert", "electra", "convbert", "squeezebert"}
_ENCODER_RULES = {"token_type": True, "layernorm": {"eps": 1e-12}}
_PROJECTED = {**_ENCODER_RULES, "project_hidden": True}
# The projected encoders: token rows of width 8 (embedding_size), hidden_states[0] HIDDEN.
EMBEDDING_SIZE = {"albert": 8, "electra": 8, "convbert": 8, "roformer": 8}
TEXTS = ["The cat walks to the garden.", "a dog  sleeps\nin the house", "x", "café?"]
# What discovery must find (manifest rules, position kind) for each family.
EXPECTED = {
    "qwen3": ({}, "none"), "olmo2": ({}, "none"), "starcoder2": ({}, "none"),
    "stablelm": ({}, "none"), "llava": ({}, "none"), "mistral3": ({}, "none"),
    "cohere": ({}, "none"), "smollm3": ({}, "none"), "qwen3_moe": ({}, "none"),
    "gemma2": ({"embed_scale": HIDDEN ** 0.5}, "none"),
    "gemma3": ({"embed_scale": HIDDEN ** 0.5}, "none"),
    "granite": ({"input_scale": 0.15}, "none"),
    "gpt_neo": ({}, "learned"), "gpt_bigcode": ({}, "learned"),
    "biogpt": ({"position_offset": 2, "embed_scale": HIDDEN ** 0.5,
                "embed_scale_float": True}, "learned"),
    "mpt": ({}, "none"),
    "albert": (_PROJECTED, "learned"), "electra": (_PROJECTED, "learned"),
    "convbert": ({**_PROJECTED, "token_type_last": True}, "learned"),
    "roformer": (_PROJECTED, "none"),
    "squeezebert": ({**_ENCODER_RULES, "token_type_last": True}, "learned"),
}


def _tokenizer(out: Path) -> None:
    """A Metaspace BPE with fewer ids than the models' rows, BOS added by its file."""
    corpus = [f"The {a} walks to the {p}. {a}s sleep in the {p}!\n"
              for a in ("cat", "dog", "bird") for p in ("garden", "house")] * 3
    tok = metaspace_bpe(corpus, vocab_size=80)
    assert tok.get_vocab_size() <= VOCAB
    tok.save(str(out / "tokenizer.json"))
    (out / "tokenizer_config.json").write_text(json.dumps({
        "bos_token": "<s>", "eos_token": "</s>", "unk_token": "<unk>",
        "tokenizer_class": "PreTrainedTokenizerFast"}))


@pytest.fixture(scope="module")
def found(tmp_path_factory: pytest.TempPathFactory
          ) -> Iterator[tuple[ServerHandle, dict[str, Any], Path]]:
    """One server over every discovered family in fp32 (name) and bf16 (name-bf16)."""
    tmp = tmp_path_factory.mktemp("discovery")
    models = {key: (name, dtype) for name in DISCOVERY_MODELS
              for key, dtype in ((name, torch.float32), (f"{name}-bf16", torch.bfloat16))}
    with served_models(tmp, models, "qwen3", prepare=_tokenizer) as (handle, built):
        yield handle, built, tmp


def test_at_least_eight_new_families() -> None:
    assert len(set(DISCOVERY_MODELS) - set(FAMILY_MODELS)) >= 8
    nested = [n for n, (_, config) in DISCOVERY_MODELS.items()
              if getattr(config, "text_config", None) is not None]
    assert nested == ["gemma3", "llava", "mistral3"]


@pytest.mark.parametrize("name", list(DISCOVERY_MODELS))
def test_fp32_and_bf16_bit_for_bit(found: tuple[ServerHandle, dict[str, Any], Path],
                                   name: str) -> None:
    handle, built, _ = found
    for key, dtype in ((name, "float32"), (f"{name}-bf16", "bfloat16")):
        for start_position in (0, 7, MAX_POS - len(IDS)):
            hidden, token = reference(built[key], name, IDS, start_position)
            got = served_rows(handle, key, IDS, start_position=start_position, dtype=dtype)
            assert torch.equal(got, hidden.float()), f"{key} hidden_states[0] at {start_position}"
            got_token = served_rows(handle, key, IDS, start_position=start_position,
                               compose="token", dtype=dtype)
            assert torch.equal(got_token, token.float()), f"{key} get_input_embeddings()"
    if name in LEARNED or name == "granite":
        assert not torch.equal(hidden, token)  # the default compose is more than the rows


@pytest.mark.parametrize("name", list(DISCOVERY_MODELS))
def test_manifest_rule_and_evidence(found: tuple[ServerHandle, dict[str, Any], Path],
                                    name: str) -> None:
    _, _, tmp = found
    for key, stored in ((name, "float32"), (f"{name}-bf16", "bfloat16")):
        manifest = json.loads((tmp / "models" / key / "1" / MANIFEST_FILE).read_text())
        rules, position = EXPECTED[name]
        assert (manifest.get("rules") or {}, manifest["position"]) == (rules, position)
        assert manifest["family"] == name
        assert manifest["dtype"] == stored
        assert manifest["max_seq_len"] == MAX_POS  # from the config, whatever its key
        dim = EMBEDDING_SIZE.get(name, HIDDEN)
        assert (manifest["dim"], manifest.get("hidden_size", dim)) == (dim, HIDDEN)
        evidence = manifest["provenance"]["discovery"]
        assert evidence["max_difference"] == 0.0
        assert evidence["stored_dtype"] == stored
        assert set(evidence["dtypes"]) == {"float32", "bfloat16"}
        assert len(evidence["probe_sha256"]) == 64
        assert evidence["probes"] >= 2
        assert evidence["compared"] == ["hidden_states[0]", "get_input_embeddings()(ids)"]


@pytest.mark.parametrize("name", ["qwen3", "gemma3", "granite", "biogpt"])
def test_text_ids_equal_auto_tokenizer(found: tuple[ServerHandle, dict[str, Any], Path],
                                       name: str) -> None:
    handle, built, tmp = found
    auto = tf.AutoTokenizer.from_pretrained(tmp / "src" / name)
    with EmbeddingClient(handle.target) as c:
        for text in TEXTS:
            e = c.embed(text, model=name, allow_special_tokens=True)
            assert e.token_ids == auto(text)["input_ids"], (name, text)
            hidden, _ = reference(built[name], name, list(e.token_ids), 0)
            assert torch.equal(torch.from_numpy(np.array(e.array)), hidden)


def test_nested_checkpoint_reads_only_the_text_tower(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Gemma 3 (vision + language), saved sharded: only the language model's token table
    is read, and only the shard that holds it is opened for data."""
    src = save(build("gemma3"), tmp_path / "src", max_shard_size="20KB")
    read: list[str] = []
    original = SafetensorsDir.tensor
    monkeypatch.setattr(SafetensorsDir, "tensor",
                        lambda self, name: read.append(name) or original(self, name))
    assert import_main(["hf", str(src), "--out", str(tmp_path / "m" / "1")]) == 0
    assert read == ["language_model.model.embed_tokens.weight"]
    index = json.loads((src / "model.safetensors.index.json").read_text())["weight_map"]
    shards = set(index.values())
    assert len(shards) > 2
    manifest = json.loads((tmp_path / "m" / "1" / MANIFEST_FILE).read_text())
    opened = set(manifest["provenance"]["source_files"]) - {"config.json"}
    assert opened == {index["language_model.model.embed_tokens.weight"]}
    assert any(k.startswith(("vision_tower.", "model.vision_tower.")) for k in index)


@pytest.mark.parametrize("name", list(FAMILY_MODELS))
def test_discovery_agrees_with_hand_written(tmp_path: Path, name: str) -> None:
    """--discover on a hand-written family refuses unless discovery finds the same rule,
    tensors and sizes; the two versions' tables are byte-identical."""
    for dtype in (torch.float32, torch.bfloat16):
        src = save(build(name, dtype=dtype), tmp_path / str(dtype) / "src")
        extra = ["--max-seq-len", str(MAX_POS)] if name == "bloom" else []
        written, discovered = tmp_path / str(dtype) / "w" / "1", tmp_path / str(dtype) / "d" / "1"
        assert import_main(["hf", str(src), "--out", str(written), *extra]) == 0
        assert import_main(["hf", str(src), "--out", str(discovered), "--discover",
                            *extra]) == 0
        a = json.loads((written / MANIFEST_FILE).read_text())
        b = json.loads((discovered / MANIFEST_FILE).read_text())
        for field in ("rules", "position", "vocab_size", "table_rows", "dim", "max_seq_len",
                      "hidden_size", "dtype", "family"):
            assert a.get(field) == b.get(field), (name, field)
        assert a["files"] == b["files"]  # the same bytes in embeddings.safetensors
        assert b["provenance"]["discovery"]["max_difference"] == 0.0


def test_outside_the_vocabulary_is_refused(tmp_path: Path,
                                           capsys: pytest.CaptureFixture[str]) -> None:
    """MobileBERT normalises with a NoNorm (w * x + b, no statistics): not a rule the
    server applies; refused in one line, nothing written."""
    src = save(build("mobilebert"), tmp_path / "src")
    out = tmp_path / "m" / "1"
    capsys.readouterr()
    assert import_main(["hf", str(src), "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1
    assert "hidden_states[0] is computed from embeddings.LayerNorm.bias, " \
           "embeddings.LayerNorm.weight of a NoNorm, which is none of the rules" in err
    assert not out.parent.exists()


@pytest.mark.parametrize("name", list(EMBEDDING_SIZE))
def test_projected_encoder_widths(found: tuple[ServerHandle, dict[str, Any], Path],
                                  name: str) -> None:
    """Token-only rows and position-only rows have the embedding's width (they are the
    tables' rows, before the projection); the default compose the hidden size."""
    handle, built, _ = found
    model = built[name]
    ids = IDS[:6]
    assert served_rows(handle, name, ids).shape == (6, HIDDEN)
    assert served_rows(handle, name, ids, compose="token").shape == (6, EMBEDDING_SIZE[name])
    if name in LEARNED:
        table = model.get_submodule(
            "albert.embeddings" if name == "albert" else "embeddings").position_embeddings
        got = served_rows(handle, name, ids, start_position=5, compose="position")
        assert torch.equal(got, table.weight.detach()[5:11])
    with EmbeddingClient(handle.target) as c:
        info = c.model_info(name)
    assert (info.dim, info.hidden_size) == (EMBEDDING_SIZE[name], HIDDEN)


def test_mismatch_is_refused_with_the_difference(tmp_path: Path,
                                                 capsys: pytest.CaptureFixture[str]) -> None:
    """RoBERTa numbers positions from padding_idx + 1 when given none, and from the
    position_ids it is given otherwise: no single offset serves both, and the message
    names the closest rule, the difference and the probe."""
    torch.manual_seed(0)
    model = tf.RobertaModel(tf.RobertaConfig(
        vocab_size=VOCAB, hidden_size=HIDDEN, intermediate_size=32,
        max_position_embeddings=MAX_POS + 2, num_hidden_layers=1, num_attention_heads=2,
        pad_token_id=1)).eval()
    src = save(model, tmp_path / "src")
    out = tmp_path / "m" / "1"
    assert import_main(["hf", str(src), "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert "model_type 'roberta': no rule the server applies reproduces its embeddings" in err
    assert "max difference" in err
    assert " on hidden_states[0] in float32, ids [" in err
    assert "nothing written" in err
    assert not out.parent.exists()


def test_without_transformers(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                              capsys: pytest.CaptureFixture[str]) -> None:
    """Hand-written families import without transformers; others are refused with the
    extra's install line."""
    llama = save(build("llama"), tmp_path / "llama")
    qwen3 = save(build("qwen3"), tmp_path / "qwen3")
    monkeypatch.setitem(sys.modules, "transformers", None)  # import raises ImportError
    assert import_main(["hf", str(llama), "--out", str(tmp_path / "m" / "llama" / "1")]) == 0
    assert import_main(["hf", str(qwen3), "--out", str(tmp_path / "m" / "qwen3" / "1")]) == 2
    err = capsys.readouterr().err
    assert "needs transformers, which is not installed: pip install -e '.[import]'" in err
    assert not (tmp_path / "m" / "qwen3").exists()

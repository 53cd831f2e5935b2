"""A model that ships only a SentencePiece tokenizer.model: the importer stores the fast
tokenizer transformers converts it to, and the served text ids equal AutoTokenizer's."""

from __future__ import annotations

import io
import json
from pathlib import Path

import numpy as np
import pytest
import sentencepiece as spm
import torch
import transformers as tf

from client import EmbeddingClient
from service.format.manifest import MANIFEST_FILE
from tests.hf_models import build, reference, save
from tests.tiny_model import start
from training.importers import main as import_main

CORPUS = [f"The {a} walks to the {p}. {a}s sleep in the {p}!"
          for a in ("cat", "dog", "bird") for p in ("garden", "house")] * 5
TEXTS = ["The cat walks to the garden.", " two  spaces\nnewline", "unseen ü 日本", "x", ""]


def _spm_dir(out: Path, name: str) -> Path:
    """A tiny model of ``name`` (no tokenizer.json) with a trained SentencePiece BPE."""
    buf = io.BytesIO()
    spm.SentencePieceTrainer.train(sentence_iterator=iter(CORPUS), model_writer=buf,
                                   vocab_size=60, model_type="bpe", unk_id=0, bos_id=1,
                                   eos_id=2, pad_id=-1, minloglevel=2)
    src = save(build(name), out)
    (src / "tokenizer.model").write_bytes(buf.getvalue())
    (src / "tokenizer_config.json").write_text(json.dumps({
        "tokenizer_class": "LlamaTokenizer", "bos_token": "<s>", "eos_token": "</s>",
        "unk_token": "<unk>", "add_bos_token": True}))
    assert not (src / "tokenizer.json").exists()
    return src


@pytest.mark.parametrize("name", ["llama", "qwen3"])  # hand-written, and discovered
def test_sentencepiece_only_model_serves_auto_tokenizer_ids(tmp_path: Path, name: str) -> None:
    src = _spm_dir(tmp_path / "src", name)
    assert import_main(["hf", str(src), "--out", str(tmp_path / "models" / name / "1")]) == 0
    manifest = json.loads((tmp_path / "models" / name / "1" / MANIFEST_FILE).read_text())
    assert manifest["tokenizer"]["kind"] == "hf"
    provenance = manifest["provenance"]
    assert provenance["tokenizer_source"] == \
        "tokenizer.model converted by transformers (LlamaTokenizer)"
    assert set(provenance["tokenizer_files"]) == {"tokenizer.model", "tokenizer_config.json"}
    auto = tf.AutoTokenizer.from_pretrained(src)
    model = build(name)
    handle = start(tmp_path / "models", default_model=name, metrics_port=-1)
    try:
        with EmbeddingClient(handle.target) as c:
            for text in TEXTS[:-1]:
                e = c.embed(text, model=name, allow_special_tokens=True)
                assert e.token_ids == auto(text)["input_ids"], text
                assert e.token_ids[0] == auto.bos_token_id
                hidden, _ = reference(model, name, list(e.token_ids), 0)
                assert torch.equal(torch.from_numpy(np.array(e.array)), hidden)
    finally:
        handle.stop()


def test_unloadable_tokenizer_model_refused(tmp_path: Path,
                                            capsys: pytest.CaptureFixture[str]) -> None:
    """A tokenizer.model neither SentencePiece nor tiktoken ranks (which transformers 5
    also converts) is refused with the way out, never imported ids-only by surprise."""
    src = save(build("llama"), tmp_path / "src")
    (src / "tokenizer.model").write_bytes(b"\x00\xffnot a tokenizer")
    (src / "tokenizer_config.json").write_text('{"tokenizer_class": "LlamaTokenizer"}')
    out = tmp_path / "m" / "1"
    assert import_main(["hf", str(src), "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert "tokenizer.model: AutoTokenizer could not load it (" in err
    assert "or pass --no-tokenizer" in err
    assert not out.parent.exists()
    assert import_main(["hf", str(src), "--out", str(out), "--no-tokenizer"]) == 0

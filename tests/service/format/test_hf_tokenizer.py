"""A model's own tokenizer.json, built here with ``tokenizers``: imported with the model,
served, and equal to ``AutoTokenizer.from_pretrained(DIR)(text)["input_ids"]`` exactly,
BOS included, for three real-world shapes (Llama 3, GPT-2, Llama 2 / Mistral)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import numpy as np
import pytest
import torch
import transformers as tf
from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers, processors, trainers

from client import EmbeddingClient
from client.cli import main as cli_main
from genproto.inference.v2 import grpc_service_pb2 as oip
from genproto.inference.v2 import grpc_service_pb2_grpc as oip_grpc
from service.engine.loading import load_model
from service.format.tensorfile import CheckpointError
from service.local import ServerHandle
from tests.hf_models import HIDDEN, metaspace_bpe
from tests.tiny_model import start
from training.importers import LLAMA3_PAT_STR, main

CORPUS = [f"The {a} walks to the {p}. {n} {a}s sleep in the {p}!\n"
          for n, a in enumerate(["cat", "dog", "bird", "horse", "mouse", "sheep"])
          for p in ["garden", "house", "river", "café"]] * 3
TEXTS = ["The cat walks to the garden.", " leading space and  two spaces", "line\nbreaks\n\n",
         "12345 numbers", "café naïve", "日本 🙂 unseen characters", "MiXeD CaSe!", "x",
         "special inside: <s> </s> <|begin_of_text|> <|endoftext|> end"]
VOCAB = 320  # model rows: every tokenizer below has fewer ids


def _llama3() -> tuple[Tokenizer, dict[str, Any]]:
    """Byte-level BPE with Llama 3's split regex; the post-processor adds BOS."""
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(LLAMA3_PAT_STR), behavior="isolated"),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
    tok.decoder = decoders.ByteLevel()
    tok.train_from_iterator(CORPUS, trainers.BpeTrainer(
        vocab_size=300, special_tokens=["<|begin_of_text|>", "<|end_of_text|>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    tok.post_processor = processors.Sequence([
        processors.ByteLevel(trim_offsets=False),
        processors.TemplateProcessing(
            single="<|begin_of_text|> $A", pair="<|begin_of_text|> $A <|begin_of_text|> $B:1",
            special_tokens=[("<|begin_of_text|>", 0)])])
    return tok, {"bos_token": "<|begin_of_text|>", "eos_token": "<|end_of_text|>",
                 "tokenizer_class": "PreTrainedTokenizerFast", "model_max_length": 131072}


def _gpt2() -> tuple[Tokenizer, dict[str, Any]]:
    """GPT-2's shape: byte-level BPE, <|endoftext|>, nothing added by default."""
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.train_from_iterator(CORPUS, trainers.BpeTrainer(
        vocab_size=300, special_tokens=["<|endoftext|>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    tok.post_processor = processors.ByteLevel(trim_offsets=False)
    return tok, {"bos_token": "<|endoftext|>", "eos_token": "<|endoftext|>",
                 "unk_token": "<|endoftext|>", "tokenizer_class": "GPT2Tokenizer",
                 "add_prefix_space": False, "model_max_length": 1024}


def _metaspace() -> tuple[Tokenizer, dict[str, Any]]:
    """Llama 2 / Mistral: Metaspace BPE with <unk>; the file's post-processor adds BOS.
    (tokenizer_config's add_bos_token is ignored by transformers 5 when a tokenizer.json
    exists; test_config_add_bos_token_ignored shows the import follows that.)"""
    return metaspace_bpe(CORPUS, vocab_size=300), {
        "add_bos_token": True, "add_eos_token": False, "bos_token": "<s>", "eos_token": "</s>",
        "unk_token": "<unk>", "tokenizer_class": "PreTrainedTokenizerFast"}


STYLES = {"llama3": _llama3, "gpt2": _gpt2, "metaspace": _metaspace}


@pytest.fixture(scope="module")
def tok_server(tmp_path_factory: pytest.TempPathFactory
               ) -> Iterator[tuple[ServerHandle, dict[str, Path], dict[str, Any]]]:
    """A tiny Llama per style, with its tokenizer files, imported and served."""
    tmp = tmp_path_factory.mktemp("tok")
    dirs, llamas = {}, {}
    for i, (name, make) in enumerate(STYLES.items()):
        tok, config = make()
        src = tmp / "src" / name
        torch.manual_seed(i)
        model = tf.LlamaForCausalLM(tf.LlamaConfig(
            vocab_size=VOCAB, hidden_size=HIDDEN, intermediate_size=32, num_hidden_layers=1,
            num_attention_heads=2, max_position_embeddings=64)).eval()
        model.save_pretrained(src)
        tok.save(str(src / "tokenizer.json"))
        (src / "tokenizer_config.json").write_text(json.dumps(config))
        assert main(["hf", str(src), "--out", str(tmp / "models" / name / "1")]) == 0
        dirs[name], llamas[name] = src, model
    handle = start(tmp / "models", default_model="llama3", metrics_port=-1)
    yield handle, dirs, llamas
    handle.stop()


@pytest.mark.parametrize("style", list(STYLES))
def test_text_to_ids_equals_auto_tokenizer(
        tok_server: tuple[ServerHandle, dict[str, Path], dict[str, Any]], style: str) -> None:
    handle, dirs, _ = tok_server
    auto = tf.AutoTokenizer.from_pretrained(dirs[style])
    split = tf.AutoTokenizer.from_pretrained(dirs[style], split_special_tokens=True)
    with EmbeddingClient(handle.target) as c:
        for text in TEXTS:
            default = c.embed(text, model=style, compose="token")
            assert default.token_ids == split(text)["input_ids"], (style, text)
            allowed = c.embed(text, model=style, compose="token", allow_special_tokens=True)
            assert allowed.token_ids == auto(text)["input_ids"], (style, text)
            bare = c.embed(text, model=style, compose="token", add_special_tokens=False)
            assert bare.token_ids == split(text, add_special_tokens=False)["input_ids"]
            assert c.tokenize(text, model=style)[0] == default.token_ids
    first = auto(TEXTS[0])["input_ids"][0]
    if style == "gpt2":
        assert first != auto.convert_tokens_to_ids("<|endoftext|>")  # GPT-2 adds nothing
    else:
        assert first == auto.bos_token_id  # Llama 3 (post-processor), Llama 2 (config)


def test_special_strings_are_plain_text_by_default(
        tok_server: tuple[ServerHandle, dict[str, Path], dict[str, Any]]) -> None:
    """allow_special_tokens=False (the default) differs from HF on purpose: "<s>" typed by a
    user is text, not BOS. Documented in docs/importers.md."""
    handle, dirs, _ = tok_server
    auto = tf.AutoTokenizer.from_pretrained(dirs["metaspace"])
    with EmbeddingClient(handle.target) as c:
        plain = c.embed("a <s> b", model="metaspace").token_ids
        special = c.embed("a <s> b", model="metaspace", allow_special_tokens=True).token_ids
    bos = auto.bos_token_id
    assert special.count(bos) == 2
    assert plain.count(bos) == 1
    assert special == auto("a <s> b")["input_ids"]


def test_text_rows_equal_get_input_embeddings(
        tok_server: tuple[ServerHandle, dict[str, Path], dict[str, Any]]) -> None:
    handle, dirs, llamas = tok_server
    auto = tf.AutoTokenizer.from_pretrained(dirs["llama3"])
    ids = auto(TEXTS[0], return_tensors="pt")["input_ids"]  # (1, T)
    with EmbeddingClient(handle.target) as c:
        e = c.embed(TEXTS[0])  # default model: llama3, default compose
    with torch.no_grad():
        want = llamas["llama3"].get_input_embeddings()(ids)[0]  # (T, C)
    assert torch.equal(torch.from_numpy(np.array(e.array)), want)


def test_oip_add_special_tokens_parameter(
        tok_server: tuple[ServerHandle, dict[str, Path], dict[str, Any]]) -> None:
    handle, dirs, _ = tok_server
    auto = tf.AutoTokenizer.from_pretrained(dirs["llama3"])
    text = TEXTS[0].encode()
    tensor = oip.ModelInferRequest.InferInputTensor
    lengths = []
    for add in (None, False, True):
        request = oip.ModelInferRequest(model_name="llama3", inputs=[tensor(
            name="text", datatype="BYTES", shape=[1],
            contents=oip.InferTensorContents(bytes_contents=[text]))])
        if add is not None:
            request.parameters["add_special_tokens"].bool_param = add
        with grpc.insecure_channel(handle.target) as channel:
            reply = oip_grpc.GRPCInferenceServiceStub(channel).ModelInfer(request)
        lengths.append(list(reply.outputs[0].shape)[1])
    n = len(auto(TEXTS[0])["input_ids"])
    assert lengths == [n, n - 1, n]
    with grpc.insecure_channel(handle.target) as channel:
        meta = oip_grpc.GRPCInferenceServiceStub(channel).ModelMetadata(
            oip.ModelMetadataRequest(name="llama3"))
    assert meta.parameters["tokenizer"].string_param == "hf:tokenizer.json"
    assert meta.parameters["family"].string_param == "llama"


def test_tokenizer_json_is_hash_checked(
        tok_server: tuple[ServerHandle, dict[str, Path], dict[str, Any]],
        tmp_path: Path) -> None:
    _, dirs, _ = tok_server
    out = tmp_path / "m" / "1"
    assert main(["hf", str(dirs["gpt2"]), "--out", str(out)]) == 0
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["tokenizer"]["kind"] == "hf"
    assert manifest["provenance"]["tokenizer_check"].startswith(("matches AutoTokenizer",
                                                                  "AutoTokenizer ("))
    load_model("m", out, torch.device("cpu"), None)  # loads as written
    path = out / "tokenizer.json"
    path.chmod(0o644)
    path.write_text(path.read_text().replace('"<|endoftext|>"', '"<|eot|>"'))
    with pytest.raises(CheckpointError, match=r"tokenizer\.json: sha256"):
        load_model("m", out, torch.device("cpu"), None)


def test_emulation_is_what_was_tested(
        tok_server: tuple[ServerHandle, dict[str, Path], dict[str, Any]], tmp_path: Path) -> None:
    """The three styles above were served from the importer's own resolution of
    tokenizer.json + tokenizer_config.json (no transformers at serve time), checked
    against AutoTokenizer at import."""
    _, dirs, _ = tok_server
    for style, src in dirs.items():
        out = tmp_path / style / "1"
        assert main(["hf", str(src), "--out", str(out)]) == 0
        prov = json.loads((out / "manifest.json").read_text())["provenance"]
        assert prov["tokenizer_source"] == "tokenizer.json + tokenizer_config.json", style
        assert prov["tokenizer_check"].startswith("matches AutoTokenizer"), style


@pytest.mark.parametrize(("make", "patch", "cls"), [
    (_gpt2, {"add_prefix_space": True}, "GPT2Tokenizer"),
    (_metaspace, {"tokenizer_class": "LlamaTokenizer"}, "LlamaTokenizer")])
def test_auto_tokenizer_wins(make: Any, patch: dict[str, Any], cls: str,
                             tmp_path: Path) -> None:
    """Where transformers' tokenizer class rebuilds the tokenizer its own way (GPT-2's
    add_prefix_space, LlamaTokenizer's own normalisation), the import detects that the
    files alone encode differently and stores AutoTokenizer's backend instead."""
    tok, config = make()
    src = tmp_path / "src"
    src.mkdir()
    tok.save(str(src / "tokenizer.json"))
    (src / "tokenizer_config.json").write_text(json.dumps({**config, **patch}))
    tf.LlamaForCausalLM(tf.LlamaConfig(
        vocab_size=VOCAB, hidden_size=HIDDEN, intermediate_size=32, num_hidden_layers=1,
        num_attention_heads=2, max_position_embeddings=64)).save_pretrained(src)
    out = tmp_path / "m" / "1"
    assert main(["hf", str(src), "--out", str(out)]) == 0
    prov = json.loads((out / "manifest.json").read_text())["provenance"]
    assert prov["tokenizer_source"] == "AutoTokenizer backend"
    assert prov["tokenizer_check"].startswith(f"AutoTokenizer ({cls}) differed")
    auto = tf.AutoTokenizer.from_pretrained(src)
    served = load_model("m", out, torch.device("cpu"), None).tokenizer
    raw = Tokenizer.from_file(str(src / "tokenizer.json"))
    assert any(raw.encode(t).ids != auto(t)["input_ids"] for t in TEXTS)  # they do differ
    for text in TEXTS:
        assert served.encode(text, allow_special_tokens=True) == auto(text)["input_ids"]


def test_embedctl_add_special_tokens_flag(
        tok_server: tuple[ServerHandle, dict[str, Path], dict[str, Any]],
        capsys: pytest.CaptureFixture[str]) -> None:
    handle, dirs, _ = tok_server
    auto = tf.AutoTokenizer.from_pretrained(dirs["llama3"])
    t = ["--target", handle.target, "embed", TEXTS[0], "--model", "llama3"]
    for flag, add in ((), True), (("--no-add-special-tokens",), False):
        assert cli_main([*t, *flag]) == 0
        lines = capsys.readouterr().out.splitlines()
        assert f"token_ids {auto(TEXTS[0], add_special_tokens=add)['input_ids']}" in lines


def test_tokenize_returns_each_tokens_bytes(
        tok_server: tuple[ServerHandle, dict[str, Path], dict[str, Any]]) -> None:
    """Byte-level tokens carry raw bytes (a CJK character or emoji may span tokens): their
    concatenation is the text's UTF-8, and Detokenize gives the text back."""
    handle, _, _ = tok_server
    with EmbeddingClient(handle.target) as c:
        for text in TEXTS[:7]:
            ids, tokens = c.tokenize(text, model="gpt2")
            assert b"".join(tokens) == text.encode(), text
            assert c.detokenize(ids, model="gpt2") == text
        ids, tokens = c.tokenize("a cat", model="llama3")
    assert tokens[0] == b"<|begin_of_text|>"
    assert b"".join(tokens[1:]) == b"a cat"

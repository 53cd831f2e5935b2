"""Tiny random Hugging Face models of every supported family, built from configs (no network).

Every parameter is redrawn at random (not HF's init, which leaves LayerNorms at 1 and 0
and would hide a missing weight or bias), then saved with ``save_pretrained`` (safetensors).
``served_models`` imports a set of them with the real importer and serves them, and
``served_rows`` asks that server for rows, to hold against ``reference``.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
import transformers as tf
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers

from client import EmbeddingClient
from service.local import ServerHandle
from tests.tiny_model import start
from training.importers import main as import_main

__all__ = ["DISCOVERY_MODELS", "FAMILY_MODELS", "HIDDEN", "LEARNED", "MAX_POS", "OUTSIDE_MODELS",
           "VOCAB", "build", "metaspace_bpe", "one_thread", "reference", "save", "served_models",
           "served_rows"]

VOCAB = 96
HIDDEN = 24  # sqrt(24) = 4.898979...: Gemma's scale is not exact in bf16 (4.90625)
MAX_POS = 40
_LAYERS = {"num_hidden_layers": 1, "num_attention_heads": 2}
_DECODER = {"hidden_size": HIDDEN, "intermediate_size": 32, "vocab_size": VOCAB,
            "max_position_embeddings": MAX_POS, "bos_token_id": 1, "eos_token_id": 2,
            "pad_token_id": 0, "num_key_value_heads": 2, "head_dim": 12, **_LAYERS}

# name -> (model class, config). The *ForCausalLM / *ForMaskedLM classes save their
# tensors under a prefix (model., transformer., bert.); the base classes without one.
FAMILY_MODELS: dict[str, tuple[Callable[[Any], Any], Any]] = {
    "gpt2": (tf.GPT2LMHeadModel, tf.GPT2Config(
        vocab_size=VOCAB, n_embd=HIDDEN, n_layer=1, n_head=2, n_positions=MAX_POS,
        bos_token_id=1, eos_token_id=2)),
    "opt": (tf.OPTForCausalLM, tf.OPTConfig(
        vocab_size=VOCAB, hidden_size=HIDDEN, ffn_dim=32, max_position_embeddings=MAX_POS,
        word_embed_proj_dim=HIDDEN, **_LAYERS)),
    "opt-proj": (tf.OPTModel, tf.OPTConfig(  # opt-350m's shape: 8-wide rows, project_in
        vocab_size=VOCAB, hidden_size=HIDDEN, ffn_dim=32, max_position_embeddings=MAX_POS,
        word_embed_proj_dim=8, **_LAYERS)),
    "llama": (tf.LlamaForCausalLM, tf.LlamaConfig(**_DECODER)),
    "mistral": (tf.MistralForCausalLM, tf.MistralConfig(**_DECODER)),
    "qwen2": (tf.Qwen2ForCausalLM, tf.Qwen2Config(**_DECODER)),
    "gemma": (tf.GemmaForCausalLM, tf.GemmaConfig(**_DECODER)),
    "phi3": (tf.Phi3ForCausalLM, tf.Phi3Config(**_DECODER)),
    "gpt_neox": (tf.GPTNeoXForCausalLM, tf.GPTNeoXConfig(**_DECODER)),
    "bloom": (tf.BloomModel, tf.BloomConfig(vocab_size=VOCAB, hidden_size=HIDDEN, n_layer=1,
                                            n_head=2)),
    "falcon": (tf.FalconForCausalLM, tf.FalconConfig(
        vocab_size=VOCAB, hidden_size=HIDDEN, max_position_embeddings=MAX_POS, **_LAYERS)),
    "bert": (tf.BertModel, tf.BertConfig(vocab_size=VOCAB, hidden_size=HIDDEN,
                                         intermediate_size=32,
                                         max_position_embeddings=MAX_POS, **_LAYERS)),
}
# Families whose hidden_states[0] depends on position_ids (a learned table); the others
# are given position_ids too, and their hidden_states[0] must not depend on them.
LEARNED = {"gpt2", "opt", "opt-proj", "bert"}


def build(name: str, seed: int = 0, dtype: torch.dtype = torch.float32) -> Any:
    """The family's tiny model, every parameter random, in eval mode and ``dtype`` (any
    name of FAMILY_MODELS, DISCOVERY_MODELS or OUTSIDE_MODELS)."""
    cls, config = {**OUTSIDE_MODELS, **DISCOVERY_MODELS, **FAMILY_MODELS}[name]
    torch.manual_seed(seed)
    model = cls(config).eval()
    with torch.no_grad():
        for p in model.parameters():
            p.normal_(0.0, 0.5)
    return model.to(dtype)


def save(model: Any, out: Path, max_shard_size: str | None = None) -> Path:
    """``save_pretrained`` with safetensors (sharded when ``max_shard_size`` is given)."""
    kwargs = {} if max_shard_size is None else {"max_shard_size": max_shard_size}
    model.save_pretrained(out, **kwargs)
    return out


def reference(model: Any, name: str, ids: list[int], start: int) -> tuple[torch.Tensor,
                                                                           torch.Tensor]:
    """The oracle: (hidden_states[0] at positions start.., get_input_embeddings()(ids))."""
    x = torch.tensor([ids])  # (1, T)
    kwargs: dict[str, Any] = {"output_hidden_states": True}
    if "position_ids" in inspect.signature(model.forward).parameters:  # not BLOOM (ALiBi)
        kwargs["position_ids"] = torch.arange(start, start + len(ids)).unsqueeze(0)  # (1, T)
    with torch.no_grad():
        hidden = model(input_ids=x, **kwargs).hidden_states[0][0]  # (T, C)
        token = model.get_input_embeddings()(x)[0]  # (T, dim)
    return hidden, token


def metaspace_bpe(corpus: list[str], vocab_size: int) -> Tokenizer:
    """Llama 2 / Mistral's tokenizer shape, trained on ``corpus``: a Metaspace BPE with
    <unk>, <s> and </s> (ids 0, 1, 2), whose file's post-processor adds BOS."""
    tok = Tokenizer(models.BPE(unk_token="<unk>", fuse_unk=True))
    tok.pre_tokenizer = pre_tokenizers.Metaspace(replacement="▁", prepend_scheme="first")
    tok.decoder = decoders.Metaspace(replacement="▁", prepend_scheme="first")
    tok.train_from_iterator(corpus, trainers.BpeTrainer(
        vocab_size=vocab_size, special_tokens=["<unk>", "<s>", "</s>"]))
    tok.post_processor = processors.TemplateProcessing(
        single="<s> $A", pair="<s> $A <s> $B:1", special_tokens=[("<s>", 1)])
    return tok


@contextmanager
def served_models(tmp: Path, models: Mapping[str, tuple[str, torch.dtype]], default_model: str,
                  prepare: Callable[[Path], object] = lambda src: None
                  ) -> Iterator[tuple[ServerHandle, dict[str, Any]]]:
    """Each of ``models`` (name -> (family, dtype)) built with its own seed (its place in
    ``models``), saved under ``tmp/src/<name>`` and handed to ``prepare``, imported by the
    real importer into ``tmp/models`` and served there by one server; yields the server and
    the transformers models by name."""
    built: dict[str, Any] = {}
    for seed, (name, (family, dtype)) in enumerate(models.items()):
        built[name] = build(family, seed=seed, dtype=dtype)
        src = save(built[name], tmp / "src" / name)
        prepare(src)
        args = ["hf", str(src), "--out", str(tmp / "models" / name / "1")]
        if family == "bloom":  # ALiBi: no max_position_embeddings in its config
            args += ["--max-seq-len", str(MAX_POS)]
        assert import_main(args) == 0
    with start(tmp / "models", default_model=default_model, metrics_port=-1) as handle:
        yield handle, built


def served_rows(handle: ServerHandle, model: str, ids: list[int], **options: Any
                ) -> torch.Tensor:
    """The server's rows for ``ids`` (T, C) as float32 (bf16 widened exactly)."""
    with EmbeddingClient(handle.target) as c:
        e = c.embed(ids=ids, model=model, **options)
    return torch.from_numpy(np.array(e.array))


@pytest.fixture(autouse=True)
def one_thread() -> Iterator[None]:
    """Autouse where imported: the reference runs with the server's torch thread count
    (--torch-threads, 1 here). OPT's project_in is a GEMM, and a GEMM's rounding depends on
    how it is split across threads (test_families.test_project_in_depends_on_threads);
    torch.set_num_threads is per thread."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


# Families without a hand-written entry: imported through discovery only. Decoders with
# and without scaled embeddings, rotary or learned positions, and multimodal checkpoints
# whose language model is nested (text_config). name -> (model class, config).
_EMBED = 8  # embedding_size of the projected encoders: narrower than HIDDEN
_ENCODER = {"vocab_size": VOCAB, "hidden_size": HIDDEN, "intermediate_size": 32,
            "max_position_embeddings": MAX_POS, **_LAYERS}
_VISION = {"hidden_size": 16, "intermediate_size": 16, "num_hidden_layers": 1,
           "num_attention_heads": 2, "image_size": 28, "patch_size": 14}
_TEXT = {k: v for k, v in _DECODER.items() if k != "pad_token_id"}
DISCOVERY_MODELS: dict[str, tuple[Callable[[Any], Any], Any]] = {
    "qwen3": (tf.Qwen3ForCausalLM, tf.Qwen3Config(**_DECODER)),
    "olmo2": (tf.Olmo2ForCausalLM, tf.Olmo2Config(**_DECODER)),
    "starcoder2": (tf.Starcoder2ForCausalLM, tf.Starcoder2Config(**_DECODER)),
    "stablelm": (tf.StableLmForCausalLM, tf.StableLmConfig(**_DECODER,
                                                           partial_rotary_factor=0.5)),
    "gemma2": (tf.Gemma2ForCausalLM, tf.Gemma2Config(**_DECODER)),  # scaled, in the module
    "granite": (tf.GraniteForCausalLM, tf.GraniteConfig(  # scaled after the module
        **_DECODER, embedding_multiplier=0.15)),
    "gpt_neo": (tf.GPTNeoForCausalLM, tf.GPTNeoConfig(  # learned positions
        vocab_size=VOCAB, hidden_size=HIDDEN, num_layers=1, num_heads=2,
        attention_types=[[["global"], 1]], max_position_embeddings=MAX_POS,
        bos_token_id=1, eos_token_id=2)),
    "gpt_bigcode": (tf.GPTBigCodeForCausalLM, tf.GPTBigCodeConfig(  # learned positions
        vocab_size=VOCAB, n_embd=HIDDEN, n_layer=1, n_head=2, n_positions=MAX_POS,
        bos_token_id=1, eos_token_id=2)),
    "biogpt": (tf.BioGptForCausalLM, tf.BioGptConfig(  # learned offset 2, scaled
        vocab_size=VOCAB, hidden_size=HIDDEN, intermediate_size=32,
        max_position_embeddings=MAX_POS, **_LAYERS)),
    "gemma3": (tf.Gemma3ForConditionalGeneration, tf.Gemma3Config(  # nested, scaled
        text_config=tf.Gemma3TextConfig(**_TEXT), vision_config=tf.SiglipVisionConfig(**_VISION),
        mm_tokens_per_image=4, image_token_index=VOCAB - 1, boi_token_index=VOCAB - 2,
        eoi_token_index=VOCAB - 3)),
    "llava": (tf.LlavaForConditionalGeneration, tf.LlavaConfig(  # nested Llama
        text_config=tf.LlamaConfig(**_TEXT), vision_config=tf.CLIPVisionConfig(**_VISION),
        image_token_index=VOCAB - 1)),
    "mistral3": (tf.Mistral3ForConditionalGeneration, tf.Mistral3Config(  # nested Mistral
        text_config=tf.MistralConfig(**_TEXT),
        vision_config=tf.PixtralVisionConfig(**_VISION, head_dim=8),
        image_token_index=VOCAB - 1)),
    "cohere": (tf.CohereForCausalLM, tf.CohereConfig(**_DECODER)),
    "smollm3": (tf.SmolLM3ForCausalLM, tf.SmolLM3Config(**_DECODER)),
    "qwen3_moe": (tf.Qwen3MoeForCausalLM, tf.Qwen3MoeConfig(
        **_DECODER, num_experts=4, num_experts_per_tok=2, moe_intermediate_size=16)),
    # The context length under another key than max_position_embeddings (MPT: max_seq_len)
    "mpt": (tf.MptForCausalLM, tf.MptConfig(
        vocab_size=VOCAB, d_model=HIDDEN, n_heads=2, n_layers=1, max_seq_len=MAX_POS,
        expansion_ratio=2)),
    # Encoders whose embedding (width embedding_size) is projected to the hidden size by a
    # Linear with a bias after its LayerNorm, inside the embeddings or after them.
    "albert": (tf.AlbertForMaskedLM, tf.AlbertConfig(**_ENCODER, embedding_size=_EMBED)),
    "electra": (tf.ElectraModel, tf.ElectraConfig(**_ENCODER, embedding_size=_EMBED)),
    "convbert": (tf.ConvBertModel, tf.ConvBertConfig(  # + positions before the type row
        **_ENCODER, embedding_size=_EMBED)),
    "roformer": (tf.RoFormerModel, tf.RoFormerConfig(  # rotary: no position table
        **_ENCODER, embedding_size=_EMBED)),
    "squeezebert": (tf.SqueezeBertModel, tf.SqueezeBertConfig(  # positions, then the type
        **_ENCODER, embedding_size=HIDDEN)),
}
# Families whose embeddings are no composition of the rules the server applies.
OUTSIDE_MODELS: dict[str, tuple[Callable[[Any], Any], Any]] = {
    # a projection of the token rows with a bias, then MobileBERT's NoNorm (w * x + b)
    "mobilebert": (tf.MobileBertModel, tf.MobileBertConfig(
        **_ENCODER, embedding_size=_EMBED, intra_bottleneck_size=8, true_hidden_size=8,
        num_feedforward_networks=1)),
}

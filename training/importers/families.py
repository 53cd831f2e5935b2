"""The supported Hugging Face families: one explicit entry per ``model_type``.

Each entry says which tensors the input embeddings need (HF name -> our name, for the base
model and for its task heads' prefixes), where its sizes are in config.json, and its rules
(``service.format.rules``). A ``model_type`` not listed here is refused: the importer never
guesses from tensor names, because a family named like Llama can still scale or normalise
its embeddings (Gemma does).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from service.format.rules import Rules

__all__ = ["FAMILIES", "Family", "supported"]


def _names(prefixes: tuple[str, ...], table: Mapping[str, str]) -> dict[str, str]:
    """The same tensors under each head's prefix ("" = the base model's own save)."""
    return {f"{prefix}{src}": ours for prefix in prefixes for src, ours in table.items()}


def _no_rules(config: Mapping[str, Any]) -> Rules:
    return Rules()


@dataclass(frozen=True)
class Family:
    """How one ``model_type`` lays out and composes its input embeddings."""

    model_type: str
    names: dict[str, str]  # HF tensor name -> our name (explicit; nothing is guessed)
    hidden_keys: tuple[str, ...]  # config keys of the hidden size, first found wins
    # config keys of the context length; () = config has none: --max-seq-len is required
    max_seq_len_keys: tuple[str, ...]
    positions: str  # "learned" or how the model positions tokens inside attention
    rules: Callable[[Mapping[str, Any]], Rules] = _no_rules
    token_width_key: str = ""  # config key of the token rows' width when not hidden (OPT)

    def wanted(self, rules: Rules) -> list[str]:
        """Our names this model needs, given its rules."""
        out = ["token_embedding"]
        if self.positions == "learned":
            out.append("position_embedding")
        out += ["token_type_embedding"] if rules.token_type else []
        return out + [t for t in rules.tensors() if t != "token_type_embedding"]


_DECODER = ("", "model.")  # LlamaModel saves embed_tokens.weight; *ForCausalLM model.embed_...
_ROPE = {"embed_tokens.weight": "token_embedding"}


def _opt_rules(config: Mapping[str, Any]) -> Rules:
    # OPTLearnedPositionalEmbedding looks up position_ids + 2; project_in exists only when
    # the token rows are narrower than the hidden size (opt-350m).
    project = config.get("word_embed_proj_dim", config["hidden_size"]) != config["hidden_size"]
    return Rules(position_offset=2, project_in=project)


def _gemma_rules(config: Mapping[str, Any]) -> Rules:
    # GemmaTextScaledWordEmbedding: embed(ids) * tensor(hidden_size ** 0.5).to(weight dtype)
    return Rules(embed_scale=float(config["hidden_size"]) ** 0.5)


def _bloom_rules(config: Mapping[str, Any]) -> Rules:
    return Rules(layernorm_eps=float(config.get("layer_norm_epsilon", 1e-5)))


def _bert_rules(config: Mapping[str, Any]) -> Rules:
    return Rules(token_type=True, layernorm_eps=float(config.get("layer_norm_eps", 1e-12)))


FAMILIES: dict[str, Family] = {f.model_type: f for f in (
    Family("gpt2", _names(("", "transformer."), {"wte.weight": "token_embedding",
                                                 "wpe.weight": "position_embedding"}),
           ("n_embd", "hidden_size"), ("n_positions", "n_ctx"), "learned"),
    Family("opt", _names(("", "model."), {
        "decoder.embed_tokens.weight": "token_embedding",
        "decoder.embed_positions.weight": "position_embedding",
        "decoder.project_in.weight": "project_in_weight"}),
           ("hidden_size",), ("max_position_embeddings",), "learned", _opt_rules,
           token_width_key="word_embed_proj_dim"),
    Family("llama", _names(_DECODER, _ROPE), ("hidden_size",), ("max_position_embeddings",),
           "rotary"),
    Family("mistral", _names(_DECODER, _ROPE), ("hidden_size",),
           ("max_position_embeddings",), "rotary"),
    Family("qwen2", _names(_DECODER, _ROPE), ("hidden_size",), ("max_position_embeddings",),
           "rotary"),
    Family("gemma", _names(_DECODER, _ROPE), ("hidden_size",), ("max_position_embeddings",),
           "rotary", _gemma_rules),
    Family("phi3", _names(_DECODER, _ROPE), ("hidden_size",), ("max_position_embeddings",),
           "rotary"),
    Family("gpt_neox", _names(("", "gpt_neox."), {"embed_in.weight": "token_embedding"}),
           ("hidden_size",), ("max_position_embeddings",), "rotary"),
    Family("bloom", _names(("", "transformer."), {
        "word_embeddings.weight": "token_embedding",
        "word_embeddings_layernorm.weight": "layernorm_weight",
        "word_embeddings_layernorm.bias": "layernorm_bias"}),
           ("hidden_size", "n_embed"), (), "alibi", _bloom_rules),
    Family("falcon", _names(("", "transformer."), {"word_embeddings.weight": "token_embedding"}),
           ("hidden_size",), ("max_position_embeddings",), "rotary or alibi"),
    Family("bert", _names(("", "bert."), {
        "embeddings.word_embeddings.weight": "token_embedding",
        "embeddings.position_embeddings.weight": "position_embedding",
        "embeddings.token_type_embeddings.weight": "token_type_embedding",
        "embeddings.LayerNorm.weight": "layernorm_weight",
        "embeddings.LayerNorm.bias": "layernorm_bias"}),
           ("hidden_size",), ("max_position_embeddings",), "learned", _bert_rules),
)}


def supported() -> str:
    """The supported model types, for messages."""
    return ", ".join(sorted(FAMILIES))

"""A family's embedding rules: what its first block reads besides ``token_table[ids]``.

Recorded in manifest.json (``family``, ``rules``) by the importer and applied by the
server's tables (``service.engine.tables``) at serve time. Each rule mirrors one line of
the reference model (transformers, the version pinned for tests):

=================  ============================================  =======================
rule               reference                                     tensors in embeddings.safetensors
=================  ============================================  =======================
position_offset    OPT: ``embed_positions(position_ids + 2)``    (position_embedding has
                                                                 max_seq_len + 2 rows)
embed_scale        Gemma: ``embed(ids) * normalizer`` with the   none
                   normalizer cast to the table's dtype; part
                   of ``get_input_embeddings()`` in transformers 5;
                   ``embed_scale_float``: BioGPT's module multiplies
                   by a Python float instead (fp32 math, one
                   rounding to the table's dtype)
input_scale        Granite: ``inputs_embeds * embedding_multiplier``  none
                   after ``get_input_embeddings()``, by a Python
                   float (computed in fp32, rounded once to the
                   table's dtype)
project_in         OPT: ``project_in(embed(ids))`` when          project_in_weight
                   word_embed_proj_dim != hidden_size            [hidden_size, dim]
token_type         BERT: ``+ token_type_embeddings(0)``          token_type_embedding
                   (before the position rows);                   [1, hidden_size]
                   ``token_type_last``: ConvBERT, SqueezeBERT
                   add it after them (``inputs_embeds + pos +
                   type``: another rounding)
layernorm          BLOOM ``word_embeddings_layernorm``, BERT     layernorm_weight,
                   ``embeddings.LayerNorm`` (after the sums)     layernorm_bias [hidden_size]
project_hidden     ALBERT ``embedding_hidden_mapping_in``,       project_hidden_weight
                   ELECTRA ``embeddings_project``: a Linear      [hidden_size, dim],
                   with a bias after the LayerNorm, where        project_hidden_bias
                   embedding_size (dim) != hidden_size; the      [hidden_size]
                   rows before it (positions, token type,
                   LayerNorm) have the width dim
=================  ============================================  =======================
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

__all__ = ["RULE_NAMES", "RULE_TENSORS", "Rules"]

RULE_NAMES = ("position_offset", "embed_scale", "input_scale", "project_in", "token_type",
              "layernorm", "project_hidden")
# The extra tensors each rule needs, by their name in embeddings.safetensors.
RULE_TENSORS: dict[str, tuple[str, ...]] = {
    "project_in": ("project_in_weight",),
    "token_type": ("token_type_embedding",),
    "layernorm": ("layernorm_weight", "layernorm_bias"),
    "project_hidden": ("project_hidden_weight", "project_hidden_bias"),
}


@dataclass(frozen=True)
class Rules:
    """One model's rules; the default (all off) is a plain lookup (GPT-2, Llama, ...)."""

    position_offset: int = 0  # OPT: row of position p is p + 2
    embed_scale: float | None = None  # Gemma: sqrt(hidden_size), cast to the table dtype
    # BioGPT: the embedding module multiplies by a Python float (fp32 math, one rounding)
    # instead of a tensor cast to the table's dtype (Gemma). Only with embed_scale.
    embed_scale_float: bool = False
    # Granite: a multiplier applied after get_input_embeddings() (not part of token-only
    # rows), by a Python float: the product is computed in fp32 and rounded once.
    input_scale: float | None = None
    project_in: bool = False  # OPT-350m: token rows [dim] -> [hidden_size] by a matmul
    token_type: bool = False  # BERT: add token-type row 0
    token_type_last: bool = False  # ConvBERT: the row is added after the position rows
    layernorm_eps: float | None = None  # BLOOM, BERT: LayerNorm(eps) after the sum
    project_hidden: bool = False  # ALBERT, ELECTRA: Linear(dim -> hidden_size) + bias, last

    @property
    def computes(self) -> bool:
        """True when the rows need more than a gather and a position add (the fast path)."""
        return (self.embed_scale is not None or self.input_scale is not None
                or self.project_in or self.token_type
                or self.layernorm_eps is not None or self.project_hidden)

    @property
    def position_width_is_dim(self) -> bool:
        """True when the position rows have the token rows' width (dim), not the hidden
        size: they are added before ``project_hidden`` maps dim to the hidden size."""
        return self.project_hidden

    def names(self) -> list[str]:
        """The rules that are on, in the order the reference applies them."""
        on = {"position_offset": self.position_offset != 0,
              "embed_scale": self.embed_scale is not None,
              "input_scale": self.input_scale is not None, "project_in": self.project_in,
              "token_type": self.token_type, "layernorm": self.layernorm_eps is not None,
              "project_hidden": self.project_hidden}
        return [name for name in RULE_NAMES if on[name]]

    def tensors(self) -> list[str]:
        """The extra tensors these rules read from embeddings.safetensors."""
        return [t for name in self.names() for t in RULE_TENSORS.get(name, ())]

    def to_dict(self) -> dict[str, Any]:
        """JSON form (only the rules that are on), as in manifest.json."""
        d: dict[str, Any] = {}
        if self.position_offset:
            d["position_offset"] = self.position_offset
        if self.embed_scale is not None:
            d["embed_scale"] = self.embed_scale
            if self.embed_scale_float:
                d["embed_scale_float"] = True
        if self.input_scale is not None:
            d["input_scale"] = self.input_scale
        if self.project_in:
            d["project_in"] = True
        if self.token_type:
            d["token_type"] = True
            if self.token_type_last:
                d["token_type_last"] = True
        if self.layernorm_eps is not None:
            d["layernorm"] = {"eps": self.layernorm_eps}
        if self.project_hidden:
            d["project_hidden"] = True
        return d

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> Rules:
        """Parse the manifest's ``rules`` object (ValueError names an unknown rule)."""
        unknown = sorted(set(d) - set(RULE_NAMES) - {"embed_scale_float", "token_type_last"})
        if unknown:
            raise ValueError(f"rules {unknown} are not known (known: {list(RULE_NAMES)})")
        layernorm = d.get("layernorm")
        offset = int(d.get("position_offset", 0))
        if offset < 0:
            raise ValueError(f"rules.position_offset={offset} must be >= 0")
        if d.get("project_in") and d.get("project_hidden"):
            raise ValueError("rules project_in and project_hidden exclude each other")
        return cls(position_offset=offset,
                   embed_scale=None if d.get("embed_scale") is None else float(d["embed_scale"]),
                   embed_scale_float=bool(d.get("embed_scale_float", False)),
                   input_scale=None if d.get("input_scale") is None else float(d["input_scale"]),
                   project_in=bool(d.get("project_in", False)),
                   token_type=bool(d.get("token_type", False)),
                   token_type_last=bool(d.get("token_type_last", False)),
                   layernorm_eps=None if layernorm is None else float(layernorm["eps"]),
                   project_hidden=bool(d.get("project_hidden", False)))

    def describe(self) -> str:
        """One line for logs, ModelInfo and ``embedctl info``: e.g. "embed_scale=45.25"."""
        d = self.to_dict()
        parts = []
        for name in self.names():
            value = d[name]
            if name == "layernorm":
                parts.append(f"layernorm(eps={value['eps']:g})")
            elif name == "embed_scale" and self.embed_scale_float:
                parts.append(f"embed_scale={value:g} (fp32)")
            elif name == "token_type" and self.token_type_last:
                parts.append("token_type (after positions)")
            elif value is True:
                parts.append(name)
            else:
                parts.append(f"{name}={value:g}")
        return ", ".join(parts) or "none"

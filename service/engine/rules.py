"""A family's rules applied to gathered rows: the slow path of ``EmbeddingTables``.

Only models whose manifest has a computing rule (``Rules.computes``: Gemma's or Granite's
scale, OPT's ``project_in``, BERT's token-type row, a LayerNorm) come here; GPT-2, Llama and
the other plain lookups keep the fast gather(+add) path in ``tables``.

Every rule runs in the table's dtype with the reference's own torch op, in the
reference's order, so a bf16 model served in bf16 rounds where transformers rounds:

    x = token_table[ids]                    # (N, dim)    nn.Embedding
    x = x * scale.to(table dtype)           # (N, dim)    Gemma (part of get_input_embeddings)
    x = x * float(scale)                    # (N, dim)    BioGPT (embed_scale_float: fp32 math)
    -- COMPOSE_TOKEN_ONLY stops here: exactly get_input_embeddings()(ids) --
    x = x * input_scale                     # (N, dim)    Granite: a Python float (fp32 math)
    x = F.linear(x, project_in_weight)      # (N, C)      OPT-350m
    x = x + token_type_row                  # (N, C)      BERT: inputs_embeds + token_type(0)
    x = x + position_table[positions]       # (N, C)      learned positions
    (token_type_last: the position rows first, then the token-type row: ConvBERT)
    x = F.layer_norm(x, (C,), w, b, eps)    # (N, C)      BLOOM, BERT
    x = F.linear(x, W, bias)                # (N, H)      ALBERT, ELECTRA: project_hidden
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
import torch.nn.functional as F

from service.format.rules import Rules

__all__ = ["RuleTables"]

_TOKEN_ONLY = 1  # embedding.v1.COMPOSE_TOKEN_ONLY (tables needs no generated code)
_POSITION_ONLY = 2


class RuleTables:
    """The rules' tensors on the tables' device, in the tables' dtype."""

    def __init__(self, rules: Rules, tensors: dict[str, torch.Tensor], device: torch.device,
                 dtype: torch.dtype) -> None:
        self.rules = rules
        on = {k: v.to(device=device, dtype=dtype) for k, v in tensors.items()}
        # The reference multiplies by torch.tensor(sqrt(hidden)) cast to the weight's
        # dtype: the scale rounds to bf16 (16.0 -> 16.0, 45.2548 -> 45.25) in a bf16 model.
        self.scale = (None if rules.embed_scale is None
                      else torch.tensor(rules.embed_scale).to(device=device, dtype=dtype))
        self.scale_float = rules.embed_scale if rules.embed_scale_float else None
        # Granite multiplies by a Python float: torch computes that product in fp32 (its
        # opmath) and rounds once, so the scale is kept a float, never cast to the dtype.
        self.input_scale = rules.input_scale
        self.project_in = on.get("project_in_weight")  # (C, dim)
        self.token_type = on.get("token_type_embedding")  # (1, C)
        self.ln_weight = on.get("layernorm_weight")  # (C,)
        self.ln_bias = on.get("layernorm_bias")  # (C,)
        self.project_hidden = on.get("project_hidden_weight")  # (H, C)
        self.project_hidden_bias = on.get("project_hidden_bias")  # (H,)

    def token_rows(self, token_table: torch.Tensor, ids: torch.Tensor) -> torch.Tensor:
        """``get_input_embeddings()(ids)``: the gathered rows, scaled where the family
        scales inside its embedding module (Gemma)."""
        x = torch.index_select(token_table, 0, ids)  # (N, dim)
        if self.scale_float is not None:
            x = x * self.scale_float  # (N, dim), a Python float: fp32 math, one rounding
        elif self.scale is not None:
            x = x * self.scale  # (N, dim), rounded in the table dtype like the reference
        return x

    def compose(self, token_table: torch.Tensor, position_table: torch.Tensor | None,
                ids: torch.Tensor, positions: torch.Tensor, spans: Sequence[tuple[int, int]],
                compose: int) -> torch.Tensor:
        """The rows for ``compose`` in the table dtype: (N, dim) token-only, else (N, C)."""
        if compose == _POSITION_ONLY:
            assert position_table is not None
            return torch.index_select(position_table, 0, positions)  # (N, C)
        x = self.token_rows(token_table, ids)  # (N, dim)
        if compose == _TOKEN_ONLY:
            return x
        if self.input_scale is not None:
            x = x * self.input_scale  # (N, dim), one rounding, as the reference's
        if self.project_in is not None:
            # One matmul per sequence, as the reference runs one sequence: a GEMM's
            # rounding may depend on how many rows it is given.
            x = torch.cat([F.linear(part, self.project_in)  # (T, C)
                           for part in torch.split(x, [T for _, T in spans])])  # (N, C)
        # Two sums round differently in another order: each family's own order is kept.
        if self.token_type is not None and not self.rules.token_type_last:
            x = x + self.token_type  # (N, C)
        if position_table is not None:
            x = x + torch.index_select(position_table, 0, positions)  # (N, C)
        if self.token_type is not None and self.rules.token_type_last:
            x = x + self.token_type  # (N, C)
        if self.ln_weight is not None:
            assert self.rules.layernorm_eps is not None
            assert self.ln_bias is not None
            x = F.layer_norm(x, (x.shape[1],), self.ln_weight, self.ln_bias,
                             self.rules.layernorm_eps)  # (N, C)
        if self.project_hidden is not None:
            # One matmul (with its bias) per sequence, as for project_in.
            x = torch.cat([F.linear(part, self.project_hidden, self.project_hidden_bias)
                           for part in torch.split(x, [T for _, T in spans])])  # (N, H)
        return x

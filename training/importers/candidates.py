"""The rule vocabulary's candidates for one model: roles for the parameters its embeddings
are computed from, and the constants a scale may be.

Each parameter besides the token table gets its role from its module (an ``nn.Embedding``
is a position table at offsets 0..4 or a token-type table, added before or after the
positions; an ``nn.LayerNorm`` with a bias the LayerNorm after the sums; an ``nn.Linear``
without one the input projection, with one the projection to the hidden size after the
LayerNorm); anything else is refused here. Scales are estimated from the fp32 outputs. Which
candidate is right is decided by ``discovery``, bit for bit, never here.
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from service.format.rules import Rules
from training.importers.reference import Reference
from training.importers.source import ImporterError

__all__ = ["Candidate", "candidates", "scales"]

_OFFSETS = range(5)  # learned-position offsets tried (OPT, BioGPT: 2)


@dataclass(frozen=True)
class Candidate:
    """One rule of the vocabulary with its tensors (model parameter names)."""

    rules: Rules
    position: str | None = None  # parameter name of the learned position table
    token_type: str | None = None
    project_in: str | None = None
    layernorm: tuple[str, str] | None = None  # (weight, bias)
    project_hidden: tuple[str, str] | None = None  # (weight, bias)

    def describe(self) -> str:
        """For messages."""
        extra = f", positions from {self.position}" if self.position else ""
        return f"rules {self.rules.describe()!r}{extra}"


def scales(reference: torch.Tensor, base: torch.Tensor, config: Any) -> list[float]:
    """Constants c with reference ~= base * c: the ratio's fp32 value and its neighbours,
    and the config's own numbers and sqrt(hidden_size) where they round to it."""
    mask = base.double().abs() > 1e-3
    if not bool(mask.any()):
        return []
    ratio = float((reference.double()[mask] / base.double()[mask]).median())
    if not math.isfinite(ratio) or ratio == 0:
        return []
    near = [float(v) for v in vars(config).values()
            if isinstance(v, (int, float)) and not isinstance(v, bool)]
    hidden = getattr(config, "hidden_size", None)
    if isinstance(hidden, int):
        near.append(hidden ** 0.5)
    exact = [v for v in near if v and abs(v / ratio - 1) < 1e-3]
    r32 = torch.tensor(ratio, dtype=torch.float32)
    steps = [r32]
    for direction in (math.inf, -math.inf):
        x = r32
        for _ in range(2):
            x = torch.nextafter(x, torch.tensor(direction, dtype=torch.float32))
            steps.append(x)
    return list(dict.fromkeys(exact + [float(s) for s in steps]))


def candidates(ref: Reference, extra: Sequence[str], embed_scales: list[float | None],
                input_scales: list[float | None]) -> Iterator[Candidate]:
    """Every assignment of the extra parameters to the vocabulary's roles."""
    embeddings, layernorm, project, hidden = [], None, None, None
    modules: dict[str, list[str]] = {}
    for name in extra:
        modules.setdefault(name.rpartition(".")[0], []).append(name)
    for module_name, names in modules.items():
        module = ref.model.get_submodule(module_name)
        if isinstance(module, torch.nn.Embedding):
            embeddings.append(f"{module_name}.weight")
        elif isinstance(module, torch.nn.LayerNorm) and module.bias is not None:
            layernorm = (f"{module_name}.weight", f"{module_name}.bias", module.eps)
        elif isinstance(module, torch.nn.Linear) and module.bias is None:
            project = f"{module_name}.weight"
        elif isinstance(module, torch.nn.Linear) and hidden is None:
            hidden = (f"{module_name}.weight", f"{module_name}.bias")
        else:
            raise ImporterError(
                f"hidden_states[0] is computed from {', '.join(sorted(names))} of a "
                f"{type(module).__name__}, which is none of the rules the server applies "
                f"(gather, scale, learned positions, token-type row, LayerNorm, input "
                f"projection, projection to the hidden size)")
    if len(embeddings) > 2:
        raise ImporterError(f"hidden_states[0] adds {len(embeddings)} embedding tables "
                            f"({', '.join(embeddings)}): the server adds at most a position "
                            f"table and one token-type row")
    roles: list[tuple[str | None, str | None]] = []
    if not embeddings:
        roles = [(None, None)]
    elif len(embeddings) == 1:
        roles = [(embeddings[0], None), (None, embeddings[0])]
    else:
        roles = [(embeddings[0], embeddings[1]), (embeddings[1], embeddings[0])]
    if project is not None and hidden is not None:
        raise ImporterError(f"hidden_states[0] is computed through two projections "
                            f"({project}, {hidden[0]}): the server applies at most one")
    for position, token_type in roles:
        # BERT adds the token-type row first, ConvBERT the position rows: both round
        # differently, so both orders are candidates where the model has both.
        orders = (False, True) if position and token_type else (False,)
        for offset, last in ((o, t) for o in (_OFFSETS if position else [0]) for t in orders):
            for embed_scale, as_float, input_scale in _scale_choices(embed_scales,
                                                                     input_scales):
                rules = Rules(position_offset=offset, embed_scale=embed_scale,
                              embed_scale_float=as_float, input_scale=input_scale,
                              project_in=project is not None,
                              token_type=token_type is not None, token_type_last=last,
                              layernorm_eps=None if layernorm is None else layernorm[2],
                              project_hidden=hidden is not None)
                yield Candidate(rules, position, token_type, project,
                                None if layernorm is None else layernorm[:2], hidden)


def _scale_choices(embed_scales: list[float | None], input_scales: list[float | None]
                   ) -> Iterator[tuple[float | None, bool, float | None]]:
    """(embed_scale, as a Python float, input_scale): a scale inside the embedding module
    is either a tensor cast to the table's dtype (Gemma) or a Python float (BioGPT)."""
    for embed_scale in embed_scales:
        for as_float in ((False, True) if embed_scale is not None else (False,)):
            for input_scale in input_scales:
                yield embed_scale, as_float, input_scale

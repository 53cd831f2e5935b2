"""What the page needs to know about a model to show and check its rows truthfully.

The default compose is not ``token + position`` for every family (``service.format.rules``):
Gemma scales the token rows, OPT-350m projects them (``dim`` -> ``hidden_size``), BERT adds a
token-type row, BLOOM and BERT end with a LayerNorm, and RoPE/ALiBi models have no position
rows at all. The page reads these facts from its helper route (``POST .../tokenize``) and
draws each panel at its own width, names the steps the server applies, and checks bit for
bit only what it can recompute from the rows it was sent.
"""

from __future__ import annotations

from typing import Any

from service.engine import LoadedModel

__all__ = ["model_facts"]


def model_facts(model: LoadedModel) -> dict[str, Any]:
    """The model's shape and rules, as the page reads them.

    ``dim``: width of the token rows (``token_only``); ``width``: width of the default
    compose and of ``position_only`` (``hidden_size``; differs from ``dim`` only with
    ``project_in``); ``rules``: the manifest's rules object, only the rules that are on
    (``{}`` for a plain lookup); ``dtype``: the tables' dtype as served (the rules run in
    it)."""
    manifest = model.checkpoint.manifest
    tables = model.tables
    return {"dim": tables.dim, "width": tables.width, "position": manifest.position,
            "max_seq_len": manifest.max_seq_len, "family": manifest.family,
            "rules": tables.rules.to_dict(),
            "dtype": str(tables.token_table.dtype).removeprefix("torch.")}

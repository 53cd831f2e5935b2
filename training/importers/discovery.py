"""Discovery: a family's embedding rule, found by running its own transformers code.

For a ``model_type`` without a hand-written entry (and, with ``--discover``, as a
cross-check for those with one), ``discover`` builds the family's cut-down text model
(``training.importers.reference``), traces which parameters ``hidden_states[0]`` and
``get_input_embeddings()(ids)`` are computed from, reads only those from the checkpoint,
runs the probes in fp32, the stored dtype and bf16, and then looks, within the rule
vocabulary the server applies (``service.format.rules``), for the one rule whose result,
computed by the server's own code (``service.engine.rules.RuleTables``), equals both
outputs bit for bit on every probe. A family whose embedding is no such composition is
refused with what did not match (max difference, probe, dtype); nothing is written.
"""

from __future__ import annotations

import hashlib
import json
import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch

from service.engine.rules import RuleTables
from training.importers.candidates import Candidate, candidates, scales
from training.importers.reference import Probe, Reference
from training.importers.source import (
    CONTEXT_KEYS,
    ImporterError,
    SafetensorsDir,
    SourceTables,
    context_length,
    reason,
)
from training.importers.untrusted import guarded

__all__ = ["discover", "probes_for"]

_DTYPES = {"F32": torch.float32, "F16": torch.float16, "BF16": torch.bfloat16}
_TOKEN_ONLY, _DEFAULT = 1, 0  # embedding.v1 compose values RuleTables understands


def probes_for(vocab: int, max_pos: int | None, takes_positions: bool) -> list[Probe]:
    """Probe ids (edge ids 0 and vocab-1, their neighbours, repeats, spread ids) at the
    model's default positions and at several offsets (the last row of a learned table)."""
    gen = torch.Generator().manual_seed(0)
    spread = torch.randint(0, vocab, (8,), generator=gen).tolist()
    a = [0, vocab - 1, 1, vocab - 2, vocab // 2, *spread[:4], vocab - 1, 0]
    b = [*spread[4:], vocab // 3, 2, 0, vocab - 1, spread[0]]
    out = [Probe(tuple(a), None), Probe(tuple(b), None)]
    if takes_positions:
        out += [Probe(tuple(a), 0), Probe(tuple(b), 7)]
        if max_pos is not None and max_pos > len(b) + 7:
            out.append(Probe(tuple(b), max_pos - len(b)))  # ends on the last position
    return out


def _probe_hash(probes: Sequence[Probe]) -> str:
    data = json.dumps([[list(p.ids), p.start] for p in probes]).encode()
    return hashlib.sha256(data).hexdigest()


def _prefix(model_keys: Sequence[str], token_name: str, ckpt: Sequence[str]) -> str:
    """The checkpoint's prefix of the text model's names ("", "model.",
    "model.language_model.", ...): the one under which most of the model's own names are
    present; the token table must be among them."""
    present = set(ckpt)
    prefixes = {k[:len(k) - len(token_name)] for k in ckpt
                if k == token_name or k.endswith("." + token_name)}
    scored = sorted(((sum(p + k in present for k in model_keys), p) for p in prefixes),
                    reverse=True)
    if not scored:
        raise ImporterError(f"no tensor named {token_name!r} (the text model's "
                            f"get_input_embeddings()) under any prefix in the checkpoint")
    if len(scored) > 1 and scored[0][0] == scored[1][0]:
        raise ImporterError(f"{token_name!r} is ambiguous: found under prefixes "
                            f"{scored[0][1]!r} and {scored[1][1]!r} equally")
    return scored[0][1]


@dataclass
class _Worst:
    """The largest difference of one candidate: how much, where, on which probe."""

    diff: float = 0.0
    where: str = ""

    def see(self, got: torch.Tensor | None, want: torch.Tensor, where: str) -> None:
        if got is not None and got.shape == want.shape and torch.equal(got, want):
            return
        diff = (math.inf if got is None or got.shape != want.shape
                else float((got.double() - want.double()).abs().max()))
        if math.isnan(diff):
            diff = math.inf
        if diff > self.diff or not self.where:
            self.diff, self.where = diff, where


def _serve(ref: Reference, token_name: str, cand: Candidate, probe: Probe
           ) -> tuple[torch.Tensor | None, torch.Tensor]:
    """What the server computes for one probe under the candidate, with its own code:
    (default compose, token-only) in the reference's dtype; None where it cannot."""
    tensors: dict[str, torch.Tensor] = {}
    if cand.project_in:
        tensors["project_in_weight"] = ref.parameter(cand.project_in)  # (C, dim)
    if cand.token_type:
        tensors["token_type_embedding"] = ref.parameter(cand.token_type)[:1]  # (1, C)
    if cand.layernorm:
        tensors["layernorm_weight"] = ref.parameter(cand.layernorm[0])  # (C,)
        tensors["layernorm_bias"] = ref.parameter(cand.layernorm[1])  # (C,)
    if cand.project_hidden:
        tensors["project_hidden_weight"] = ref.parameter(cand.project_hidden[0])  # (H, C)
        tensors["project_hidden_bias"] = ref.parameter(cand.project_hidden[1])  # (H,)
    rules = RuleTables(cand.rules, tensors, torch.device("cpu"), ref.dtype)
    table = ref.parameter(token_name)  # (V, dim)
    positions_table = None
    if cand.position:
        positions_table = ref.parameter(cand.position)[cand.rules.position_offset:]  # (P, C)
    ids = torch.tensor(probe.ids)  # (T,)
    start = probe.start or 0
    positions = torch.arange(start, start + len(probe.ids))  # (T,)
    spans = [(0, len(probe.ids))]
    with torch.no_grad():
        token = rules.compose(table, positions_table, ids, positions, spans, _TOKEN_ONLY)
        if positions_table is not None and start + len(probe.ids) > positions_table.shape[0]:
            return None, token
        hidden = rules.compose(table, positions_table, ids, positions, spans, _DEFAULT)
    return hidden, token


def _evaluate(refs: Sequence[Reference], token_name: str, cand: Candidate,
              probes: Sequence[Probe],
              outputs: dict[int, list[tuple[torch.Tensor, torch.Tensor]]]) -> _Worst:
    worst = _Worst()
    for ref in refs:
        dtype = str(ref.dtype).removeprefix("torch.")
        for probe, (hidden, token) in zip(probes, outputs[id(ref)]):
            try:
                got_hidden, got_token = _serve(ref, token_name, cand, probe)
            except RuntimeError:  # the candidate's shapes do not fit: it cannot match
                got_hidden, got_token = None, None
            worst.see(got_token, token, f"get_input_embeddings()(ids) in {dtype}, "
                                        f"{probe.label()}")
            worst.see(got_hidden, hidden, f"hidden_states[0] in {dtype}, {probe.label()}")
    return worst


def _read(src: SafetensorsDir, prefix: str, ref: Reference, needed: Sequence[str]
          ) -> dict[str, torch.Tensor]:
    """Only the tensors the embeddings are computed from (their shards opened on demand)."""
    out = {}
    for name in needed:
        if prefix + name not in src.weight_map:
            raise ImporterError(f"{src.dir}: hidden_states[0] is computed from {name}, but "
                                f"the checkpoint has no {prefix + name}")
        t = src.tensor(prefix + name)
        if tuple(t.shape) != tuple(ref.parameter(name).shape):
            raise ImporterError(f"{src.where(prefix + name)}: {prefix + name} has shape "
                                f"{tuple(t.shape)}, expected {tuple(ref.parameter(name).shape)}"
                                f" from config.json")
        out[name] = t
    return out


def _context(ref: Reference, src: SafetensorsDir) -> tuple[str, int] | None:
    """The context length the config states, under any of the names families use: the
    text config first (transformers maps its own aliases), then config.json's text."""
    text = src.config.get("text_config")
    return context_length(ref.text_config, *([text] if isinstance(text, dict) else []),
                          src.config)


def _max_seq_len(ref: Reference, src: SafetensorsDir, cand: Candidate,
                 flag: int | None) -> int:
    if cand.position:
        if flag is not None:
            raise ImporterError("--max-seq-len: this model has a learned position table; "
                                "max_seq_len is its row count")
        return ref.parameter(cand.position).shape[0] - cand.rules.position_offset
    if flag is not None:
        return flag
    found = _context(ref, src)
    if found is None:
        raise ImporterError(f"{src.dir / 'config.json'}: states no context length (none of "
                            f"{', '.join(CONTEXT_KEYS)}); pass --max-seq-len")
    return found[1]


def discover(src: SafetensorsDir, max_seq_len: int | None = None) -> SourceTables:
    """The tables and the one rule that reproduce the family's own embeddings bit for bit
    (ImporterError, with what did not match, when no rule of the vocabulary does)."""
    with guarded() as tf:
        return _discover(src, tf, max_seq_len)


def _discover(src: SafetensorsDir, tf: Any, max_seq_len: int | None) -> SourceTables:
    ref32 = Reference(src, torch.float32)
    text = ref32.text_config
    token_name = ref32.token_table_name()
    prefix = _prefix(list(ref32.model.state_dict()), token_name, list(src.weight_map))
    vocab = int(text.vocab_size)
    found = _context(ref32, src)
    probes = probes_for(vocab, None if found is None else found[1], ref32.takes_positions)
    try:
        hidden_src, token_src = ref32.sources(probes[0])
    except Exception as e:  # the family's own code fails on ids alone: a refusal
        raise ImporterError(f"{src.dir}: the reference ({type(ref32.model).__name__}) "
                            f"failed on a probe ({reason(e)})") from None
    if token_src != {token_name} or token_name not in hidden_src:
        raise ImporterError(f"{src.dir}: get_input_embeddings()(ids) is computed from "
                            f"{sorted(token_src)} and hidden_states[0] from "
                            f"{sorted(hidden_src)}: not a gather of {token_name}")
    needed = sorted(hidden_src | token_src)
    tensors = _read(src, prefix, ref32, needed)
    stored = tensors[token_name].dtype
    if stored not in _DTYPES.values():
        raise ImporterError(f"{prefix + token_name}: dtype {stored} is not storable")
    # fp32, the stored dtype, and bf16 (whose rounding tells a scale cast to the dtype from
    # one kept a float, should the table be stored narrower later). A dtype other than the
    # stored one gets only the probed rows of the token table: the rest stays unwritten.
    rows = sorted({i for p in probes for i in p.ids})
    refs = [ref32]
    for dtype in (stored, torch.bfloat16):
        if all(r.dtype != dtype for r in refs):
            refs.append(Reference(src, dtype))
    for ref in refs:
        for name, t in tensors.items():
            ref.set(name, t, rows if name == token_name and ref.dtype != stored else None)
    try:
        outputs = {id(r): [r.run(p) for p in probes] for r in refs}
    except Exception as e:  # the family's own code fails on ids alone: a refusal
        raise ImporterError(f"{src.dir}: the reference ({type(ref32.model).__name__}) "
                            f"failed on the probes ({reason(e)})") from None
    hidden0, token0 = outputs[id(ref32)][0]
    gathered = tensors[token_name][torch.tensor(probes[0].ids)].float()  # (T, dim)
    embed_scales: list[float | None] = [None]
    if not torch.equal(token0, gathered):
        embed_scales = list(scales(token0, gathered, text)) or [None]
    extra = [n for n in needed if n != token_name]
    input_scales: list[float | None] = [None]
    if not extra and hidden0.shape == token0.shape and not torch.equal(hidden0, token0):
        input_scales = list(scales(hidden0, token0, text)) or [None]
    best: tuple[_Worst, Candidate] | None = None
    for cand in candidates(ref32, extra, embed_scales, input_scales):
        worst = _evaluate(refs, token_name, cand, probes, outputs)
        if not worst.where:
            return _tables(src, tf, refs, prefix, token_name, cand, tensors, probes,
                           _max_seq_len(ref32, src, cand, max_seq_len))
        if best is None or worst.diff < best[0].diff:
            best = (worst, cand)
    assert best is not None
    raise ImporterError(
        f"{src.dir}: model_type {src.config.get('model_type')!r}: no rule the server applies "
        f"reproduces its embeddings (computed from {', '.join(needed)}); closest: "
        f"{best[1].describe()}, max difference {best[0].diff:g} on {best[0].where}; "
        f"nothing written")


def _tables(src: SafetensorsDir, tf: Any, refs: Sequence[Reference], prefix: str,
            token_name: str, cand: Candidate, tensors: dict[str, torch.Tensor],
            probes: Sequence[Probe], max_seq_len: int) -> SourceTables:
    """The SourceTables of the found rule, with the evidence in the provenance."""
    ours = {"token_embedding": token_name, "position_embedding": cand.position,
            "token_type_embedding": cand.token_type, "project_in_weight": cand.project_in,
            "layernorm_weight": cand.layernorm[0] if cand.layernorm else None,
            "layernorm_bias": cand.layernorm[1] if cand.layernorm else None,
            "project_hidden_weight": cand.project_hidden[0] if cand.project_hidden else None,
            "project_hidden_bias": cand.project_hidden[1] if cand.project_hidden else None}
    names = {k: prefix + v for k, v in ours.items() if v is not None}
    rule_tensors = {k: tensors[v] for k, v in ours.items()
                    if v is not None and k in cand.rules.tensors()}
    if "token_type_embedding" in rule_tensors:  # the reference adds row 0 (no type ids)
        rule_tensors["token_type_embedding"] = rule_tensors["token_type_embedding"][:1].clone()
    hidden = 0
    if cand.project_in:
        hidden = int(tensors[cand.project_in].shape[0])
    elif cand.project_hidden:
        hidden = int(tensors[cand.project_hidden[0]].shape[0])
    provenance = src.provenance("hf")
    provenance["discovery"] = {
        "reference": f"{type(refs[0].model).__name__} (transformers {tf.__version__}), "
                     f"cut to 1 layer",
        "probe_sha256": _probe_hash(probes), "probes": len(probes),
        "dtypes": [str(r.dtype).removeprefix("torch.") for r in refs],
        "stored_dtype": str(tensors[token_name].dtype).removeprefix("torch."),
        "compared": ["hidden_states[0]", "get_input_embeddings()(ids)"],
        "max_difference": 0.0, "rules": cand.rules.to_dict(),
        "parameters": {k: v for k, v in ours.items() if v is not None}}
    return SourceTables(
        token_table=tensors[token_name],
        position_table=tensors[cand.position] if cand.position else None,
        max_seq_len=max_seq_len, names=names, provenance=provenance,
        family=str(src.config.get("model_type", "")), rules=cand.rules, hidden_size=hidden,
        rule_tensors=rule_tensors, vocab_size=int(refs[0].text_config.vocab_size))

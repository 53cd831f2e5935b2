"""Any Hugging Face model directory -> ``SourceTables``, by its ``model_type``.

A hand-written family (``families.py``) is read through its explicit name map; any other
``model_type`` goes through discovery (``discovery.py``: the family's own transformers
code run on probes decides the rule, or the model is refused). ``discover=True`` runs
discovery for a hand-written family too and refuses the import unless both agree.
Only the tensors the input embeddings need are read (the rest of a 16 GB checkpoint is
never opened beyond its header); every shape is checked against config.json first.
"""

from __future__ import annotations

from pathlib import Path

from training.importers.discovery import discover as discover_tables
from training.importers.families import FAMILIES, Family, supported
from training.importers.source import (
    CONTEXT_KEYS,
    ImporterError,
    SafetensorsDir,
    SourceTables,
    check_shape,
    config_int,
    context_length,
    resolve_names,
)
from training.importers.untrusted import refuse_custom_code

__all__ = ["family_of", "load_hf"]


def family_of(src: SafetensorsDir) -> Family:
    """The family named by config.json's model_type; unknown types are refused."""
    model_type = src.config.get("model_type")
    family = FAMILIES.get(str(model_type))
    if family is None:
        raise ImporterError(f"{src.dir / 'config.json'}: model_type {model_type!r} is not "
                            f"supported (supported: {supported()}); its embedding rules are "
                            f"unknown, so it is not imported by guesswork")
    return family


def _max_seq_len(family: Family, src: SafetensorsDir, flag: int | None) -> int:
    """The context length: the position table's rows, else --max-seq-len, else config.json
    under the family's own key or any name families use (``CONTEXT_KEYS``)."""
    if family.positions == "learned":
        if flag is not None:
            raise ImporterError(f"--max-seq-len: {family.model_type} has a learned position "
                                f"table; max_seq_len is its row count from config.json")
        return config_int(src.config, family.max_seq_len_keys, "config.json")
    if flag is not None:
        return flag
    found = context_length({k: src.config.get(k) for k in family.max_seq_len_keys},
                           src.config)
    if found is None:
        raise ImporterError(f"{src.dir / 'config.json'}: {family.model_type} states no "
                            f"context length (none of {', '.join(CONTEXT_KEYS)}); pass "
                            f"--max-seq-len (e.g. 2048 for BLOOM)")
    return found[1]


def load_hf(model_dir: Path, max_seq_len: int | None = None,
            expect: str | None = None, discover: bool = False) -> SourceTables:
    """Read the embedding tensors of an HF model (``expect``: the only model_type an alias
    such as ``hf-gpt2`` accepts): a hand-written family by its name map, any other by
    discovery; ``discover``: discovery for a hand-written family too, cross-checked. A
    directory that names code of its own is refused first: nothing in it is ever run."""
    refuse_custom_code(model_dir)
    src = SafetensorsDir(model_dir)
    model_type = src.config.get("model_type")
    if expect is None and str(model_type) not in FAMILIES:
        try:
            return discover_tables(src, max_seq_len)
        except ImporterError as e:
            raise ImporterError(f"{src.dir / 'config.json'}: model_type {model_type!r} has "
                                f"no hand-written entry (those: {supported()}) and "
                                f"discovery refused it: {e}") from e
    family = family_of(src)
    if discover:
        found = discover_tables(SafetensorsDir(model_dir), max_seq_len)
        written = _load_family(src, family, max_seq_len)
        cross_check(found, written)
        return found
    return _load_family(src, family, max_seq_len, expect)


def cross_check(found: SourceTables, written: SourceTables) -> None:
    """Refuse unless discovery found the hand-written entry's rule and tensors."""
    where = f"model_type {written.family!r}"
    if found.rules != written.rules:
        raise ImporterError(f"{where}: discovery found rules {found.rules.describe()!r}, the "
                            f"hand-written entry has {written.rules.describe()!r}")
    if found.names != written.names:
        raise ImporterError(f"{where}: discovery read {found.names}, the hand-written "
                            f"entry {written.names}")
    if (found.max_seq_len, found.vocab_size) != (written.max_seq_len, written.vocab_size):
        raise ImporterError(f"{where}: discovery found max_seq_len {found.max_seq_len}, "
                            f"vocab_size {found.vocab_size}; the hand-written entry "
                            f"{written.max_seq_len}, {written.vocab_size}")


def _load_family(src: SafetensorsDir, family: Family, max_seq_len: int | None,
                 expect: str | None = None) -> SourceTables:
    if expect is not None and family.model_type != expect:
        raise ImporterError(f"{src.dir / 'config.json'}: model_type "
                            f"{family.model_type!r}, but hf-{expect} imports only {expect!r} "
                            f"(use the 'hf' command)")
    cfg = src.config
    rules = family.rules(cfg)
    names = resolve_names(list(src.weight_map), family.names, family.wanted(rules),
                          str(src.dir))
    vocab = config_int(cfg, ["vocab_size"], "config.json")
    hidden = config_int(cfg, family.hidden_keys, "config.json")
    width = (config_int(cfg, [family.token_width_key], "config.json")
             if family.token_width_key and family.token_width_key in cfg else hidden)
    seq = _max_seq_len(family, src, max_seq_len)
    expected: dict[str, tuple[tuple[int, ...], str]] = {
        "token_embedding": ((vocab, width), "[vocab_size, hidden_size] from config.json"),
        "position_embedding": ((seq + rules.position_offset, hidden),
                               f"[max_position_embeddings + {rules.position_offset}, "
                               f"hidden_size] from config.json"),
        "project_in_weight": ((hidden, width), "[hidden_size, word_embed_proj_dim]"),
        "layernorm_weight": ((hidden,), "[hidden_size]"),
        "layernorm_bias": ((hidden,), "[hidden_size]"),
    }
    if family.model_type == "gpt2":  # the messages GPT-2 users know
        expected["token_embedding"] = ((vocab, hidden), "[vocab_size, n_embd] from config.json")
        expected["position_embedding"] = ((seq, hidden),
                                          "[n_positions, n_embd] from config.json")
    if rules.token_type:
        types = config_int(cfg, ["type_vocab_size"], "config.json")
        expected["token_type_embedding"] = ((types, hidden), "[type_vocab_size, hidden_size]")
        if cfg.get("position_embedding_type", "absolute") != "absolute":
            raise ImporterError(f"config.json: position_embedding_type "
                                f"{cfg['position_embedding_type']!r}: only 'absolute' "
                                f"position rows are input embeddings")
    for ours, name in names.items():
        shape, meaning = expected[ours]
        check_shape(src.where(name), name, src.shape(name), shape, meaning)
    tensors = {ours: src.tensor(name) for ours, name in names.items()}
    rule_tensors = {k: v for k, v in tensors.items() if k in rules.tensors()}
    if "token_type_embedding" in rule_tensors:
        # BERT adds token_type_embeddings(0) when no token_type_ids are given: row 0 only.
        rule_tensors["token_type_embedding"] = rule_tensors["token_type_embedding"][:1].clone()
    return SourceTables(
        token_table=tensors["token_embedding"], position_table=tensors.get("position_embedding"),
        max_seq_len=seq, names=names, provenance=src.provenance("hf"),
        family=family.model_type, rules=rules, hidden_size=hidden if width != hidden else 0,
        rule_tensors=rule_tensors, vocab_size=vocab)

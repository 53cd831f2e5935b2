"""A model's ``tokenizer.json`` resolved into the tokenizer ``AutoTokenizer`` would build.

A tokenizer.json alone is not the whole story: transformers' ``TokenizersBackend`` (what
``AutoTokenizer`` loads for ``PreTrainedTokenizerFast``-style directories) also reads
``tokenizer_config.json`` and

1. adds every named special token (``bos_token``, ``eos_token``, ``unk_token``, ...,
   ``extra_special_tokens``) and every ``added_tokens_decoder`` entry the file lacks;
2. keeps the file's post-processor (transformers 5 drops ``add_bos_token`` /
   ``add_eos_token`` from the config when a tokenizer.json exists), or sets ``$A`` (adds
   nothing) when the file has none;
3. encodes without the file's padding and truncation (``__call__`` turns them off).

``resolve`` does the same with the ``tokenizers`` library alone, and returns the JSON the
version stores and the server loads (``service.format.hf_tokenizer``). Where
``transformers`` is installed, the result is then checked against ``AutoTokenizer`` on probe
texts; if they disagree, AutoTokenizer wins: its own backend tokenizer is stored instead
(provenance ``tokenizer_source`` says which).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from tokenizers import AddedToken, Tokenizer
from tokenizers.processors import TemplateProcessing

from service.format.hf_tokenizer import HF_TOKENIZER_FILE
from service.format.tokenizer import TokenizerSpec
from training.importers.source import ImporterError, read_json_object, reason, sha256_file
from training.importers.untrusted import (
    SAFE_KWARGS,
    guarded,
    refuse_custom_code,
    transformers_or_none,
)

__all__ = ["PROBE_TEXTS", "ResolvedTokenizer", "auto_tokenizer", "probe_difference", "resolve"]

_ROLES = ("bos_token", "eos_token", "unk_token", "sep_token", "pad_token", "cls_token",
          "mask_token")
# Texts both tokenizers encode at import: spaces, newlines, digits, accents, CJK, emoji.
PROBE_TEXTS = ("Hello world", " leading space", "two  spaces\nand a newline\n\n", "12345 678",
               "café naïve Ünïcödé", "日本語のテキスト", "emoji 🙂👍", "MiXeD CaSe, punctuation!?",
               "")


class ResolvedTokenizer:
    """The tokenizer.json to store, its spec, and what it was built from."""

    def __init__(self, data: str, spec: TokenizerSpec, provenance: dict[str, Any]) -> None:
        self.data = data
        self.spec = spec
        self.provenance = provenance
        self.n_vocab = max(Tokenizer.from_str(data).get_vocab(with_added_tokens=True).values()) + 1


def _content(value: Any) -> tuple[str, dict[str, Any]] | None:
    """A special-token entry of tokenizer_config.json: a string or an AddedToken dict."""
    if isinstance(value, str):
        return value, {}
    if isinstance(value, dict) and isinstance(value.get("content"), str):
        props = {k: value[k] for k in ("single_word", "lstrip", "rstrip", "normalized")
                 if k in value}
        return value["content"], props
    return None


def _emulate(tok: Tokenizer, config: dict[str, Any]) -> None:
    """Apply what TokenizersBackend.__init__ does to the loaded tokenizer.json (in place)."""
    tok.no_padding()
    tok.no_truncation()
    present = {t.content for t in tok.get_added_tokens_decoder().values()}
    to_add: list[AddedToken] = []
    decoder = config.get("added_tokens_decoder") or {}
    for _, entry in sorted(decoder.items(), key=lambda kv: int(kv[0])):
        found = _content(entry)
        if found and found[0] not in present:
            to_add.append(AddedToken(found[0], special=bool(entry.get("special", False)),
                                     **found[1]))
    extra = config.get("extra_special_tokens") or config.get("additional_special_tokens") or []
    for value in [config.get(role) for role in _ROLES] + list(extra):
        found = _content(value)
        if found and found[0] not in present and all(t.content != found[0] for t in to_add):
            to_add.append(AddedToken(found[0], special=True, **found[1]))
    if to_add:
        tok.add_tokens(to_add)
    # transformers 5 drops add_bos_token / add_eos_token from tokenizer_config.json when a
    # tokenizer.json exists (tokenization_utils_base): the file's post-processor decides.
    # Only a file without one gets update_post_processor's template, which then adds
    # nothing ("$A:0").
    if tok.post_processor is None:
        tok.post_processor = TemplateProcessing(single="$A:0", pair="$A:0 $B:1",
                                                special_tokens=[])


def auto_tokenizer(model_dir: Path) -> Any:
    """transformers' ``AutoTokenizer`` of a model directory, loaded as untrusted.py loads
    everything: the directory's JSON refused first if it names code, then offline, local
    files only. ImporterError for what untrusted.py refuses; any other exception is the
    library's own, for the caller to say what it means for its import."""
    refuse_custom_code(model_dir)  # before AutoTokenizer reads any file of it
    with guarded() as tf:
        return tf.AutoTokenizer.from_pretrained(str(model_dir), **SAFE_KWARGS)


def probe_difference(auto: Any, tok: Tokenizer) -> tuple[str, list[int], list[int]] | None:
    """The first probe text that ``tok`` encodes differently from ``auto`` (an
    AutoTokenizer), with special tokens added or without: (text, tok's ids, auto's ids);
    None when they agree on every probe both ways."""
    for add in (True, False):
        for text in PROBE_TEXTS:
            want = auto(text, add_special_tokens=add)["input_ids"]
            got = tok.encode(text, add_special_tokens=add).ids
            if got != want:
                return text, got, want
    return None


def _auto_backend(model_dir: Path, candidate: Tokenizer) -> tuple[Tokenizer | None, str]:
    """AutoTokenizer's own backend if it encodes the probes differently (else None), and a
    note of what was compared. Skipped where transformers is not installed."""
    if transformers_or_none() is None:
        return None, "transformers not installed: tokenizer_config.json emulated"
    try:
        auto = auto_tokenizer(model_dir)
    except ImporterError:
        raise
    except Exception as e:  # a directory AutoTokenizer cannot load: the emulation stands
        return None, f"AutoTokenizer could not load the directory ({type(e).__name__})"
    difference = probe_difference(auto, candidate)
    if difference is None:
        return None, f"matches AutoTokenizer ({type(auto).__name__}) on the probe texts"
    text, _, want = difference
    backend = getattr(auto, "backend_tokenizer", None)
    if not isinstance(backend, Tokenizer):
        raise ImporterError(f"{model_dir}: AutoTokenizer encodes {text!r} as {want}, the "
                            f"tokenizer.json differently, and it has no tokenizers backend "
                            f"to store")
    backend = Tokenizer.from_str(backend.to_str())
    backend.no_padding()
    backend.no_truncation()
    return backend, f"AutoTokenizer ({type(auto).__name__}) differed on {text!r}"


def resolve(model_dir: Path, name: str) -> ResolvedTokenizer | None:
    """The tokenizer to store for a model directory; None when it has no tokenizer.json."""
    path = model_dir / HF_TOKENIZER_FILE
    if not path.is_file():
        return None
    try:
        tok = Tokenizer.from_file(str(path))
    except Exception as e:  # tokenizers raises its own Exception type
        raise ImporterError(f"{path}: not a tokenizer.json the tokenizers library reads "
                            f"({reason(e)})") from None
    config_path = model_dir / "tokenizer_config.json"
    config: dict[str, Any] = read_json_object(config_path) if config_path.is_file() else {}
    _emulate(tok, config)
    auto, note = _auto_backend(model_dir, tok)
    source = "tokenizer.json + tokenizer_config.json"
    if auto is not None:
        tok, source = auto, "AutoTokenizer backend"
    specials = {t.content: i for i, t in tok.get_added_tokens_decoder().items() if t.special}
    spec = TokenizerSpec(file=HF_TOKENIZER_FILE, encoding=name, pat_str="",
                         special_tokens=specials, kind="hf")
    files = {p.name: sha256_file(p) for p in (path, config_path) if p.is_file()}
    provenance = {"tokenizer_source": source, "tokenizer_check": note,
                  "tokenizer_files": files}
    return ResolvedTokenizer(tok.to_str(), spec, provenance)

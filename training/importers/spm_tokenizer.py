"""A model that ships only a SentencePiece ``tokenizer.model``: its fast tokenizer, converted
at import by transformers, then stored and checked like any ``tokenizer.json``.

``AutoTokenizer.from_pretrained(DIR)`` converts the SentencePiece model into a
``tokenizers`` backend (transformers' own converter; it needs the ``sentencepiece``
package). That backend's JSON goes through ``tokenizer_json.resolve`` as if the directory
had shipped it (the same tokenizer_config.json emulation), and the result must encode the
probe texts exactly as the original directory's AutoTokenizer does, with and without
special tokens; otherwise the import is refused.
"""

from __future__ import annotations

import shutil
import tempfile
from pathlib import Path

from tokenizers import Tokenizer

from service.format.hf_tokenizer import HF_TOKENIZER_FILE
from training.importers.source import ImporterError, reason, sha256_file
from training.importers.tokenizer_json import (
    ResolvedTokenizer,
    auto_tokenizer,
    probe_difference,
    resolve,
)
from training.importers.untrusted import IMPORT_EXTRA, transformers_or_none

__all__ = ["SPM_FILE", "convert"]

SPM_FILE = "tokenizer.model"
_CONFIG_FILES = ("tokenizer_config.json", "special_tokens_map.json", "added_tokens.json")


def convert(model_dir: Path, name: str) -> ResolvedTokenizer | None:
    """The converted tokenizer of a directory with ``tokenizer.model`` and no
    ``tokenizer.json``; None when it has no ``tokenizer.model``."""
    source = model_dir / SPM_FILE
    if not source.is_file() or (model_dir / HF_TOKENIZER_FILE).is_file():
        return None
    if transformers_or_none() is None:
        raise ImporterError(f"{source}: converting a SentencePiece tokenizer needs "
                            f"transformers and sentencepiece: {IMPORT_EXTRA}; or pass "
                            f"--no-tokenizer to import ids-only")
    try:
        auto = auto_tokenizer(model_dir)
    except ImporterError:
        raise
    except Exception as e:  # transformers raises many types; the reason says which
        raise ImporterError(f"{source}: AutoTokenizer could not load it ({reason(e)}); "
                            f"{IMPORT_EXTRA} installs sentencepiece, or pass "
                            f"--no-tokenizer") from None
    backend = getattr(auto, "backend_tokenizer", None)
    if not isinstance(backend, Tokenizer):
        raise ImporterError(f"{source}: AutoTokenizer ({type(auto).__name__}) has no "
                            f"tokenizers backend to store")
    with tempfile.TemporaryDirectory() as tmp:
        staged = Path(tmp)
        (staged / HF_TOKENIZER_FILE).write_text(backend.to_str(), encoding="utf-8")
        for config in _CONFIG_FILES:
            if (model_dir / config).is_file():
                shutil.copyfile(model_dir / config, staged / config)
        resolved = resolve(staged, name)
    assert resolved is not None
    difference = probe_difference(auto, Tokenizer.from_str(resolved.data))
    if difference is not None:
        text, got, want = difference
        raise ImporterError(f"{source}: the converted tokenizer encodes {text!r} as {got}, "
                            f"AutoTokenizer as {want}")
    files = {p.name: sha256_file(p) for p in (source, *(model_dir / c for c in _CONFIG_FILES))
             if p.is_file()}
    resolved.provenance.update({
        "tokenizer_source": f"{SPM_FILE} converted by transformers ({type(auto).__name__})",
        "tokenizer_check": "matches AutoTokenizer on the probe texts, with and without "
                           "special tokens",
        "tokenizer_files": files})
    return resolved

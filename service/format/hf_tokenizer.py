"""A model's own ``tokenizer.json``, through Hugging Face ``tokenizers`` (the Rust library).

The importer (``training.importers.tokenizer_json``) resolves the model directory's
``tokenizer.json`` + ``tokenizer_config.json`` into the one tokenizer ``AutoTokenizer``
would build (its post-processor, its added special tokens) and stores that file in the
version directory; this module only loads it, hash-checked like the tiktoken ranks, and
encodes with it. Nothing here reads the network or unpickles.

Two ``tokenizers.Tokenizer`` objects are kept because ``encode_special_tokens`` is a
property of the object, not an argument of ``encode``: mutating one shared object per
request would race between the tokenizing threads.
"""

from __future__ import annotations

import hashlib
from pathlib import Path

from tokenizers import Tokenizer as RustTokenizer
from tokenizers.decoders import ByteLevel as ByteLevelDecoder

from service.format.tokenizer import Tokenizer, TokenizerSpec, load_tokenizer

__all__ = ["HF_TOKENIZER_FILE", "HFTokenizer", "TextTokenizer", "load_hf_tokenizer",
           "load_text_tokenizer"]

HF_TOKENIZER_FILE = "tokenizer.json"


def _byte_decoder() -> dict[str, int]:
    """GPT-2's byte-level alphabet inverted: printable stand-in character -> byte."""
    printable = (list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1))
                 + list(range(ord("®"), ord("ÿ") + 1)))
    chars, n = list(printable), 0
    for b in range(256):
        if b not in printable:
            printable.append(b)
            chars.append(256 + n)
            n += 1
    return {chr(c): b for b, c in zip(printable, chars)}


class HFTokenizer:
    """Text <-> ids with a stored tokenizer.json; the same interface as ``Tokenizer``."""

    def __init__(self, spec: TokenizerSpec, data: str) -> None:
        self.spec = spec
        # allow_special_tokens=False (the service's default): special-token strings in the
        # text are tokenized as plain text, like AutoTokenizer(split_special_tokens=True).
        self._plain = RustTokenizer.from_str(data)
        self._plain.encode_special_tokens = True
        self._special = RustTokenizer.from_str(data)
        self._special.encode_special_tokens = False
        vocab = self._plain.get_vocab(with_added_tokens=True)
        self.n_vocab: int = max(vocab.values()) + 1 if vocab else 0
        self._byte_level = isinstance(self._plain.decoder, ByteLevelDecoder)
        self._bytes = _byte_decoder() if self._byte_level else {}

    def encode(self, text: str, allow_special_tokens: bool = False,
               add_special_tokens: bool | None = None) -> list[int]:
        """Token ids; ``add_special_tokens`` None = the model's default (AutoTokenizer's:
        what the stored post-processor adds, e.g. Llama's BOS)."""
        tok = self._special if allow_special_tokens else self._plain
        add = True if add_special_tokens is None else add_special_tokens
        ids: list[int] = tok.encode(text, add_special_tokens=add).ids
        return ids

    def encode_batch(self, texts: list[str], allow_special_tokens: bool = False,
                     add_special_tokens: bool | None = None) -> list[list[int]]:
        """Token ids for many texts (the Rust library's own thread pool)."""
        tok = self._special if allow_special_tokens else self._plain
        add = True if add_special_tokens is None else add_special_tokens
        return [e.ids for e in tok.encode_batch(texts, add_special_tokens=add)]

    def decode(self, ids: list[int]) -> str:
        """Text for ids, special tokens included (the tokenizer's own decoder)."""
        text: str = self._plain.decode(ids, skip_special_tokens=False)
        return text

    def token_bytes(self, ids: list[int]) -> list[bytes]:
        """Each token's own bytes: the byte-level alphabet undone where the model uses it
        (a token may be part of a UTF-8 sequence), else the token decoded alone."""
        out = []
        for i in ids:
            piece = self._plain.id_to_token(i) or ""
            if self._byte_level and all(c in self._bytes for c in piece):
                out.append(bytes(self._bytes[c] for c in piece))
            else:
                out.append(self._plain.decode([i], skip_special_tokens=False).encode("utf-8"))
        return out


def load_hf_tokenizer(spec: TokenizerSpec, path: Path) -> HFTokenizer:
    """Build the tokenizer from a stored tokenizer.json, checking its sha256 when the spec
    has one (ValueError on a mismatch or a file ``tokenizers`` cannot read)."""
    data = path.read_bytes()
    if spec.sha256 and hashlib.sha256(data).hexdigest() != spec.sha256:
        raise ValueError(f"{path}: sha256 does not match the tokenizer spec")
    try:
        return HFTokenizer(spec, data.decode("utf-8"))
    except Exception as e:  # tokenizers raises its own Exception subclass on bad JSON
        raise ValueError(f"{path}: not a tokenizer.json the tokenizers library reads ({e})"
                         ) from e


TextTokenizer = Tokenizer | HFTokenizer


def load_text_tokenizer(spec: TokenizerSpec, path: Path) -> TextTokenizer:
    """The checkpoint's tokenizer, by its kind: a tiktoken ranks file or a tokenizer.json."""
    if spec.kind == "hf":
        return load_hf_tokenizer(spec, path)
    return load_tokenizer(spec, path)

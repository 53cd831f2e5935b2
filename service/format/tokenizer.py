"""The tokenizer: fixed BPE rules (tiktoken) built from a ranks file on disk.

Never through tiktoken's registry (``tiktoken.get_encoding``): that path downloads, with
no timeout, and this service must never touch the network. Every checkpoint carries its
own ranks file; we parse it here and hand the ranks to ``tiktoken.Encoding``.
"""

from __future__ import annotations

import base64
import hashlib
from dataclasses import dataclass, field
from pathlib import Path

import tiktoken

__all__ = [
    "ENDOFTEXT",
    "GPT2_PAT_STR",
    "GPT2_RANKS_SHA256",
    "GPT2_SPECIAL_TOKENS",
    "TOKENIZER_KINDS",
    "Tokenizer",
    "TokenizerSpec",
    "default_ranks_path",
    "gpt2_spec",
    "load_ranks",
    "load_tokenizer",
]

ENDOFTEXT = "<|endoftext|>"
# r50k_base == gpt2: the same ranks, split pattern and special token (tiktoken_ext).
# fmt: off
GPT2_PAT_STR = r"""'(?:[sdmt]|ll|ve|re)| ?\p{L}++| ?\p{N}++| ?[^\s\p{L}\p{N}]++|\s++$|\s+(?!\S)|\s"""  # noqa: E501
# fmt: on
GPT2_SPECIAL_TOKENS = {ENDOFTEXT: 50256}
TOKENIZER_KINDS = ("tiktoken", "hf")
GPT2_RANKS_SHA256 = "306cd27f03c1a714eca7108e03d66b7dc042abe8c258b44c199a7ed9838dd930"


def default_ranks_path() -> Path:
    """Where ``scripts/fetch_tokenizer.py`` puts the verified GPT-2 ranks.

    Package data beside this module (not a path relative to a checkout), so an installed
    wheel built after the fetch carries it too.
    """
    return Path(__file__).resolve().parent / "assets" / "gpt2.tiktoken"


@dataclass(frozen=True)
class TokenizerSpec:
    """How to rebuild a tiktoken encoding: stored in each checkpoint's manifest."""

    file: str  # ranks file name inside the version directory
    encoding: str  # e.g. "gpt2"
    pat_str: str  # the pre-tokenizer regex ("" for a tokenizer.json: the file has its own)
    special_tokens: dict[str, int] = field(default_factory=dict)
    sha256: str = ""  # of the ranks file
    # "tiktoken": a .tiktoken ranks file; "hf": a Hugging Face tokenizer.json (see
    # service.format.hf_tokenizer). Absent in older manifests, which are all tiktoken.
    kind: str = "tiktoken"

    def to_dict(self) -> dict[str, object]:
        """JSON form, as in manifest.json (``kind`` only when not the old default, so
        older manifests keep their bytes and their checkpoint_id)."""
        d: dict[str, object] = {"file": self.file, "encoding": self.encoding,
                                "pat_str": self.pat_str,
                                "special_tokens": dict(self.special_tokens),
                                "sha256": self.sha256}
        if self.kind != "tiktoken":
            d["kind"] = self.kind
        return d

    @classmethod
    def from_dict(cls, d: dict[str, object]) -> TokenizerSpec:
        """Parse the manifest's ``tokenizer`` object (KeyError/TypeError on bad input)."""
        special = d.get("special_tokens") or {}
        if not isinstance(special, dict):
            raise TypeError("tokenizer.special_tokens must be an object")
        kind = str(d.get("kind", "tiktoken"))
        if kind not in TOKENIZER_KINDS:
            raise ValueError(f"tokenizer.kind {kind!r} not in {TOKENIZER_KINDS}")
        return cls(file=str(d["file"]), encoding=str(d["encoding"]), pat_str=str(d["pat_str"]),
                   special_tokens={str(k): int(v) for k, v in special.items()},
                   sha256=str(d.get("sha256", "")), kind=kind)


def gpt2_spec(file: str = "tokenizer.tiktoken", sha256: str = GPT2_RANKS_SHA256) -> TokenizerSpec:
    """The r50k_base/gpt2 encoding's spec."""
    return TokenizerSpec(file=file, encoding="gpt2", pat_str=GPT2_PAT_STR,
                         special_tokens=dict(GPT2_SPECIAL_TOKENS), sha256=sha256)


def load_ranks(path: Path) -> dict[bytes, int]:
    """Parse a ``.tiktoken`` ranks file: one ``base64(token) rank`` per line."""
    ranks: dict[bytes, int] = {}
    for lineno, line in enumerate(path.read_bytes().splitlines(), 1):
        if not line:
            continue
        try:
            token, rank = line.split()
            ranks[base64.b64decode(token, validate=True)] = int(rank)
        except ValueError as e:
            raise ValueError(f"{path}:{lineno}: not a 'base64 rank' line") from e
    return ranks


class Tokenizer:
    """Text ↔ token ids for one checkpoint; thread-safe (tiktoken releases the GIL)."""

    def __init__(self, spec: TokenizerSpec, ranks: dict[bytes, int]) -> None:
        self.spec = spec
        self._enc = tiktoken.Encoding(spec.encoding, pat_str=spec.pat_str,
                                      mergeable_ranks=ranks, special_tokens=spec.special_tokens)
        self.n_vocab: int = self._enc.n_vocab

    def encode(self, text: str, allow_special_tokens: bool = False,
               add_special_tokens: bool | None = None) -> list[int]:
        """Token ids; without ``allow_special_tokens`` "<|endoftext|>" is plain text.

        ``add_special_tokens`` is accepted for the shared interface: a tiktoken encoding
        adds no BOS/EOS of its own (nor does HF's GPT-2 tokenizer), so there is none to add.
        """
        if allow_special_tokens:
            return self._enc.encode(text, allowed_special="all")
        return self._enc.encode(text, allowed_special=set(), disallowed_special=())

    def encode_batch(self, texts: list[str], allow_special_tokens: bool = False) -> list[list[int]]:
        """Token ids for many texts, in tiktoken's own thread pool."""
        if allow_special_tokens:
            return self._enc.encode_batch(texts, allowed_special="all")
        return self._enc.encode_batch(texts, allowed_special=set(), disallowed_special=())

    def decode(self, ids: list[int]) -> str:
        """Text for ids; invalid UTF-8 becomes U+FFFD."""
        return self._enc.decode(ids, errors="replace")

    def token_bytes(self, ids: list[int]) -> list[bytes]:
        """Each token's own bytes (may be part of a UTF-8 sequence)."""
        return [self._enc.decode_single_token_bytes(i) for i in ids]


def load_tokenizer(spec: TokenizerSpec, ranks_path: Path) -> Tokenizer:
    """Build the tokenizer from a ranks file, checking its sha256 when the spec has one."""
    data = ranks_path.read_bytes()
    if spec.sha256 and hashlib.sha256(data).hexdigest() != spec.sha256:
        raise ValueError(f"{ranks_path}: sha256 does not match the tokenizer spec")
    return Tokenizer(spec, load_ranks(ranks_path))

"""Corpus -> token shard on disk -> train/val memory maps.

Inputs are text files, globs, directories (every file below them) and JSONL files (one
document per line, in its ``text`` field); with none, the English text of CPython's
``pydoc_data.topics``. Each document is tokenized on its own and documents are joined
by ``<|endoftext|>``. Text is read in blocks and cut only where a non-space character is
followed by whitespace: GPT-2's pre-tokenizer always ends a piece there, so cutting
changes no token (tested). Blocks (and small documents) are grouped into ~1M-character
jobs, encoded by a thread pool (tiktoken releases the GIL while it encodes) with at most
two jobs per core in flight, and written in order as they finish. Memory is therefore
bounded by the in-flight jobs, never by the corpus; only a single JSONL line must fit.

The tokens go to ``<cache_dir>/<key>/tokens.bin`` (uint16 when ids fit, else uint32),
``key`` being the sha256 of the tokenizer and every input's bytes; a second run with the
same inputs maps the same file. The first ``1 - val_fraction`` of the stream trains, the
rest validates.
"""

from __future__ import annotations

import glob
import hashlib
import json
import os
import shutil
import tempfile
from collections import deque
from collections.abc import Iterator, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from client.files import usual_mode
from service.format.tokenizer import ENDOFTEXT, Tokenizer
from training.errors import UsageError
from training.progress import progress_bar

__all__ = ["DEFAULT_CORPUS", "TokenData", "default_corpus_ids", "default_corpus_text",
           "iter_blocks", "load_tokens", "resolve_sources", "token_dtype"]

DEFAULT_CORPUS = "pydoc_data.topics"
_BLOCK_CHARS = 1 << 18  # a block's token list is a few MB of Python ints while in flight
_JOB_CHARS = 1 << 20  # per encode job: amortises the hand-off for many small JSONL documents
_MAX_CARRY_BLOCKS = 16  # text without a safe cut for this many blocks is cut anyway


@dataclass(frozen=True)
class TokenData:
    """The tokenized corpus: read-only memory maps of one shard."""

    train: np.ndarray  # (N_train,) uint16/uint32
    val: np.ndarray  # (N_val,)
    corpus_sha256: str  # cache key: tokenizer + inputs' bytes
    path: Path  # the shard
    reused: bool  # True when the shard came from the cache


def token_dtype(n_vocab: int) -> np.dtype:
    """The narrowest unsigned dtype that holds every id."""
    return np.dtype(np.uint16) if n_vocab <= 1 << 16 else np.dtype(np.uint32)


def default_corpus_text() -> str:
    """CPython's pydoc topics, joined by blank lines (~465k chars, ~139k GPT-2 tokens)."""
    from pydoc_data.topics import topics

    return "\n\n".join(topics.values())


def default_corpus_ids() -> list[int]:
    """The default corpus as GPT-2 token ids (the local ranks file; no network)."""
    from service.format.tokenizer import default_ranks_path, gpt2_spec, load_tokenizer

    return load_tokenizer(gpt2_spec(), default_ranks_path()).encode(default_corpus_text())


def resolve_sources(patterns: Sequence[str]) -> list[Path]:
    """Expand globs and directories into a sorted, de-duplicated list of files."""
    found: list[Path] = []
    for pattern in patterns:
        matches = sorted(glob.glob(pattern, recursive=True))
        if not matches and glob.has_magic(pattern):
            raise UsageError(f"--data {pattern}: the pattern matches no file or directory "
                             f"(relative to {Path.cwd()}); check the path, or quote the "
                             f"glob so the shell does not expand it")
        for m in map(Path, matches or [pattern]):
            if m.is_dir():
                files = sorted(p for p in m.rglob("*") if p.is_file())
                if not files:  # else the job would silently train on the default corpus
                    raise UsageError(f"--data {pattern}: the directory {m} holds no files")
                found.extend(files)
            elif m.is_file():
                found.append(m)
            else:
                raise UsageError(f"--data {pattern}: no such file or directory (relative "
                                 f"to {Path.cwd()})")
    unique: dict[Path, Path] = {}
    for p in found:
        unique.setdefault(p.resolve(), p)
    return list(unique.values())


def _cut(text: str) -> int:
    """Last index i with text[i-1] non-space and text[i] whitespace (0 if none)."""
    for i in range(len(text) - 1, 0, -1):
        if text[i].isspace() and not text[i - 1].isspace():
            return i
    return 0


def iter_blocks(documents: Iterator[Iterator[str]], block_chars: int | None = None
                ) -> Iterator[tuple[str, bool]]:
    """Re-cut each document's text pieces into (block, ends_document) at token-safe points.

    Text with no safe point in ``16 * block_chars`` characters (no whitespace at all) is
    cut at ``block_chars`` regardless: memory stays bounded, and the one or two tokens
    around such a cut may differ from encoding the text whole.
    """
    size = block_chars or _BLOCK_CHARS
    for pieces in documents:
        carry = ""
        for piece in pieces:
            carry += piece
            while len(carry) >= size:
                cut = _cut(carry[:size]) or _cut(carry)
                if cut == 0:
                    if len(carry) < _MAX_CARRY_BLOCKS * size:
                        break  # no safe point yet: keep reading
                    cut = size
                yield carry[:cut], False
                carry = carry[cut:]
        yield carry, True


def _read_text(path: Path) -> Iterator[str]:
    with path.open(encoding="utf-8", errors="replace", newline="") as f:
        while piece := f.read(_BLOCK_CHARS):
            yield piece


def _documents(sources: Sequence[Path]) -> Iterator[Iterator[str]]:
    if not sources:
        yield iter([default_corpus_text()])
    for path in sources:
        if path.suffix == ".jsonl":
            with path.open("rb") as f:
                for lineno, raw in enumerate(f, 1):
                    if raw.strip():
                        try:
                            yield iter([str(json.loads(raw)["text"])])
                        except (ValueError, KeyError, TypeError) as e:  # UnicodeError too
                            raise UsageError(f"{path}:{lineno}: need a JSON object with "
                                             f"a 'text' field, one per line, in UTF-8") from e
        else:
            yield _read_text(path)


def _corpus_key(sources: Sequence[Path], tokenizer: Tokenizer) -> str:
    h = hashlib.sha256(b"tokens/1\0" + tokenizer.spec.sha256.encode() + b"\0")
    if not sources:
        h.update(DEFAULT_CORPUS.encode() + b"\0" + default_corpus_text().encode())
    for path in sources:
        h.update(b"\0jsonl\0" if path.suffix == ".jsonl" else b"\0text\0")
        with path.open("rb") as f:
            while chunk := f.read(1 << 22):
                h.update(chunk)
    return h.hexdigest()


def _jobs(sources: Sequence[Path]) -> Iterator[list[tuple[str, bool]]]:
    """Blocks grouped into jobs of ~_JOB_CHARS, each with "<|endoftext|> goes before it"."""
    job: list[tuple[str, bool]] = []
    chars, starts_document, first = 0, True, True
    for block, ends in iter_blocks(_documents(sources)):
        # <|endoftext|> goes between documents: before each one but the first.
        job.append((block, starts_document and not first))
        chars += len(block)
        starts_document, first = ends, False
        if chars >= _JOB_CHARS:
            yield job
            job, chars = [], 0
    if job:
        yield job


def _encode_job(tokenizer: Tokenizer, job: list[tuple[str, bool]], eot: list[int],
                dtype: np.dtype) -> np.ndarray:
    ids: list[int] = []
    for text, sep_before in job:
        if sep_before:
            ids.extend(eot)
        ids.extend(tokenizer.encode(text))
    return np.array(ids, dtype=dtype)  # (n,)


def _tokenize_to(out: Path, sources: Sequence[Path], tokenizer: Tokenizer,
                 progress: bool) -> None:
    dtype = token_dtype(tokenizer.n_vocab)
    eot = tokenizer.encode(ENDOFTEXT, allow_special_tokens=True)
    workers = len(os.sched_getaffinity(0))
    with (progress_bar("tokenize", unit="tok", unit_scale=True, disable=not progress) as bar,
          out.open("wb") as f, ThreadPoolExecutor(workers) as pool):
        pending: deque[Future[np.ndarray]] = deque()

        def write_oldest() -> None:
            ids = pending.popleft().result()
            f.write(ids.data)  # an OSError with its errno (tofile's has none)
            bar.update(ids.size)

        for job in _jobs(sources):
            pending.append(pool.submit(_encode_job, tokenizer, job, eot, dtype))
            if len(pending) >= 2 * workers:  # bounded: reading waits for the encoders
                write_oldest()
        while pending:
            write_oldest()
        f.flush()
        os.fsync(f.fileno())


def load_tokens(patterns: Sequence[str], tokenizer: Tokenizer, cache_dir: Path,
                val_fraction: float, progress: bool = True) -> TokenData:
    """Tokenize (or reuse) the corpus and split it into train/val memory maps."""
    sources = resolve_sources(patterns)
    key = _corpus_key(sources, tokenizer)
    shard_dir = Path(cache_dir) / key
    shard = shard_dir / "tokens.bin"
    reused = shard.is_file() and (shard_dir / "meta.json").is_file()
    if not reused:
        shard_dir.parent.mkdir(parents=True, exist_ok=True)
        tmp = Path(tempfile.mkdtemp(prefix=f".{key[:16]}.tmp-", dir=shard_dir.parent))
        os.chmod(tmp, usual_mode(directory=True))  # renamed into place: not mkdtemp's 0700
        try:
            _tokenize_to(tmp / "tokens.bin", sources, tokenizer, progress)
            meta = {"dtype": token_dtype(tokenizer.n_vocab).name,
                    "n_vocab": tokenizer.n_vocab, "sources": [str(p) for p in sources]}
            (tmp / "meta.json").write_text(json.dumps(meta, indent=2) + "\n")
            try:
                os.rename(tmp, shard_dir)
            except OSError:  # another process finished the same shard first
                shutil.rmtree(tmp, ignore_errors=True)
        except OSError as e:
            shutil.rmtree(tmp, ignore_errors=True)
            if e.filename:
                raise
            # a failed write (a full disk): named for the shard it was for
            raise OSError(e.errno, e.strerror or str(e), str(shard)) from None
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)
            raise
    tokens = np.memmap(shard, dtype=token_dtype(tokenizer.n_vocab), mode="r")
    n_train = int(len(tokens) * (1.0 - val_fraction))
    if n_train < 2 or len(tokens) - n_train < 2:
        raise UsageError(f"--data: the corpus is too small: {len(tokens)} tokens leave "
                         f"{n_train} for training and {len(tokens) - n_train} for validation "
                         f"at --val-fraction {val_fraction} (need >= 2 each); give more text")
    return TokenData(train=tokens[:n_train], val=tokens[n_train:], corpus_sha256=key,
                     path=shard, reused=reused)

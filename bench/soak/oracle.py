"""The soak's versions: each one published, and every answer checked exactly against the one
it names.

A version is staged by the real writer, registered with the oracle, then renamed into the
repository, so no answer can name a version the soak does not know; a bad one has a byte
of its embeddings flipped after its manifest recorded the sha256. An answer's rows are
recomputed from its version's tables as the contract says (``token_table[ids] +
position_table[s .. s+T-1]`` in fp32, then cast) and compared byte for byte; an unknown
checkpoint_id, or a version that does not match it, fails too (a mixed or half-loaded
version).
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import torch

from bench.harness.checkpoint import VOCAB_SIZE, write_random
from bench.soak.requests import MODEL, Expected, Item
from genproto.embedding.v1 import embedding_pb2 as pb
from service.format.manifest import EMBEDDINGS_FILE, MANIFEST_FILE

__all__ = ["Oracle", "PublishedVersion", "Publisher"]

_TORCH_DTYPES: dict[int, torch.dtype] = {
    pb.DTYPE_FLOAT32: torch.float32, pb.DTYPE_FLOAT16: torch.float16,
    pb.DTYPE_BFLOAT16: torch.bfloat16}


@dataclass(frozen=True)
class PublishedVersion:
    """One version the soak wrote: its number, id and fp32 tables."""

    version: int
    checkpoint_id: str
    token_table: torch.Tensor  # (table_rows, C)
    position_table: torch.Tensor  # (max_seq_len, C)


class Oracle:
    """Published versions by checkpoint_id; ``check_*`` return None or what is wrong."""

    def __init__(self, max_seq_len: int, encode: Callable[[str, bool], list[int]],
                 model: str = MODEL) -> None:
        self.max_seq_len, self.model, self.encode = max_seq_len, model, encode
        self.versions: dict[str, PublishedVersion] = {}

    def fit(self, item: Item, truncate: int, special: bool) -> tuple[list[int], int]:
        """The ids the server must embed for ``item``, and how many it must cut."""
        ids = list(item.ids) if item.ids is not None else self.encode(item.text or "", special)
        room = self.max_seq_len - item.start
        if len(ids) <= room:
            return ids, 0
        kept = ids[:room] if truncate == pb.TRUNCATE_RIGHT else ids[len(ids) - room:]
        return kept, len(ids) - room

    @staticmethod
    def rows(v: PublishedVersion, ids: Sequence[int], start: int, compose: int,
             dtype: int) -> torch.Tensor:
        """The exact (T, C) rows in the wire dtype."""
        tok = v.token_table[torch.tensor(list(ids), dtype=torch.long)]  # (T, C)
        pos = v.position_table[start:start + len(ids)]  # (T, C)
        if compose == pb.COMPOSE_TOKEN_ONLY:
            out = tok
        elif compose == pb.COMPOSE_POSITION_ONLY:
            out = pos
        else:
            out = tok + pos  # fp32 add, as the contract says
        return out.to(_TORCH_DTYPES[dtype]).contiguous()

    def _version(self, resp: pb.EmbedResponse | pb.EmbedBatchResponse) -> PublishedVersion | str:
        v = self.versions.get(resp.checkpoint_id)
        if v is None:
            return f"checkpoint_id {resp.checkpoint_id[:16]} was never published"
        if resp.model != self.model or resp.version != v.version:
            return (f"answer names {resp.model}/{resp.version} but checkpoint_id "
                    f"{resp.checkpoint_id[:12]} is {self.model}/{v.version}")
        return v

    def _tensor(self, t: pb.Tensor, v: PublishedVersion, parts: list[tuple[list[int], int]],
                exp: Expected) -> str | None:
        want = torch.cat([self.rows(v, ids, start, exp.compose, exp.dtype)
                          for ids, start in parts])
        if list(t.shape) != list(want.shape) or t.dtype != exp.dtype:
            return f"tensor {list(t.shape)}/{t.dtype}, expected {list(want.shape)}/{exp.dtype}"
        if t.data != want.view(torch.uint8).numpy().tobytes():
            return f"rows differ from version {v.version}'s tables"
        return None

    def check_embed(self, resp: pb.EmbedResponse, exp: Expected) -> str | None:
        """None when ``resp`` is exactly what ``exp`` asks of the version it names."""
        v = self._version(resp)
        if isinstance(v, str):
            return v
        (item,) = exp.items
        ids, cut = self.fit(item, exp.truncate, exp.allow_special)
        if list(resp.token_ids) != ids or resp.truncated_tokens != cut:
            return f"token_ids {list(resp.token_ids)[:6]}.. cut {resp.truncated_tokens}, " \
                   f"expected {ids[:6]}.. cut {cut}"
        if resp.start_position != item.start:
            return f"start_position {resp.start_position}, expected {item.start}"
        return self._tensor(resp.embeddings, v, [(ids, item.start)], exp)

    def check_batch(self, resp: pb.EmbedBatchResponse, exp: Expected) -> str | None:
        """The batch's one tensor, offsets and items, all from the one version it names."""
        v = self._version(resp)
        if isinstance(v, str):
            return v
        parts = [self.fit(item, exp.truncate, exp.allow_special) for item in exp.items]
        offsets = [0]
        for ids, _ in parts:
            offsets.append(offsets[-1] + len(ids))
        if list(resp.offsets) != offsets or len(resp.items) != len(parts):
            return f"offsets {list(resp.offsets)}, expected {offsets}"
        for i, (got, (ids, cut), item) in enumerate(zip(resp.items, parts, exp.items)):
            if list(got.token_ids) != ids or got.truncated_tokens != cut \
                    or got.start_position != item.start:
                return f"items[{i}] token_ids/cut/start differ"
        return self._tensor(resp.embeddings, v,
                            [(ids, item.start) for (ids, _), item in zip(parts, exp.items)],
                            exp)


class Publisher:
    """Writes good and bad versions of ``oracle.model`` into ``root/models``: GPT-2's
    tokenizer and vocabulary, or ids only (``tokenizer=False``) over ``vocab_size`` rows."""

    def __init__(self, root: Path, oracle: Oracle, dim: int, max_seq_len: int,
                 vocab_size: int = VOCAB_SIZE, tokenizer: bool = True) -> None:
        self.models, self.staging = root / "models", root / "staging" / oracle.model
        self.oracle, self.dim, self.max_seq_len = oracle, dim, max_seq_len
        self.vocab_size, self.tokenizer = vocab_size, tokenizer
        self.next_version = 1
        self.good: list[int] = []
        self.bad: list[int] = []

    def _next(self) -> tuple[int, Path]:
        self.next_version += 1
        return self.next_version - 1, self.staging / str(self.next_version - 1)

    def _place(self, staged: Path, version: int) -> None:
        target = self.models / self.oracle.model / str(version)
        target.parent.mkdir(parents=True, exist_ok=True)
        os.rename(staged, target)  # atomic on one filesystem

    def _write(self, version: int, out: Path) -> tuple[torch.Tensor, torch.Tensor | None]:
        return write_random(out, self.vocab_size, self.dim, self.max_seq_len, 1000 + version,
                            tokenizer=self.tokenizer,  # distinct tables per version
                            provenance={"source": "bench.soak", "version": version})

    def publish(self) -> tuple[int, str]:
        """A good new version; returns (version, checkpoint_id)."""
        version, staged = self._next()
        tok, pos = self._write(version, staged)
        checkpoint_id = hashlib.sha256((staged / MANIFEST_FILE).read_bytes()).hexdigest()
        assert pos is not None
        self.oracle.versions[checkpoint_id] = PublishedVersion(version, checkpoint_id, tok, pos)
        self._place(staged, version)
        self.good.append(version)
        return version, checkpoint_id

    def publish_bad(self) -> int:
        """A version whose embeddings file no longer matches its manifest's sha256."""
        version, staged = self._next()
        self._write(version, staged)
        data = bytearray((staged / EMBEDDINGS_FILE).read_bytes())
        data[len(data) // 2] ^= 0xFF
        (staged / EMBEDDINGS_FILE).write_bytes(bytes(data))
        self._place(staged, version)
        self.bad.append(version)
        return version

"""The soak's server side: the model repository it publishes into, and the server's processes.

Versions are written by ``service.format.checkpoint.write_checkpoint`` (atomic: temp dir, then
rename) into a staging directory next to the repository, registered with the oracle, and
only then renamed into ``models/soak/<version>``, so no answer can name a version before
the soak knows its tables. A bad version is a real one with one byte of its embeddings
file flipped after the manifest recorded its sha256.
"""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

import torch

from bench.harness.launch import ServerProcess, memory_mb, process_tree, service_argv
from bench.harness.launch import launch as launch_server
from bench.soak.oracle import Oracle, PublishedVersion
from bench.soak.requests import MODEL
from service.format.manifest import EMBEDDINGS_FILE, MANIFEST_FILE
from service.format.tokenizer import default_ranks_path, gpt2_spec
from service.format.writer import write_checkpoint

__all__ = ["Publisher", "launch", "tree_rss_mb"]

VOCAB_SIZE = 50257


class Publisher:
    """Writes good and bad versions of ``model`` into ``root/models``: GPT-2's tokenizer and
    vocabulary, or ids only (``tokenizer=False``) over ``vocab_size`` rows."""

    def __init__(self, root: Path, oracle: Oracle, dim: int, max_seq_len: int,
                 model: str = MODEL, vocab_size: int = VOCAB_SIZE,
                 tokenizer: bool = True) -> None:
        self.models = root / "models"
        self.staging = root / "staging" / model
        self.oracle, self.dim, self.max_seq_len = oracle, dim, max_seq_len
        self.model, self.vocab_size, self.tokenizer = model, vocab_size, tokenizer
        self.next_version = 1
        self.good: list[int] = []
        self.bad: list[int] = []

    def _write(self, version: int) -> tuple[Path, str, torch.Tensor, torch.Tensor]:
        gen = torch.Generator().manual_seed(1000 + version)  # distinct tables per version
        token_table = torch.randn(self.vocab_size, self.dim, generator=gen)  # (vocab, C)
        position_table = torch.randn(self.max_seq_len, self.dim, generator=gen)  # (L, C)
        out = self.staging / str(version)
        write_checkpoint(out, token_table=token_table, position_table=position_table,
                         position="learned", max_seq_len=self.max_seq_len,
                         vocab_size=self.vocab_size,
                         tokenizer_spec=gpt2_spec() if self.tokenizer else None,
                         tokenizer_ranks=default_ranks_path() if self.tokenizer else None,
                         provenance={"source": "bench.soak", "version": version})
        checkpoint_id = hashlib.sha256((out / MANIFEST_FILE).read_bytes()).hexdigest()
        return out, checkpoint_id, token_table, position_table

    def _place(self, staged: Path, version: int) -> None:
        target = self.models / self.model / str(version)
        target.parent.mkdir(parents=True, exist_ok=True)
        os.rename(staged, target)  # atomic on one filesystem

    def publish(self) -> tuple[int, str]:
        """A good new version; returns (version, checkpoint_id)."""
        version = self.next_version
        self.next_version += 1
        staged, checkpoint_id, tok, pos = self._write(version)
        self.oracle.add(PublishedVersion(version, checkpoint_id, tok, pos))
        self._place(staged, version)
        self.good.append(version)
        return version, checkpoint_id

    def publish_bad(self) -> int:
        """A version whose embeddings file no longer matches its manifest's sha256."""
        version = self.next_version
        self.next_version += 1
        staged, _, _, _ = self._write(version)
        path = staged / EMBEDDINGS_FILE
        data = bytearray(path.read_bytes())
        data[len(data) // 2] ^= 0xFF
        path.write_bytes(bytes(data))
        self._place(staged, version)
        self.bad.append(version)
        return version


def launch(root: Path, port: int, workers: int, poll_seconds: float,
           extra: list[str], http_port: int = -1) -> ServerProcess:
    """``python -m service`` over ``root/models`` on ``port`` (and REST on ``http_port``,
    -1: off); its log in ``root``."""
    argv = service_argv(root, port, "--default-model", MODEL, "--workers", str(workers),
                        "--poll-seconds", str(poll_seconds), *extra, http_port=http_port)
    return launch_server("server", argv, port, root, http_port)


def tree_rss_mb(parent: int) -> tuple[float, dict[int, float]]:
    """RSS of the server: parent + every child (workers, resource tracker), in MB."""
    each = {pid: memory_mb(pid) for pid in process_tree(parent)}
    return sum(each.values()), each

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
import subprocess
import sys
from pathlib import Path

import torch

from bench.servers import GLIBC_TUNABLES, ServerProcess
from bench.soak.oracle import Oracle, PublishedVersion
from bench.soak.requests import MODEL
from service.format.checkpoint import EMBEDDINGS_FILE, MANIFEST_FILE
from service.format.writer import write_checkpoint
from service.format.tokenizer import default_ranks_path, gpt2_spec

__all__ = ["ROOT", "Publisher", "launch", "tree_rss_mb", "worker_pids"]

ROOT = Path(__file__).resolve().parents[2]  # the repository
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
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    env.setdefault("GLIBC_TUNABLES", GLIBC_TUNABLES)
    argv = [sys.executable, "-m", "service", "--model-repository", str(root / "models"),
            "--default-model", MODEL, "--host", "127.0.0.1", "--grpc-port", str(port),
            "--http-port", str(http_port),
            "--metrics-port", "-1", "--device", "cpu", "--workers", str(workers),
            "--poll-seconds", str(poll_seconds), *extra]
    log = root / "server.log"
    with log.open("wb") as fh:
        proc = subprocess.Popen(argv, cwd=ROOT, env=env, stdout=fh, stderr=subprocess.STDOUT)
    return ServerProcess("service", f"127.0.0.1:{port}", proc, log)


def _children(pid: int) -> list[int]:
    try:
        return [int(p) for p in Path(f"/proc/{pid}/task/{pid}/children").read_text().split()]
    except OSError:
        return []


def worker_pids(parent: int) -> list[int]:
    """The parent's spawned server workers (not multiprocessing's resource tracker)."""
    pids = []
    for pid in _children(parent):
        try:
            if b"spawn_main" in Path(f"/proc/{pid}/cmdline").read_bytes():
                pids.append(pid)
        except OSError:
            continue  # exited in between
    return sorted(pids)


def _rss_kb(pid: int) -> int:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    except OSError:
        pass
    return 0


def tree_rss_mb(parent: int) -> tuple[float, dict[int, float]]:
    """RSS of the server: parent + every child (workers, resource tracker), in MB."""
    pids = [parent, *_children(parent)]
    each = {pid: _rss_kb(pid) / 1024 for pid in pids}
    return sum(each.values()), each

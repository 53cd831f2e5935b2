"""Obtain the GPT-2 (r50k_base) BPE ranks offline, checked against a pinned sha256.

tiktoken cannot download here, and its download has no timeout. The openai-whisper sdist
on PyPI carries ``whisper/assets/gpt2.tiktoken``, byte-identical to tiktoken's r50k_base
ranks, so we take it from there through pip (a package registry we can reach) and never
through tiktoken's own loader.
"""

from __future__ import annotations

import hashlib
import subprocess
import sys
import tarfile
import tempfile
from pathlib import Path

from service.format.tokenizer import GPT2_RANKS_SHA256, default_ranks_path

__all__ = ["fetch", "main"]

WHISPER_SDIST = "openai-whisper==20250625"  # pinned: its gpt2.tiktoken has GPT2_RANKS_SHA256
MEMBER_SUFFIX = "whisper/assets/gpt2.tiktoken"
DEFAULT_DEST = default_ranks_path()


def _sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def fetch(dest: Path = DEFAULT_DEST) -> Path:
    """Make sure ``dest`` holds the verified ranks file; download the sdist only if needed."""
    if dest.exists() and _sha256(dest) == GPT2_RANKS_SHA256:
        return dest
    dest.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp:
        print(f"tokenizer: fetching {WHISPER_SDIST} sdist for its gpt2.tiktoken", flush=True)
        subprocess.run(
            [sys.executable, "-m", "pip", "download", "--quiet", "--no-deps",
             "--no-binary", ":all:", "--disable-pip-version-check", WHISPER_SDIST, "-d", tmp],
            check=True,
        )
        (sdist,) = Path(tmp).glob("openai_whisper-*.tar.gz")
        with tarfile.open(sdist) as tar:
            member = next(m for m in tar.getmembers() if m.name.endswith(MEMBER_SUFFIX))
            data = tar.extractfile(member).read()  # type: ignore[union-attr]
    digest = hashlib.sha256(data).hexdigest()
    if digest != GPT2_RANKS_SHA256:
        raise SystemExit(f"tokenizer: sha256 mismatch {digest} != {GPT2_RANKS_SHA256}")
    tmp_dest = dest.with_suffix(".tmp")
    tmp_dest.write_bytes(data)
    tmp_dest.replace(dest)
    print(f"tokenizer: {dest} sha256 {digest[:16]}… ok", flush=True)
    return dest


def main() -> None:
    """Entry point: fetch into service/format/assets/ (or the path given as the only argument)."""
    fetch(Path(sys.argv[1]) if len(sys.argv) > 1 else DEFAULT_DEST)


if __name__ == "__main__":
    main()

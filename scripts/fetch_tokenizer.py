"""Obtain the GPT-2 (r50k_base) BPE ranks offline, checked against a pinned sha256.

tiktoken cannot download here, and its download has no timeout. The openai-whisper sdist
on PyPI carries ``whisper/assets/gpt2.tiktoken``, byte-identical to tiktoken's r50k_base
ranks, so we take it from there through pip (a package registry we can reach) and never
through tiktoken's own loader.

    python scripts/fetch_tokenizer.py [DEST]   # default: service/format/assets/gpt2.tiktoken

DEST is written at exactly that path, in an existing directory. A mistake is one line and
exit status 2, a download that fails one line and exit status 1.
"""

from __future__ import annotations

import argparse
import hashlib
import subprocess
import sys
import tarfile
import tempfile
from collections.abc import Sequence
from pathlib import Path

from client import flags
from service.format.tokenizer import GPT2_RANKS_SHA256, default_ranks_path

__all__ = ["RULES", "build_parser", "fetch", "main"]

PROG = "scripts/fetch_tokenizer.py"
RULES = {"dest": flags.output_file()}

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
        pip = subprocess.run(
            [sys.executable, "-m", "pip", "download", "--quiet", "--no-deps",
             "--no-binary", ":all:", "--disable-pip-version-check", WHISPER_SDIST, "-d", tmp],
            check=False,
        )
        if pip.returncode != 0:  # pip said why on stderr, above this line
            raise SystemExit(f"tokenizer: pip could not download {WHISPER_SDIST} (exit status "
                             f"{pip.returncode}): is a package index reachable?")
        (sdist,) = Path(tmp).glob("openai_whisper-*.tar.gz")
        with tarfile.open(sdist) as tar:
            member = next(m for m in tar.getmembers() if m.name.endswith(MEMBER_SUFFIX))
            data = tar.extractfile(member).read()  # type: ignore[union-attr]
    digest = hashlib.sha256(data).hexdigest()
    if digest != GPT2_RANKS_SHA256:
        raise SystemExit(f"tokenizer: sha256 mismatch {digest} != {GPT2_RANKS_SHA256}")
    tmp_dest = dest.with_name(f".{dest.name}.tmp")  # beside it: renamed into place, whole
    tmp_dest.write_bytes(data)
    tmp_dest.replace(dest)
    print(f"tokenizer: {dest} sha256 {digest[:16]}… ok", flush=True)
    return dest


def build_parser() -> argparse.ArgumentParser:
    """The argument parser, its one option checked by its rule in RULES."""
    parser = flags.OneLineParser(prog=PROG, description="Fetch the GPT-2 BPE ranks offline "
                                 "(from the openai-whisper sdist), checked against a pinned "
                                 "sha256.")
    parser.add_argument("dest", nargs="?", metavar="DEST",
                        help=f"the file to write (default {DEFAULT_DEST})")
    flags.install(parser, RULES)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point: fetch into service/format/assets/ (or DEST)."""
    args = flags.parse(build_parser(), RULES, argv)
    try:
        fetch(args.dest or DEFAULT_DEST)
    except OSError as e:
        print(f"tokenizer: {e.filename or ''}: {e.strerror or e}", file=sys.stderr)
        return 1
    except Exception as e:  # a bug: its traceback to a file, one line here
        return flags.internal_error(PROG, e)
    return 0


if __name__ == "__main__":
    sys.exit(main())

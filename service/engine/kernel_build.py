"""Building the one-pass lookup (``lookup.c``) into a shared library: the standard library
only, so an image's build stage can run it with a bare Python and a C compiler:

    python service/engine/kernel_build.py [DIR]    # prints the library's path

The library's file name carries the hash of the source and flags, so an edited
``lookup.c`` is never served by a stale build. It is written into ``DIR`` (default: this
package's folder, or ``EMBED_KERNEL_DIR``) through a temporary name and an atomic rename,
so workers starting together never load a half-written file. ``kernel.py`` loads it.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

__all__ = ["SOURCE", "build", "library_path"]

SOURCE = Path(__file__).with_name("lookup.c")
# IEEE sums and roundings only: no -ffast-math, and no FMA contraction of to_f16's scale.
# No -march: the image runs on whatever x86-64 it is scheduled on (SSE2 is the baseline).
FLAGS = ["-O3", "-shared", "-fPIC", "-std=c11", "-ffp-contract=off", "-fno-math-errno"]


def library_path(folder: Path | None = None) -> Path:
    """Where the library for this ``lookup.c`` and these flags lives (built or not)."""
    digest = hashlib.sha256(SOURCE.read_bytes() + " ".join(FLAGS).encode()).hexdigest()
    folder = folder or Path(os.environ.get("EMBED_KERNEL_DIR") or SOURCE.parent)
    return folder / f"_lookup-{digest[:16]}.so"


def build(folder: Path | None = None) -> Path:
    """Compile ``lookup.c`` (if not built yet) and return the library's path."""
    target = library_path(folder)
    if target.exists():
        return target
    cc = os.environ.get("CC") or shutil.which("cc") or shutil.which("gcc")
    if cc is None:
        raise FileNotFoundError("no C compiler (cc, gcc or $CC) to build the lookup kernel")
    target.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=target.parent, prefix=".lookup-", suffix=".so")
    os.close(fd)
    try:
        subprocess.run([cc, *FLAGS, "-o", tmp, str(SOURCE)], check=True,
                       capture_output=True, text=True)
        os.chmod(tmp, 0o644)  # mkstemp's 0600 would hide it from a non-root server
        os.replace(tmp, target)
        for stale in target.parent.glob("_lookup-*.so"):  # builds of an older lookup.c
            if stale != target:
                stale.unlink(missing_ok=True)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)
    return target


if __name__ == "__main__":
    print(build(Path(sys.argv[1]) if len(sys.argv) > 1 else None))

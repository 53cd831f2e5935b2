"""Files the tools write for the user: whole or not at all, with the usual mode.

A file is written to a temporary name in its own directory and renamed into place, so a
failed write leaves no partial file. ``tempfile.mkstemp`` makes that temporary file 0600
(and ``mkdtemp`` a directory 0700), which the rename would keep: the file gets the mode an
ordinary ``open()`` (or ``mkdir``) would have given it instead, 0666 (0777) less the umask,
as every other program writes files. Standard library only.
"""

from __future__ import annotations

import contextlib
import os
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import BinaryIO

__all__ = ["umask", "usual_mode", "write_atomically"]


def umask() -> int:
    """The process's umask (reading it means setting it: set back at once)."""
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def usual_mode(directory: bool = False) -> int:
    """The mode ``open()`` gives a new file (``mkdir`` a new directory) under this umask."""
    return (0o777 if directory else 0o666) & ~umask()


def write_atomically(path: Path, write: Callable[[BinaryIO], object]) -> None:
    """``write(f)`` into a temporary file beside ``path``, flushed to disk, then renamed to
    exactly ``path`` with the usual mode; on any failure the temporary file is removed."""
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        os.fchmod(fd, usual_mode())
        with os.fdopen(fd, "wb") as f:
            write(f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise

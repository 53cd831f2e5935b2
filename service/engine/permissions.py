"""Why the server may not read a repository entry, said plainly: which path, as which user,
who owns it, and what to change (one log line, no traceback)."""

from __future__ import annotations

import os
from pathlib import Path

__all__ = ["permission_error", "unlistable_message", "unreadable_message"]


def unlistable_message(e: OSError, where: Path) -> str:
    """Why a directory cannot be listed: the plain permission message, or the OS's word."""
    denied = permission_error(e)
    return unreadable_message(denied, where) if denied else f"cannot be listed ({e.strerror})"


def permission_error(e: BaseException | None) -> PermissionError | None:
    """The PermissionError behind ``e`` (itself, or the OSError a reader wrapped)."""
    while e is not None:
        if isinstance(e, PermissionError):
            return e
        e = e.__cause__
    return None


def unreadable_message(e: PermissionError, where: Path) -> str:
    """A plain refusal for a file or directory this process may not read: which path, as
    which uid/gid, who owns it with which mode, and what to change (no traceback)."""
    path = Path(e.filename) if e.filename else where
    try:
        st = path.stat()
        owner = f"owned by uid {st.st_uid} gid {st.st_gid}, mode {st.st_mode & 0o7777:04o}"
    except OSError:
        owner = "its owner and mode cannot be read either"
    return (f"permission denied reading {path} as uid {os.getuid()} gid {os.getgid()} "
            f"({owner}); make the repository readable by the server: files 0644 and "
            f"directories 0755 (chmod -R a+rX {where}), or give it the server's group "
            f"(gid {os.getgid()}, Kubernetes fsGroup) with group read; see docs/deploy.md")


"""Tables read once and shared by every worker: sealed memfds made by the supervisor.

With ``--workers N`` the supervisor (which imports neither torch nor numpy) reads the
newest version's ``embeddings.safetensors`` of each model in the repository once, into an
anonymous memory file (``memfd_create``), hashing it as it reads, and seals the file
(``F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_WRITE | F_SEAL_SEAL``): from then on nobody (the
supervisor included) can change, shrink or grow it. It hands the workers the list of
``sha256=fd`` pairs (``EMBEDDING_SHARED_TABLES``, with its pid); a worker whose manifest
names a file by one of those hashes maps that memfd (``tensorfile.read_private`` asks
``lookup`` first) instead of reading the file into private memory. Every worker's page
table then points at the same physical pages: a table costs its size once, not once per
worker.

What the private read guarantees still holds. The bytes are a copy made at start-up,
hashed as they were read, and sealed: a file truncated or rewritten on disk afterwards
reaches neither the memfd nor any worker, and a mapping of a file that cannot shrink can
never raise SIGBUS. A worker maps it ``MAP_PRIVATE``: a stray store would copy that one
page into the worker, never reach another worker. A version that is not in the list
(a hot reload, a pinned older version, a hash that differs) is read privately, as before.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import logging
import mmap
import os
from pathlib import Path
from typing import Any

__all__ = ["ENV", "lookup", "publish"]

log = logging.getLogger(__name__)
ENV = "EMBEDDING_SHARED_TABLES"
_FILE = "embeddings.safetensors"
_SEALS = fcntl.F_SEAL_SHRINK | fcntl.F_SEAL_GROW | fcntl.F_SEAL_WRITE | fcntl.F_SEAL_SEAL
_CHUNK = 8 << 20


def _newest_versions(root: Path) -> list[Path]:
    """The newest numeric version folder of each model folder under ``root``."""
    out = []
    for model in sorted(p for p in root.iterdir() if p.is_dir()) if root.is_dir() else ():
        versions = [v for v in model.iterdir()
                    if v.is_dir() and v.name.isascii() and v.name.isdigit()]
        if versions:
            out.append(max(versions, key=lambda v: int(v.name)))
    return out


def _seal_copy(path: Path, sha256: str) -> int | None:
    """``path`` copied into a sealed memfd, or None if its bytes do not hash to sha256."""
    fd = os.memfd_create(f"embed-table-{sha256[:16]}",
                         os.MFD_CLOEXEC | os.MFD_ALLOW_SEALING)
    try:
        with path.open("rb", buffering=0) as f:
            size = os.fstat(f.fileno()).st_size
            os.ftruncate(fd, size)
            h = hashlib.sha256()
            if size:
                with mmap.mmap(fd, size) as m:
                    view = memoryview(m)
                    at = 0
                    while at < size:
                        n = f.readinto(view[at: at + _CHUNK])
                        if not n:  # shrank while read: the worker reads (and refuses) it
                            os.close(fd)
                            return None
                        h.update(view[at: at + n])
                        at += n
                    view.release()
        if h.hexdigest() != sha256:
            os.close(fd)
            return None
        fcntl.fcntl(fd, fcntl.F_ADD_SEALS, _SEALS)
        return fd
    except BaseException:
        os.close(fd)
        raise


def publish(root: Path) -> dict[str, int]:
    """Seal a copy of each model's newest table file; set ``ENV`` for the workers (which
    inherit the descriptors through /proc/<this pid>/fd); return {sha256: fd}."""
    shared: dict[str, int] = {}
    for version in _newest_versions(root):
        try:
            manifest: dict[str, Any] = json.loads((version / "manifest.json").read_text())
            sha256 = manifest["files"][_FILE]
            if not isinstance(sha256, str) or sha256 in shared:
                continue
            fd = _seal_copy(version / _FILE, sha256)
        except (OSError, ValueError, KeyError, TypeError) as e:
            # Not shareable here: the worker reads (and judges) it as before.
            log.info("table of %s not shared: %s", version.name, type(e).__name__)
            continue
        if fd is not None:
            shared[sha256] = fd
    os.environ[ENV] = json.dumps({"pid": os.getpid(), "tables": shared})
    return shared


def lookup(sha256: str | None) -> memoryview | None:
    """The shared, sealed bytes of the file hashing to ``sha256`` (a private, copy-on-
    write mapping of the supervisor's memfd), or None where there is none."""
    raw = os.environ.get(ENV)
    if not raw or sha256 is None:
        return None
    try:
        spec = json.loads(raw)
        fd_number = spec["tables"].get(sha256)
        if fd_number is None:
            return None
        fd = os.open(f"/proc/{int(spec['pid'])}/fd/{int(fd_number)}", os.O_RDONLY | os.O_CLOEXEC)
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return None
    try:
        seals = fcntl.fcntl(fd, fcntl.F_GET_SEALS)
        if seals & _SEALS != _SEALS:  # not the sealed copy it claims to be
            return None
        size = os.fstat(fd).st_size
        if size == 0:
            return None
        mapping = mmap.mmap(fd, size, flags=mmap.MAP_PRIVATE,
                            prot=mmap.PROT_READ | mmap.PROT_WRITE)
    except OSError:
        return None
    finally:
        os.close(fd)
    return memoryview(mapping)

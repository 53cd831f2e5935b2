"""client.files: a file written whole or not at all, with the mode open() would give it."""

from __future__ import annotations

import os
import stat
from collections.abc import Iterator
from pathlib import Path
from typing import BinaryIO

import pytest

from client.files import umask, usual_mode, write_atomically


@pytest.fixture(params=[0o022, 0o077, 0o002])
def mask(request: pytest.FixtureRequest) -> Iterator[int]:
    old = os.umask(request.param)
    yield request.param
    os.umask(old)


def test_written_with_the_usual_mode_under_each_umask(tmp_path: Path, mask: int) -> None:
    assert umask() == mask
    assert usual_mode() == 0o666 & ~mask
    assert usual_mode(directory=True) == 0o777 & ~mask
    path = tmp_path / "x.bin"
    write_atomically(path, lambda f: f.write(b"abc"))
    assert path.read_bytes() == b"abc"
    assert stat.S_IMODE(path.stat().st_mode) == {0o022: 0o644, 0o077: 0o600,
                                                 0o002: 0o664}[mask]
    assert [p.name for p in tmp_path.iterdir()] == ["x.bin"]


def test_a_failed_write_leaves_the_old_file_and_no_temporary(tmp_path: Path) -> None:
    path = tmp_path / "x.bin"
    path.write_bytes(b"old")

    def fail(f: BinaryIO) -> None:
        f.write(b"half")
        raise OSError(28, "No space left on device")

    with pytest.raises(OSError, match="No space left"):
        write_atomically(path, fail)
    assert path.read_bytes() == b"old"
    assert [p.name for p in tmp_path.iterdir()] == ["x.bin"]

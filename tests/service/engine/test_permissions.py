"""A version the server may not read is refused with a plain message, not a traceback:
which file, as which uid/gid, its owner and mode, and what to change. A model directory it
may not list is skipped with one such line, and the other models still load.

The kernel refuses for real. As root, the files are made another user's (uid 65534, mode
0600/0700, as a writer with umask 077 would leave them) and the scan runs in a subprocess
without CAP_DAC_OVERRIDE / CAP_DAC_READ_SEARCH, so root reads only what any other user could
(the interpreter lives under /root, so dropping to another uid is not an option here);
otherwise the files are made unreadable to their owner with mode 000."""

from __future__ import annotations

import ctypes
import json
import os
import subprocess
import sys
from pathlib import Path

from service.format.manifest import EMBEDDINGS_FILE
from tests.conftest import MakeCheckpoint

REPO = Path(__file__).resolve().parents[3]
NOBODY = 65534
AS_ROOT = os.geteuid() == 0
_PR_CAPBSET_DROP = 24
_CAP_DAC_OVERRIDE, _CAP_DAC_READ_SEARCH = 1, 2

SCAN = """
import json, logging, sys
from pathlib import Path
import torch
from service.engine.repository import Repository
logging.basicConfig(level=logging.INFO, stream=sys.stderr, format="%(levelname)s %(message)s")
repo = Repository(Path(sys.argv[1]), torch.device("cpu"), torch.float32)
repo.refresh()
repo.refresh()  # a second poll: nothing new is logged
print(json.dumps({"loaded": sorted(repo.models), "index": repo.index()}))
"""


def _drop_dac_capabilities() -> None:
    """In the child before exec: root without the capabilities that bypass file modes."""
    libc = ctypes.CDLL(None, use_errno=True)
    for cap in (_CAP_DAC_OVERRIDE, _CAP_DAC_READ_SEARCH):
        if libc.prctl(_PR_CAPBSET_DROP, cap, 0, 0, 0) != 0:
            raise OSError(ctypes.get_errno(), "prctl(PR_CAPBSET_DROP)")


def _make_unreadable(path: Path, mode: int) -> None:
    if AS_ROOT:
        os.chown(path, NOBODY, NOBODY)
        os.chmod(path, mode)
    else:
        os.chmod(path, 0)


def _scan(repo: Path) -> tuple[dict[str, object], str]:
    env = {**os.environ, "PYTHONDONTWRITEBYTECODE": "1"}
    proc = subprocess.run([sys.executable, "-c", SCAN, str(repo)], cwd=REPO, env=env,
                          capture_output=True, text=True, timeout=120,
                          preexec_fn=_drop_dac_capabilities if AS_ROOT else None)
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout), proc.stderr


def test_unreadable_file_and_directory_are_refused_plainly(
        tmp_path: Path, make_checkpoint: MakeCheckpoint) -> None:
    repo = tmp_path / "models"
    make_checkpoint(repo, "ok")
    bad = make_checkpoint(repo, "badfile")
    make_checkpoint(repo, "baddir")
    _make_unreadable(bad / EMBEDDINGS_FILE, 0o600)  # what the old writer left
    _make_unreadable(repo / "baddir", 0o700)
    try:
        out, err = _scan(repo)
    finally:
        os.chmod(repo / "baddir", 0o755)
    uid, gid = os.getuid(), os.getgid()
    owner = (f"uid {NOBODY} gid {NOBODY}, mode 0600" if AS_ROOT
             else f"uid {uid} gid {gid}, mode 0000")
    assert out["loaded"] == ["ok"]
    assert "Traceback" not in err
    refused = [ln for ln in err.splitlines() if ln.startswith("ERROR refused model=badfile")]
    assert len(refused) == 1, err  # logged once, not at every poll
    line = refused[0]
    assert f"permission denied reading {bad / EMBEDDINGS_FILE} as uid {uid} gid {gid}" in line
    assert f"owned by {owner}" in line
    assert f"chmod -R a+rX {bad}" in line
    assert "fsGroup" in line
    assert "docs/deploy.md" in line
    assert "[Errno 13]" not in line
    scans = [ln for ln in err.splitlines() if ln.startswith("ERROR cannot scan")]
    assert len(scans) == 1, err
    assert f"permission denied reading {repo / 'baddir'} as uid {uid}" in scans[0]
    index = {(m, v): (state, reason) for m, v, state, reason in out["index"]}  # type: ignore[union-attr]
    assert index[("ok", 1)] == ("READY", "")
    state, reason = index[("badfile", 1)]
    assert state == "UNAVAILABLE"
    assert reason.startswith("permission denied reading")

"""The skip guard in tests/conftest.py, run on tiny test files in a pytest subprocess."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from tests.conftest import GPU_SKIP_REASON, SkipGuard

REPO = Path(__file__).resolve().parents[1]
# Without a CUDA device the gpu marker skips test_needs_gpu; with one, it runs and passes.
MARKER_SKIPS = 0 if torch.cuda.is_available() else 1

GPU_ONLY = f'''
import pytest

def test_passes():
    assert True

@pytest.mark.gpu
def test_needs_gpu():
    import torch
    assert torch.cuda.is_available()

def test_skips_itself_for_want_of_a_gpu():
    pytest.skip({GPU_SKIP_REASON!r})
'''

OTHER_SKIPS = '''
import pytest

@pytest.fixture
def tool():
    pytest.skip("tool not installed")

def test_passes():
    assert True

@pytest.mark.skipif(True, reason="not on this machine")
def test_skipif():
    pass

def test_skip_in_fixture(tool):
    pass

@pytest.mark.xfail(reason="known bug", strict=True)
def test_xfail():
    assert False
'''

MODULE_SKIP = '''
import pytest

no_such = pytest.importorskip("no_such_module_for_the_skip_guard")

def test_never_collected():
    pass
'''


def run_pytest(tmp_path: Path, files: dict[str, str]) -> subprocess.CompletedProcess[str]:
    """pytest in ``tmp_path`` on ``files``, with tests/conftest.py loaded as a plugin."""
    for name, text in files.items():
        (tmp_path / name).write_text(text)
    (tmp_path / "pytest.ini").write_text("[pytest]\n")  # no rootdir search above tmp_path
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    return subprocess.run(
        [sys.executable, "-m", "pytest", "-p", "tests.conftest", "-p", "no:cacheprovider",
         "-rs", *files], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120)


def test_other_skips_fail_the_run_and_are_named(tmp_path: Path) -> None:
    proc = run_pytest(tmp_path, {"test_other.py": OTHER_SKIPS, "test_module.py": MODULE_SKIP,
                                 "test_gpu.py": GPU_ONLY})
    out = proc.stdout
    assert proc.returncode == pytest.ExitCode.TESTS_FAILED, out + proc.stderr
    lines = out.splitlines()
    title = next(i for i, line in enumerate(lines) if SkipGuard.TITLE in line)
    assert lines[title + 1:lines.index(SkipGuard.HINT)] == [
        "test_module.py: could not import 'no_such_module_for_the_skip_guard': "
        "No module named 'no_such_module_for_the_skip_guard'",
        "test_other.py::test_skipif: not on this machine",
        "test_other.py::test_skip_in_fixture: tool not installed",
    ]
    # Nothing failed: the guard alone made the exit code 1.
    passed, skipped = 3 - MARKER_SKIPS, 4 + MARKER_SKIPS
    assert f" {passed} passed, {skipped} skipped, 1 xfailed in " in lines[-1], out


def test_gpu_skips_alone_pass(tmp_path: Path) -> None:
    proc = run_pytest(tmp_path, {"test_gpu.py": GPU_ONLY})
    out = proc.stdout
    assert proc.returncode == pytest.ExitCode.OK, out + proc.stderr
    assert SkipGuard.TITLE not in out
    skipped = 1 + MARKER_SKIPS  # the explicit one, and the marker's
    assert f" {3 - skipped} passed, {skipped} skipped in " in out.splitlines()[-1], out
    reasons = [line.split(": ", 1)[1] for line in out.splitlines() if line.startswith("SKIPPED")]
    assert reasons == [GPU_SKIP_REASON] * skipped, out


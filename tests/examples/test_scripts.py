"""Every example runs as a plain script: ``python examples/<name>.py --help``."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

REPO_ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize("name", ["hf_inputs_embeds", "downstream_service",
                                  "vllm_prompt_embeds"])
def test_help(name: str, tmp_path: Path) -> None:
    # From another directory: the script must not rely on the repo root being the cwd.
    r = subprocess.run([sys.executable, str(REPO_ROOT / "examples" / f"{name}.py"), "--help"],
                       cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    assert r.stdout.startswith(f"usage: python examples/{name}.py")

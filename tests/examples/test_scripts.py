"""Every example runs as a plain script: ``python examples/<name>.py --help``."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

REPO_ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize("name", ["hf_inputs_embeds", "downstream_service",
                                  "vllm_prompt_embeds", "cuda_inputs_embeds"])
def test_help(name: str, tmp_path: Path) -> None:
    # From another directory: the script must not rely on the repo root being the cwd.
    r = subprocess.run([sys.executable, str(REPO_ROOT / "examples" / f"{name}.py"), "--help"],
                       cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    assert r.stdout.startswith(f"usage: python examples/{name}.py")


@pytest.mark.parametrize("name", ["hf_inputs_embeds", "vllm_prompt_embeds",
                                  "cuda_inputs_embeds"])
def test_without_transformers_says_how_to_install_it(name: str, tmp_path: Path) -> None:
    # The environment `make run` makes has no transformers: one line saying so, not a
    # ModuleNotFoundError traceback.
    hide = ("import runpy, sys; sys.modules['transformers'] = None; "
            f"sys.argv = ['{name}.py']; "
            f"runpy.run_path({str(REPO_ROOT / 'examples' / f'{name}.py')!r}, "
            "run_name='__main__')")
    r = subprocess.run([sys.executable, "-c", hide], cwd=tmp_path, capture_output=True,
                       text=True, timeout=120)
    assert r.returncode == 2
    assert r.stderr == (f"python examples/{name}.py: needs transformers, which `make setup` "
                        "installs; in the `make run` environment: .venv/bin/pip install "
                        "transformers==5.24.0\n")


def test_the_install_line_names_the_pinned_transformers() -> None:
    assert "transformers==5.24.0\n" in (REPO_ROOT / "requirements-dev.txt").read_text()

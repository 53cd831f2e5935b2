"""examples/cuda_inputs_embeds.py: rows written into this process's GPU memory by a GPU
server are HF GPT-2's inputs_embeds in place, with input_ids' logits (gpu-marked); without
a CUDA device it says so and exits 2."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from examples.cuda_inputs_embeds import main

REPO_ROOT = Path(__file__).resolve().parents[2]
IDS = [20560, 11525, 67, 654, 389, 644, 262, 717, 2512, 9743, 13]  # GPT-2 BPE of the default


def test_without_a_cuda_device_says_so(tmp_path: Path) -> None:
    # CUDA_VISIBLE_DEVICES="" hides any GPU: the same answer on a machine with one
    r = subprocess.run([sys.executable, str(REPO_ROOT / "examples" / "cuda_inputs_embeds.py")],
                       cwd=tmp_path, capture_output=True, text=True, timeout=120,
                       env={**os.environ, "CUDA_VISIBLE_DEVICES": ""})
    assert (r.returncode, r.stdout) == (2, "")
    assert r.stderr == ("python examples/cuda_inputs_embeds.py: needs a CUDA device (torch "
                        "sees none here): the rows go to GPU memory; "
                        "examples/hf_inputs_embeds.py is the same on CPU\n")


@pytest.mark.parametrize(("args", "line"), [
    (["--seed", "x"], "argument --seed: must be an integer in [0, 4294967295], got 'x'"),
    (["--start-position", "-5"],
     "argument --start-position: must be a position in [0, 4294967295], got '-5'"),
    (["--target", "localhost"], "argument --target: must be host:port (port 1..65535), "
     "[IPv6]:port, dns:///host:port or unix:PATH, got 'localhost'")])
def test_a_bad_option_is_refused_before_the_cuda_check(tmp_path: Path, args: list[str],
                                                      line: str) -> None:
    """One line naming the option (no usage block), before it looks for a GPU."""
    r = subprocess.run([sys.executable, str(REPO_ROOT / "examples" / "cuda_inputs_embeds.py"),
                        *args], cwd=tmp_path, capture_output=True, text=True, timeout=120,
                       env={**os.environ, "CUDA_VISIBLE_DEVICES": ""})
    assert (r.returncode, r.stdout) == (2, "")
    assert r.stderr == f"python examples/cuda_inputs_embeds.py: error: {line} (see --help)\n"


@pytest.mark.gpu
def test_rows_in_gpu_memory_give_the_same_logits(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--start-position", "5"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines == [
        f"token_ids {IDS}  inputs_embeds ({len(IDS)}, 32) float32 on cuda:0, in the CUDA "
        "region (no copy)",
        "rows equal wte[input_ids]: bit-identical",
        f"logits from input_ids vs inputs_embeds: bit-identical (1, {len(IDS)}, 50257)"]

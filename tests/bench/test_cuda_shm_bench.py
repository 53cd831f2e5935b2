"""bench.suites.cuda_shm: its command line on CPU (help, the refusal without a device) and a small
run on a GPU (gpu-marked; scripts/gpu.sh runs the full-size one)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from bench.suites.cuda_shm import main

ROOT = Path(__file__).resolve().parents[2]


def run(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "bench.suites.cuda_shm", *args], cwd=ROOT,
                          capture_output=True, text=True, timeout=120, check=False,
                          env={**os.environ, **(env or {})})


def test_help_and_refusal_without_a_device() -> None:
    helped = run("--help")
    assert (helped.returncode, helped.stdout.splitlines()[0]) == (
        0, "usage: python -m bench.suites.cuda_shm [-h] [--seconds SECONDS]")
    refused = run(env={"CUDA_VISIBLE_DEVICES": ""})
    assert (refused.returncode, refused.stdout, refused.stderr) == (
        2, "", "python -m bench.suites.cuda_shm: needs a CUDA device (torch sees none here)\n")


@pytest.mark.gpu
def test_small_run_on_the_gpu(tmp_path: Path) -> None:
    out = tmp_path / "cuda_shm.json"
    assert main(["--tokens", "64", "--batch", "2", "--concurrency", "2", "--seconds", "0.3",
                 "--reps", "3", "--out", str(out)]) == 0
    r = json.loads(out.read_text())
    assert r["exact"] is True
    assert (r["T"], r["C"], r["batch"], r["concurrency"]) == (64, 768, 2, 2)
    for key in ("host", "cuda"):
        assert r[key]["req_per_s"] > 0
    for key in ("batch_host", "batch_cuda", "write_rows"):
        assert r[key]["vs_copy"] > 0

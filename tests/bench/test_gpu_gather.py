"""The device check scripts/gpu.sh runs (bench.suites.gpu_gather) times every stage and
checks the engine's answers, here on CPU at a small scale."""

from __future__ import annotations

import json
from pathlib import Path

from bench.suites import gpu_gather


def test_gpu_gather_times_every_stage_and_checks_the_answers(tmp_path: Path) -> None:
    out = tmp_path / "gather.json"
    assert gpu_gather.main(["--device", "cpu", "--reps", "2", "--scale", "64",
                            "--cases", "1x64", "3x64", "--out", str(out)]) == 0
    report = json.loads(out.read_text())
    assert report["device"] == "cpu"
    rows = report["results"]
    assert [(r["table"], r["batch"], r["dtype"]) for r in rows] == [
        ("gpt2", 1, "torch.float32"), ("gpt2", 3, "torch.float32"),
        ("llama3", 1, "torch.bfloat16"), ("llama3", 3, "torch.bfloat16")]
    for r in rows:
        assert r["exact"] is True  # the engine's answer equals gather + fp32 add + cast
        assert r["answer_bytes"] == r["batch"] * 64 * r["C"] * (4 if r["table"] == "gpt2" else 2)
        assert r["copy"]["vs_copy"] == 1.0
        for stage in ("gather", "device", "d2h", "embed_into"):  # (GB/s is rounded to 0.1:
            assert r[stage]["median_us"] > 0  # a slow stage on a loaded machine reads 0.0)

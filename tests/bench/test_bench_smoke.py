"""Smoke test of `python -m bench`: every path (ceiling, naive, service; unary and stream)
runs once with tiny sizes, and the JSON, the PNG and the printed table come out whole."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_quick_bench_runs_every_path(tmp_path: Path) -> None:
    out = tmp_path / "results"
    proc = subprocess.run([sys.executable, "-m", "bench", "--quick", "--out", str(out)],
                          cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    report = json.loads((out / "bench.json").read_text())
    assert set(report) == {"meta", "cells", "comparisons", "targets"}
    assert report["meta"]["quick"] is True
    assert report["meta"]["reps"] == 1
    assert report["meta"]["glibc_tunables"].startswith("glibc.malloc.mmap_threshold=")

    keys = {c["key"] for c in report["cells"]}
    grid = [(m, d, c) for m in ("unary", "stream") for d in ("float32", "bfloat16")
            for c in (1, 2)]
    expected = ({f"ceiling/{m}/T4/{d}/c{c}" for m, d, c in grid}
                | {f"service/{m}/T4/{d}/c{c}" for m, d, c in grid}
                | {"naive/unary/T4/float32/c1", "naive/unary/T4/float32/c2"})
    assert keys == expected
    for cell in report["cells"]:
        assert cell["C"] == 8
        assert len(cell["reps"]) == 1
        assert cell["payload_bytes"] == 4 * 8 * (2 if cell["dtype"] == "bfloat16" else 4)
        m = cell["median"]
        assert m["req_s"] > 0
        assert m["tokens_s"] == 4 * m["req_s"]
        assert 0 < m["p50_ms"] <= m["p99_ms"]

    assert len(report["comparisons"]) == 8
    for comp in report["comparisons"]:
        assert comp["service_over_ceiling"] > 0
        assert comp["service_over_naive"] > 0
    names = [t["name"] for t in report["targets"]]
    assert names == [
        "T=4 fp32 c=2 unary: service/ceiling throughput",
        "T=4 fp32 c=2 unary: service/naive throughput",
        "T=4 fp32 c=1 unary: service p50 / ceiling p50",
        "T=4 fp32 c=1: EmbedStream / unary throughput",
        "T=4 fp32 c=2: EmbedStream / unary throughput",
        "T=4 c=2 unary: bf16 / fp32 tokens/s",
    ]
    assert all(isinstance(t["met"], bool) for t in report["targets"])

    assert (out / "bench.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert "svc/ceil" in proc.stdout
    assert proc.stdout.count("MET") == 6  # every target line carries a verdict
    assert (out / "logs" / "service.log").is_file()

"""Smoke test of `python -m bench`: every path (ceiling, naive, service; unary, stream, OIP
and shared memory) runs once with tiny sizes, and the JSON, the PNG and the printed table
come out whole."""

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
                | {"naive/unary/T4/float32/c1", "naive/unary/T4/float32/c2"}
                | {f"service/{m}/T4/{d}/c{c}" for m in ("oip", "shm")
                   for d in ("float32", "bfloat16") for c in (1, 2)})
    assert keys == expected
    for cell in report["cells"]:
        assert cell["C"] == 8
        assert len(cell["reps"]) == 1
        assert cell["payload_bytes"] == 4 * 8 * (2 if cell["dtype"] == "bfloat16" else 4)
        m = cell["median"]
        assert m["req_s"] > 0
        assert m["tokens_s"] == 4 * m["req_s"]
        assert 0 < m["p50_ms"] <= m["p99_ms"]

    assert len(report["comparisons"]) == 16
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
        "T=4 fp32 c=2: OIP ModelInfer / native unary throughput",
        "T=4 fp32 c=2: shm tokens/s / gRPC ceiling tokens/s",
        "T=4 c=2 shm: bf16 / fp32 tokens/s",
    ]
    assert all(isinstance(t["met"], bool) for t in report["targets"])

    assert (out / "bench.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert "svc/ceil" in proc.stdout
    assert proc.stdout.count("MET") == 9  # every target line carries a verdict
    assert (out / "logs" / "service.log").is_file()


def test_scaling_rounds_return_every_row(server) -> None:  # type: ignore[no-untyped-def]
    """The packed, unary and stream rounds of bench.scaling each deliver 64 x T rows."""
    import asyncio

    import grpc

    from bench import scaling

    async def rounds() -> list[int]:
        async with grpc.aio.insecure_channel(server.target) as channel:
            seqs = [[i, i + 1, i + 2] for i in range(64)]
            return [await how(channel, seqs, "tiny") for how in (
                scaling.packed_round, scaling.unary_round, scaling.stream_round)]

    assert asyncio.run(rounds()) == [192, 192, 192]

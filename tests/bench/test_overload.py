"""Smoke test of `python -m bench.overload`: a server driven past its queue budget refuses
with RESOURCE_EXHAUSTED (and nothing else), and the JSON and the table come out whole."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_overload_refuses_past_the_queue_budget(tmp_path: Path) -> None:
    out = tmp_path / "results"
    proc = subprocess.run(
        [sys.executable, "-m", "bench.overload", "--seconds", "1", "--warmup", "0.2",
         "--concurrency", "2,16", "--dim", "16", "--out", str(out), "--model-cache",
         str(tmp_path / "model"),
         # At C=16 a lookup takes microseconds: on an idle machine the queue would never
         # hold two requests. A batch delay keeps each one queued for 50 ms, so 16 in
         # flight must overflow the 1024-token budget whatever the machine's speed.
         "--server-arg=--max-batch-delay-us=50000", "--slow-readers", "2",
         "--slow-tokens", "64", "--rest-slow-readers", "2"],
        cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    report = json.loads((out / "overload.json").read_text())
    assert set(report) == {"config", "baseline", "overload", "target", "slow_reader",
                           "rest_slow_reader"}
    rest = report["rest_slow_reader"]
    assert rest["clients"] == 2
    assert rest["slow_other"] == 0  # a slow reader is answered or refused with 429, never 500
    assert rest["rss_peak_mib"] >= rest["rss_before_mib"] > 0
    assert rest["normal_requests"] > 0
    assert "REST slow readers: 2 clients" in proc.stdout
    slow = report["slow_reader"]
    assert slow["streams"] == 2
    assert slow["rss_peak_mib"] >= slow["rss_before_mib"] > 0
    assert slow["normal_requests"] > 0
    assert set(slow["normal_other_codes"]) <= {"RESOURCE_EXHAUSTED"}  # the small queue
    assert "slow readers: 2 streams" in proc.stdout
    assert report["config"]["max_queue_tokens"] == 1024
    assert report["config"]["T"] == 512
    base = report["baseline"]
    assert base["concurrency"] == 1
    assert base["rejected"] == 0  # one request of 512 tokens always fits in 1024
    assert base["accepted"] > 0
    assert [o["concurrency"] for o in report["overload"]] == [2, 16]
    heavy = report["overload"][1]
    assert heavy["rejected"] > 0  # 16 x 512 tokens in flight against a budget of 1024
    assert heavy["accepted"] > 0
    assert heavy["rejected_p50_ms"] <= heavy["rejected_p99_ms"]
    for o in report["overload"]:
        assert o["other_codes"] == {}
        assert o["requests"] == o["accepted"] + o["rejected"]
        assert isinstance(o["rejection_target_met"], bool)
    rows = [line for line in proc.stdout.splitlines() if line.startswith("  1024   512")]
    assert len(rows) == 2
    assert all(row.endswith("MET") for row in rows)
    assert all(o["floor_p99_ms"] > 0 for o in report["overload"])

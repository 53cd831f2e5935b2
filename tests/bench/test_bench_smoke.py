"""``python -m bench --quick`` (make bench-smoke): every suite and every path of each runs
once at tiny sizes against real servers, and the JSON, the PNG, the tables and the target
block come out whole."""

from __future__ import annotations

import json
import math
import re
import subprocess
import sys
from pathlib import Path

from bench.harness.config import BenchConfig, quick
from bench.suites.profile import ORDER
from bench.suites.serving import cells

ROOT = Path(__file__).resolve().parents[2]
TARGETS = [
    "T=4 fp32 c=2 unary: service / gRPC ceiling throughput",  # T=big (>= 0.8)
    "T=4 fp32 c=2 unary: service / naive throughput",
    "T=4 fp32 c=2 unary: service / gRPC ceiling throughput",  # T=small (>= 0.85)
    "T=4 fp32 c=2 unary: service / gRPC lookup floor throughput",
    "T=4 fp32 c=1 unary: service p50 / gRPC ceiling p50",
    "T=4 fp32 c=1 unary: service p50 / gRPC lookup floor p50",
    "T=4 fp32 c=1: stream/unary throughput, service / gRPC ceiling",
    "T=4 fp32 c=2: stream/unary throughput, service / gRPC ceiling",
    "T=4 c=2 unary: bf16 / fp32 throughput",
    "T=4 fp32 c=2: OIP ModelInfer / native unary throughput",
    "T=4 fp32 c=2: shm / gRPC ceiling throughput",
    "T=4 c=2 shm: bf16/fp32 throughput, service / lookup floor",
    "REST binary T=4 fp32 c=1: service / lookup floor throughput",
    "REST binary T=4 fp32 c=2: service / lookup floor throughput",  # T=small (>= 0.8)
    "REST binary T=4 fp32 c=2: service / lookup floor throughput",  # T=big (>= 0.9)
    "REST JSON T=4 fp32 c=2: service / REST ceiling throughput",
    "REST JSON T=4 fp32 c=2: service / JSON lookup floor throughput",
    "64 x T=16: EmbedBatch / unary throughput",
    "overload c=4: refusal p99 ms",
    "overload c=16: refusal p99 ms",
    "gpt2: start-up s (load, verify, SERVING)",
    "gpt2: RSS MiB after traffic",
    "llama3: start-up s (load, verify, SERVING)",
    "llama3: RSS MiB after traffic",
]


def test_quick_bench_runs_every_path_of_every_suite(tmp_path: Path) -> None:
    out = tmp_path / "results"
    proc = subprocess.run([sys.executable, "-m", "bench", "--quick", "--out", str(out)],
                          cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    report = json.loads((out / "bench.json").read_text())
    assert list(report) == ["meta", "serving", "scaling", "overload", "memory", "profile"]
    meta = report["meta"]
    assert (meta["quick"], meta["reps"]) == (True, 1)
    assert meta["glibc_tunables"].startswith("glibc.malloc.mmap_threshold=")

    serving = report["serving"]
    want = {c.key for c in cells(quick(BenchConfig()))}
    assert {c["key"] for c in serving["cells"]} == want
    # Per c: fp32 unary 4, stream 3, oip 1, shm 2, rest 3, json 3; bf16 the same less naive
    # and JSON.
    assert len(want) == 2 * (16 + 12)
    for cell in serving["cells"]:
        m = cell["median"]
        assert m["req_s"] > 0, cell["key"]
        assert m["tokens_s"] == 4 * m["req_s"]
        assert 0 < m["p50_ms"] <= m["p99_ms"]
        assert m["cpu_us"] >= 0  # /proc counts in clock ticks: a short window may read 0
        refs = [cell.get(f"over_{r}") for r in ("ceiling", "floor", "naive")]
        if cell["backend"] == "service":
            assert refs[0] is not None, cell["key"]
            assert refs[0] > 0, cell["key"]
        else:
            assert refs == [None, None, None]
    assert (out / "serving.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert {p.name for p in (out / "logs").iterdir()} >= {
        "ceiling.log", "floor.log", "naive.log", "service.log"}

    scaling = report["scaling"]
    assert all(v > 0 for v in scaling["packed_tokens_s"].values())
    assert set(scaling["workers_tokens_s"]) == {"w1/T4", "w2/T4"}

    overload = report["overload"]
    assert overload["baseline"]["rejected"] == 0  # one request of 512 tokens fits in 1024
    heavy = overload["overload"][-1]
    assert heavy["concurrency"] == 16
    assert heavy["rejected"] > 0  # 16 x 512 tokens against 1024
    assert heavy["accepted"] > 0
    for phase in overload["overload"]:
        assert phase["other_codes"] == {}
        assert phase["requests"] == phase["accepted"] + phase["rejected"]
        assert phase["floor_p99_ms"] > 0

    for table in ("gpt2", "llama3"):
        memory = report["memory"][table]
        assert memory["one_worker"][0]["startup_s"] >= 0
        assert memory["one_worker"][0]["rss_mb"] > 0
        assert len(memory["two_workers"]["worker_pss_mb"]) == 2

    profile = report["profile"]
    assert [(r["mode"], r["c"]) for r in profile["cells"]] == [
        (m, c) for m in ("unary", "oip", "rest", "json") for c in (1, 2)]
    for row in profile["cells"]:
        assert sum(row["samples"].values()) > 0, row["key"]  # py-spy saw the server work
        assert list(row["us"]) == ORDER
    # whole requests in-process, each answered with the same bytes (in_context checks it)
    context = profile["in_context"]
    assert 0 < context["floor_us"] < min(context["service_us"], context["service_metrics_us"])
    assert "A REST binary T=" in proc.stdout

    targets = [t for suite in ("serving", "scaling", "overload", "memory")
               for t in report[suite]["targets"]]
    assert [t["name"] for t in targets] == TARGETS
    for t in targets:
        assert t["met"] == (not math.isnan(t["value"]) and (
            t["value"] >= t["bound"] if t["op"] == ">=" else t["value"] <= t["bound"]))
    lines = [ln for ln in proc.stdout.splitlines() if re.match(r"  \[(MET    |NOT MET)\] ", ln)]
    assert [ln.split("] ", 1)[1].rsplit(" = ", 1)[0] for ln in lines] == TARGETS
    assert f"of {len(TARGETS)} met" in proc.stdout
    for header in ("serving (", "scaling (", "overload (", "memory ("):
        assert header in proc.stdout

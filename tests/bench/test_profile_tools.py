"""bench.cpu_profile's in-process stages, bench.worker_memory's, bench.gpu_gather's and
bench.grpc_floors' measurements run and report every figure they promise."""

from __future__ import annotations

import json
from pathlib import Path

from bench import cpu_profile, gpu_gather, grpc_floors, worker_memory


def test_cpu_profile_times_every_stage_of_every_cell(tmp_path: Path) -> None:
    out = tmp_path / "profile.json"
    cpu_profile.main(["--skip-server", "--calls", "3", "--model-cache", str(tmp_path / "m"),
                      "--out", str(out)])
    stages = json.loads(out.read_text())["stages_us"]
    assert set(stages) == {"T=16 float32", "T=16 bfloat16", "T=1024 float32",
                           "T=1024 bfloat16"}
    for cell, figures in stages.items():
        for name in ("decode", "admission", "plan", "allocate + finish", "lookup",
                     "op: gather fp32 (T, C)", "op: add positions fp32",
                     "op: one pass (copy the answer)", "shm: lookup into the mapping",
                     "shm: lookup into private + pwrite", "handler: shm", "handler: unary"):
            assert figures[name] > 0, (cell, name)
        assert ("op: cast fp32 -> wire dtype" in figures) == ("bfloat16" in cell)


def test_worker_memory_measures_an_empty_repository(tmp_path: Path) -> None:
    result = worker_memory.measure(tmp_path, 1, timeout_s=120)
    assert result["workers"] == 1
    assert len(result["pss_mb"]) == 1
    assert 50 < result["total_pss_mb"] < 2000  # a Python + torch runtime, no table
    assert result["startup_s"] > 0


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
        for stage in ("gather", "device", "d2h", "embed_into"):
            assert r[stage]["median_us"] > 0
            assert r[stage]["GB_per_s"] > 0


def test_grpc_floors_measure_every_server_against_the_ceiling(tmp_path: Path) -> None:
    """Four real servers (the ceiling, the service's two floors, the service) answer the
    same requests; a floor server answers with the service's own rows."""
    grpc_floors.main(["--requests", "30", "--rounds", "2", "--model-cache",
                      str(tmp_path / "m"), "--out", str(tmp_path)])
    report = json.loads((tmp_path / "grpc_floors.json").read_text())
    assert (report["T"], report["C"], report["requests"], report["rounds"]) == (16, 768, 30, 2)
    rows = {r["server"]: r for r in report["rows"]}
    assert list(rows) == ["ceiling", "frame", "lookup", "service"]
    assert rows["ceiling"]["ratio"] == 1.0
    for row in rows.values():
        assert len(row["rounds_p50_us"]) == 2
        assert all(p50 > 0 for p50 in row["rounds_p50_us"])
    assert (tmp_path / "grpc_floors.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"

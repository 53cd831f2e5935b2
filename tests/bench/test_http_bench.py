"""`python -m bench.http`: the service, the lookup floor and the ceiling all answer one
cell, the floor's bodies are the service's byte for byte, and a floor whose lookup does
not reproduce the service's response refuses to serve."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from bench.http import Cell, write_model

ROOT = Path(__file__).resolve().parents[2]


def test_one_binary_and_one_json_cell_measure_every_side(tmp_path: Path) -> None:
    out = tmp_path / "results"
    proc = subprocess.run(
        [sys.executable, "-m", "bench.http", "--only", "T16-FP32-c1-", "--rounds", "1",
         "--seconds", "0.2", "--out", str(out)],
        cwd=ROOT, capture_output=True, text=True, timeout=180)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    rows = {r["output"]: r for r in json.loads((out / "http.json").read_text())["rows"]}
    assert set(rows) == {"binary", "json"}
    binary, as_json = rows["binary"], rows["json"]
    assert (binary["T"], binary["datatype"], binary["c"]) == (16, "FP32", 1)
    for key in ("rps", "floor_rps", "ceiling_rps", "ratio", "floor_ratio"):
        assert binary[key] > 0, key
    assert len(binary["rounds_floor_rps"]) == 1
    assert as_json["floor_ratio"] is None  # the floor serves binary bodies only
    assert "floor_rps" not in as_json
    assert "T16-FP32-c1-binary:" in proc.stdout
    assert ", floor " in proc.stdout


def test_floor_refuses_to_serve_a_lookup_that_differs(tmp_path: Path) -> None:
    write_model(tmp_path / "models")
    responses = tmp_path / "responses"
    responses.mkdir()
    cell = Cell(16, "FP32", 1, "binary")
    head = b'{"outputs":[]}'
    (responses / f"{cell.name}.bin").write_bytes(head + bytes(16 * 768 * 4))  # zeros
    (responses / f"{cell.name}.json").write_text(json.dumps(
        {"Content-Type": "application/octet-stream",
         "Inference-Header-Content-Length": str(len(head))}))
    proc = subprocess.run(
        [sys.executable, "-m", "bench.http_servers", "floor", "0", str(responses),
         str(tmp_path / "models")], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert proc.returncode != 0
    assert f"floor: /{cell.name} differs from the service's response" in proc.stderr


def test_floor_variants_each_answer_against_the_ceiling(tmp_path: Path) -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "bench.http_floors", "--T", "16", "--c", "1", "--rounds", "1",
         "--seconds", "0.2", "--out", str(tmp_path)],
        cwd=ROOT, capture_output=True, text=True, timeout=180)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    report = json.loads((tmp_path / "http_floors.json").read_text())
    assert (report["T"], report["c"], report["C"], report["rounds"]) == (16, 1, 768, 1)
    rows = {r["variant"]: r for r in report["rows"]}
    assert list(rows) == ["ceiling", "fresh", "fresh-thread", "pool", "pool-thread",
                          "fresh-huge"]
    assert rows["ceiling"]["ratio"] == 1.0
    for row in rows.values():
        assert row["rps"] > 0
        assert row["cpu_ms"] > 0
        assert len(row["rounds_rps"]) == 1

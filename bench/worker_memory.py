"""What ``--workers N`` costs in memory now that the workers share one table.

    .venv/bin/python -m bench.worker_memory [--tables gpt2,llama3] [--workers 1,2,4]

For each table size (``bench.big_table``'s GPT-2 fp32 154 MB and Llama-3 bf16 1 GB) and
each N: ``python -m service --workers N`` on a fresh port, the time until every worker
logs "serving", then the PSS (``/proc/<pid>/smaps_rollup``) of every process of the
server (the supervisor and its workers; N=1 is one process, reading the table privately)
and their sum. Beside them, one worker serving an empty repository: the runtime a worker
costs without any table. Each extra worker should add about that runtime and (its share
of) nothing more of the table.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from bench.big_table import _write
from bench.servers import child_env, free_port

__all__ = ["main", "measure"]

ROOT = Path(__file__).resolve().parent.parent


def _pss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/smaps_rollup").read_text().splitlines():
        if line.startswith("Pss:"):
            return int(line.split()[1]) / 1024
    return 0.0


def _tree(pid: int) -> list[int]:
    """``pid`` and its server children (spawned workers; not the resource tracker)."""
    out = [pid]
    for child in Path(f"/proc/{pid}/task/{pid}/children").read_text().split():
        try:
            if b"spawn_main" in Path(f"/proc/{child}/cmdline").read_bytes():
                out.append(int(child))
        except OSError:
            continue
    return out


def measure(repo: Path, workers: int, timeout_s: float = 300) -> dict[str, Any]:
    """Start-up seconds and PSS (MB) per process of one ``--workers`` server."""
    port = free_port()
    t0 = time.monotonic()
    proc = subprocess.Popen(
        [sys.executable, "-m", "service", "--model-repository", str(repo), "--grpc-port",
         str(port), "--http-port", "-1", "--metrics-port", "-1", "--poll-seconds", "0",
         "--workers", str(workers), "--host", "127.0.0.1"],
        cwd=ROOT, env=child_env(), stderr=subprocess.PIPE, text=True)
    try:
        serving = 0
        assert proc.stderr is not None
        for line in proc.stderr:
            if " serving " in line:
                serving += 1
            if serving >= workers:
                break
            if time.monotonic() - t0 > timeout_s:
                raise TimeoutError(f"--workers {workers}: not serving in {timeout_s}s")
        startup = time.monotonic() - t0
        time.sleep(1.0)
        pids = _tree(proc.pid)
        pss = [round(_pss_mb(p), 1) for p in pids]
        return {"workers": workers, "startup_s": round(startup, 2), "pss_mb": pss,
                "total_pss_mb": round(sum(pss), 1)}
    finally:
        proc.terminate()
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def main(argv: list[str] | None = None) -> None:
    """Print one line per (table, N) and write bench/results/worker_memory.json."""
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--tables", default="gpt2,llama3")
    p.add_argument("--workers", default="1,2,4")
    p.add_argument("--cache", type=Path, default=ROOT / "bench" / "results" / ".big_tables")
    p.add_argument("--out", type=Path,
                   default=ROOT / "bench" / "results" / "worker_memory.json")
    args = p.parse_args(argv)
    results: dict[str, Any] = {}
    with tempfile.TemporaryDirectory() as empty:
        results["empty"] = measure(Path(empty), 1, 60)
        print(f"empty repository, 1 worker: PSS {results['empty']['total_pss_mb']} MB",
              flush=True)
    for name in args.tables.split(","):
        repo = args.cache / name
        nbytes = _write(repo, name)
        rows = []
        for n in (int(x) for x in args.workers.split(",")):
            r = measure(repo, n)
            rows.append(r)
            print(f"{name} ({nbytes / 1e6:.0f} MB table) --workers {n}: start-up "
                  f"{r['startup_s']} s, total PSS {r['total_pss_mb']} MB, per process "
                  f"{r['pss_mb']}", flush=True)
        results[name] = {"table_mb": round(nbytes / 1e6, 1), "runs": rows}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()

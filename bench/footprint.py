"""Memory, start-up and page faults of the real server, for a GPT-2-size table.

    python -m bench.footprint [--requests 200]

Measures, in one run:
  * start-up: ``EmbeddingServer.start()`` (load + verify sha256 + map + SERVING), imports
    excluded, against the 2 s target;
  * resident memory of one server process after traffic (RSS and PSS) against
    table bytes + 300 MB;
  * ``--workers 2`` on one port: PSS per worker and in all (the page cache is shared);
  * minor page faults per T=1024 fp32 response, with and without scripts/serve.sh's
    GLIBC_TUNABLES (glibc's adaptive mmap threshold returns multi-MB buffers to the OS).
Writes bench/results/footprint.json.
"""

from __future__ import annotations

import argparse
import json
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import grpc
import numpy as np

from bench.model import ensure_model
from bench.servers import GLIBC_TUNABLES, ServerProcess, child_env, free_port, wait_serving
from genproto.embedding.v1 import embedding_pb2 as pb
from genproto.embedding.v1 import embedding_pb2_grpc as pb_grpc

__all__ = ["main"]

ROOT = Path(__file__).resolve().parent.parent
C, MAX_SEQ_LEN, T = 768, 1024, 1024


def _proc_kb(pid: int, key: str, file: str) -> int:
    for line in Path(f"/proc/{pid}/{file}").read_text().splitlines():
        if line.startswith(key + ":"):
            return int(line.split()[1])
    return 0


def _minflt(pid: int) -> int:
    stat = Path(f"/proc/{pid}/stat").read_text()
    return int(stat.rsplit(")", 1)[1].split()[7])  # field 10: minflt


def _launch(repo: Path, port: int, tunables: bool, workers: int = 1) -> ServerProcess:
    env = child_env(GLIBC_TUNABLES if tunables else None)
    argv = [sys.executable, "-m", "service", "--model-repository", str(repo / "models"),
            "--grpc-port", str(port), "--http-port", "-1", "--metrics-port", "-1",
            "--poll-seconds", "0",
            "--workers", str(workers)]
    log = repo / f"service-{port}.log"
    with log.open("wb") as fh:
        proc = subprocess.Popen(argv, cwd=ROOT, env=env, stdout=fh, stderr=subprocess.STDOUT)
    server = ServerProcess("service", f"127.0.0.1:{port}", proc, log)
    wait_serving(server, 60.0)
    return server


def _traffic(target: str, n: int) -> None:
    ids = np.random.default_rng(0).integers(0, 50257, T).tolist()
    request = pb.EmbedRequest(token_ids=pb.TokenIds(ids=ids))
    with grpc.insecure_channel(target, options=[("grpc.max_receive_message_length",
                                                 64 << 20)]) as channel:
        embed = pb_grpc.EmbeddingServiceStub(channel).Embed
        for _ in range(n):
            r = embed(request)
            np.frombuffer(r.embeddings.data, dtype="<f4").reshape(T, C)


def _stop(server: ServerProcess) -> None:
    server.proc.send_signal(signal.SIGTERM)
    server.proc.wait(timeout=30)


def _faults(repo: Path, tunables: bool, n: int) -> dict[str, float]:
    server = _launch(repo, free_port(), tunables)
    pid = server.proc.pid
    try:
        _traffic(server.target, 20)  # warm-up: buffers reach their steady size
        before = _minflt(pid)
        _traffic(server.target, n)
        faults = (_minflt(pid) - before) / n
        return {"minor_faults_per_request": faults,
                "rss_mb": _proc_kb(pid, "VmRSS", "status") / 1024,
                "pss_mb": _proc_kb(pid, "Pss", "smaps_rollup") / 1024}
    finally:
        _stop(server)


def _startup(repo: Path) -> float:
    from service.config import ServerConfig
    from service.local import start_in_thread

    config = ServerConfig(model_repository=repo / "models", grpc_port=0, http_port=-1,
                          metrics_port=-1,
                          poll_seconds=0)
    t0 = time.perf_counter()
    handle = start_in_thread(config)  # returns after load; health is SERVING by then
    seconds = time.perf_counter() - t0
    handle.stop()
    return seconds


def _workers(repo: Path, n: int) -> dict[str, Any]:
    server = _launch(repo, free_port(), True, workers=2)
    pid = server.proc.pid
    try:
        time.sleep(1.0)  # both workers up
        _traffic(server.target, n)
        children = [int(p) for p in Path(f"/proc/{pid}/task/{pid}/children")
                    .read_text().split()]
        # spawn's resource tracker is a child too; servers are the big ones.
        pss = sorted((_proc_kb(c, "Pss", "smaps_rollup") / 1024 for c in children),
                     reverse=True)[:2]
        rss = sorted((_proc_kb(c, "VmRSS", "status") / 1024 for c in children),
                     reverse=True)[:2]
        return {"worker_pss_mb": pss, "worker_rss_mb": rss, "total_pss_mb": sum(pss)}
    finally:
        _stop(server)


def main(argv: list[str] | None = None) -> None:
    """Run every measurement and print a summary."""
    p = argparse.ArgumentParser(prog="python -m bench.footprint", description=__doc__)
    p.add_argument("--requests", type=int, default=200)
    p.add_argument("--out", type=Path, default=ROOT / "bench" / "results")
    args = p.parse_args(argv)
    repo = ensure_model(Path(tempfile.gettempdir()) / "embed-footprint", C, MAX_SEQ_LEN)
    table_mb = (50257 + MAX_SEQ_LEN) * C * 4 / 2**20
    print(f"model: 50257 x {C} fp32 token table + {MAX_SEQ_LEN} x {C} positions "
          f"= {table_mb:.0f} MB", flush=True)
    startup = min(_startup(repo) for _ in range(3))
    print(f"start-up (load+verify+SERVING, imports excluded): {startup:.2f} s "
          f"[target <= 2 s: {'MET' if startup <= 2 else 'NOT MET'}]", flush=True)
    plain = _faults(repo, False, args.requests)
    tuned = _faults(repo, True, args.requests)
    for name, r in (("default malloc", plain), ("GLIBC_TUNABLES", tuned)):
        print(f"{name:>15}: {r['minor_faults_per_request']:8.1f} minor faults/request, "
              f"RSS {r['rss_mb']:.0f} MB, PSS {r['pss_mb']:.0f} MB", flush=True)
    limit = table_mb + 300
    print(f"resident: RSS {tuned['rss_mb']:.0f} MB vs table + 300 MB = {limit:.0f} MB "
          f"[{'MET' if tuned['rss_mb'] <= limit else 'NOT MET'}]", flush=True)
    workers = _workers(repo, 50)
    print(f"--workers 2: PSS per worker {[round(x) for x in workers['worker_pss_mb']]} MB, "
          f"total {workers['total_pss_mb']:.0f} MB (RSS per worker "
          f"{[round(x) for x in workers['worker_rss_mb']]} MB)", flush=True)
    args.out.mkdir(parents=True, exist_ok=True)
    result = {"table_mb": table_mb, "startup_s": startup, "default_malloc": plain,
              "glibc_tunables": tuned, "workers_2": workers}
    (args.out / "footprint.json").write_text(json.dumps(result, indent=2))
    print(f"wrote {args.out / 'footprint.json'}")


if __name__ == "__main__":
    main()

"""``python -m bench``: run the suites, print each one's table, then one target block; write
``<out>/bench.json`` and ``<out>/serving.png``. Re-executes once with the server's malloc
tunables: the load generator decodes multi-MB replies too, and glibc's adaptive mmap
threshold would charge its page faults to the server being measured.
"""

from __future__ import annotations

import json
import os
import platform
import subprocess
import sys
import time
from collections.abc import Sequence
from datetime import UTC, datetime
from typing import Any

from bench.harness.config import BenchConfig, parse_args
from bench.harness.launch import GLIBC_TUNABLES, ROOT
from bench.harness.plot import save_png, serving_figure
from bench.harness.report import SuiteResult, format_targets
from bench.suites import SUITES

__all__ = ["main", "run"]


def _commit() -> str:
    """The measured code: HEAD, with '+dirty' when the working tree differs from it."""
    try:
        def git(*args: str) -> str:
            return subprocess.run(["git", *args], cwd=ROOT, capture_output=True, text=True,
                                  check=True).stdout.strip()

        dirty = git("status", "--porcelain", "--untracked-files=no")
        return git("rev-parse", "--short", "HEAD") + ("+dirty" if dirty else "")
    except (OSError, subprocess.CalledProcessError):
        return "unknown"


def run(cfg: BenchConfig, log: Any = print) -> dict[str, Any]:
    """Every suite of ``cfg`` in turn; the whole report (also written to bench.json)."""
    started, load = time.time(), os.getloadavg()[0]
    cfg.out.mkdir(parents=True, exist_ok=True)
    results: list[SuiteResult] = []
    for name in cfg.suites:
        t0 = time.time()
        results.append(SUITES[name](cfg, log))
        log(f"\n{name} ({time.time() - t0:.0f} s):\n{results[-1].text}\n")
    meta = {"commit": _commit(), "started": datetime.fromtimestamp(started, UTC).isoformat(),
            "seconds": round(time.time() - started, 1), "host": platform.node(),
            "cpus": os.cpu_count(), "python": sys.version.split()[0], "device": cfg.device,
            "reps": cfg.reps, "ids": cfg.ids, "duration_s": cfg.duration_s,
            "warmup_s": cfg.warmup_s, "quick": cfg.quick,
            "glibc_tunables": os.environ.get("GLIBC_TUNABLES", ""),
            # Other work on the machine skews every figure; the 1-minute load says how much.
            "loadavg_before": round(load, 2), "loadavg_after": round(os.getloadavg()[0], 2)}
    report = {"meta": meta, **{r.name: r.json() for r in results}}
    (cfg.out / "bench.json").write_text(json.dumps(report, indent=1))
    if "serving" in report:
        save_png(cfg.out / "serving.png", 110, log, "bench", serving_figure,
                 report["serving"]["cells"])
    log(format_targets([t for r in results for t in r.targets], meta))
    return report


def main(argv: Sequence[str] | None = None) -> None:
    cfg = parse_args(argv)
    run(cfg)
    print(f"\nwrote {cfg.out / 'bench.json'}")


if __name__ == "__main__":
    if "GLIBC_TUNABLES" not in os.environ:
        os.environ["GLIBC_TUNABLES"] = GLIBC_TUNABLES
        os.execv(sys.executable, [sys.executable, "-m", "bench", *sys.argv[1:]])
    main()

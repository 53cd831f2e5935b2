"""``python -m bench.soak``: one soak (bench/soak/run.py says what it does), its report
written (soak.json, soak.png, the server's log) and its summary printed; exit 1 unless
every check passed."""

from __future__ import annotations

import argparse
import asyncio
import json
import shutil
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from bench.harness.launch import stop, wait_serving
from bench.harness.plot import save_png, soak_figure
from bench.soak.report import build_report, format_summary
from bench.soak.run import Soak, drive, final_versions, parse_args

__all__ = ["main", "run_soak"]


def run_soak(args: argparse.Namespace) -> dict[str, Any]:
    """Run one soak; write soak.json and soak.png under ``args.out``; return the report."""
    root = Path(tempfile.mkdtemp(prefix="embed-soak-"))
    run = Soak(args, root)
    try:
        wait_serving(run.server, 120)
        deadline = time.monotonic() + 120
        while run.log_count(" serving ") < args.workers:  # every worker, not just one
            if time.monotonic() > deadline or run.server.proc.poll() is not None:
                raise RuntimeError(f"workers not serving; log:\n{run.server.log.read_text()}")
            time.sleep(0.2)
        print(f"soak: {args.clients} clients x {args.minutes} min against "
              f"{run.server.target} (--workers {args.workers}, repository {root})", flush=True)
        asyncio.run(drive(run))
        final = final_versions(run.server.target)
    finally:
        exit_code = stop([run.server], timeout_s=60)[0]
    report = build_report(run, final, exit_code)
    args.out.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(run.server.log, args.out / "soak-server.log")
    shutil.rmtree(root, ignore_errors=True)  # the repository: tens of MB per version
    (args.out / "soak.json").write_text(json.dumps(report, indent=1))
    save_png(args.out / "soak.png", 100, lambda line: print(line, file=sys.stderr), "soak",
             soak_figure, report)
    return report


def main(argv: Sequence[str] | None = None) -> None:
    """``python -m bench.soak``: run, print the summary, exit 1 unless every check passed."""
    args = parse_args(argv)
    report = run_soak(args)
    print(format_summary(report))
    print(f"wrote {args.out / 'soak.json'} and {args.out / 'soak.png'}")
    raise SystemExit(0 if report["passed"] else 1)


if __name__ == "__main__":
    main()

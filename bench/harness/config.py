"""What one ``python -m bench`` run measures: its suites, the serving grid, durations, rounds."""

from __future__ import annotations

import argparse
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path

from bench.harness.launch import ROOT

__all__ = ["BACKENDS", "DTYPES", "IDS", "MODES", "SUITES", "BenchConfig", "parse_args", "quick"]

SUITES = ("serving", "scaling", "overload", "memory", "profile")
# Every server a serving cell can run against, in the order a point's cells run.
BACKENDS = ("ceiling", "floor", "naive", "service")
# gRPC: unary, stream, OIP ModelInfer, shared-memory output; REST: binary and JSON output.
MODES = ("unary", "stream", "oip", "shm", "rest", "json")
DTYPES = ("float32", "float16", "bfloat16")
IDS = ("uniform", "text")


@dataclass(frozen=True)
class BenchConfig:
    """Everything a run needs; the defaults are ``make bench``'s."""

    suites: tuple[str, ...] = SUITES
    ts: tuple[int, ...] = (16, 128, 1024)
    dtypes: tuple[str, ...] = ("float32", "bfloat16")
    concurrencies: tuple[int, ...] = (1, 16)
    modes: tuple[str, ...] = MODES
    backends: tuple[str, ...] = BACKENDS
    dim: int = 768
    max_seq_len: int = 1024
    reps: int = 3  # interleaved rounds
    duration_s: float = 1.5  # measured per cell and round, after the warm-up
    warmup_s: float = 0.3
    out: Path = ROOT / "bench" / "results"
    model_cache: Path = ROOT / "bench" / "results" / ".model"
    device: str = "cpu"
    # Request ids: "uniform" over the vocabulary (every row equally likely: the table is
    # read from DRAM, the worst case) or "text" (windows of the default corpus's GPT-2
    # tokens: frequent rows stay in cache, as with real traffic).
    ids: str = "uniform"
    extra_server_args: tuple[str, ...] = field(default_factory=tuple)
    quick: bool = False  # tiny sizes: every path once, in seconds (make bench-smoke)

    def __post_init__(self) -> None:
        for name, values, allowed in (("suites", self.suites, SUITES),
                                      ("modes", self.modes, MODES),
                                      ("backends", self.backends, BACKENDS),
                                      ("dtypes", self.dtypes, DTYPES)):
            if not values or not set(values) <= set(allowed):
                raise ValueError(f"--{name}: each of {', '.join(allowed)} (got {values})")
        if self.ids not in IDS:
            raise ValueError(f"--ids: one of {', '.join(IDS)} (got {self.ids!r})")
        if self.reps < 1:
            raise ValueError(f"--reps must be >= 1 (got {self.reps})")
        if max(self.ts) > self.max_seq_len:
            raise ValueError(f"--ts: T {max(self.ts)} > max_seq_len {self.max_seq_len}")


def quick(cfg: BenchConfig) -> BenchConfig:
    """``cfg`` at tiny sizes: every path once, in seconds."""
    return replace(cfg, ts=(4,), concurrencies=(1, 2), dim=8, max_seq_len=16, reps=1,
                   duration_s=0.15, warmup_s=0.05, quick=True)


def _split(kind: type) -> Callable[[str], tuple[object, ...]]:
    return lambda text: tuple(kind(x) for x in text.split(",") if x)


def parse_args(argv: Sequence[str] | None = None) -> BenchConfig:
    """``python -m bench``'s command line; ``--quick`` is ``make bench-smoke``'s grid."""
    p = argparse.ArgumentParser(prog="python -m bench", description=__doc__)
    p.add_argument("--quick", action="store_true", help="tiny sizes, one short round")
    p.add_argument("--suites", type=_split(str), help=f"subset of {','.join(SUITES)}")
    p.add_argument("--ts", type=_split(int), help="serving: T values (default 16,128,1024)")
    p.add_argument("--dtypes", type=_split(str), help="serving: float32,bfloat16,float16")
    p.add_argument("--concurrency", type=_split(int), help="serving: in flight (default 1,16)")
    p.add_argument("--modes", type=_split(str), help=f"serving: subset of {','.join(MODES)}")
    p.add_argument("--backends", type=_split(str), help=f"subset of {','.join(BACKENDS)}")
    p.add_argument("--dim", type=int, help="C of the serving model (default 768)")
    p.add_argument("--reps", type=int, help="interleaved rounds (default 3)")
    p.add_argument("--duration", type=float, help="seconds measured per cell and round")
    p.add_argument("--warmup", type=float, help="warm-up seconds before each measurement")
    p.add_argument("--out", type=Path, help="results folder (default bench/results)")
    p.add_argument("--model-cache", type=Path, help="where the serving checkpoint is kept")
    p.add_argument("--device", help="the service's --device (default cpu)")
    p.add_argument("--ids", choices=IDS, help="uniform over the vocabulary, or text windows")
    p.add_argument("--server-arg", action="append", default=[],
                   help="a flag for the service, e.g. --server-arg=--workers=2 (repeatable)")
    ns = p.parse_args(argv)
    cfg = BenchConfig()
    if ns.quick:
        cfg = quick(cfg)
    given = {"suites": ns.suites, "ts": ns.ts, "dtypes": ns.dtypes,
             "concurrencies": ns.concurrency, "modes": ns.modes, "backends": ns.backends,
             "dim": ns.dim, "reps": ns.reps, "duration_s": ns.duration,
             "warmup_s": ns.warmup, "out": ns.out, "device": ns.device, "ids": ns.ids,
             "extra_server_args": tuple(ns.server_arg) or None,
             "max_seq_len": max(cfg.max_seq_len, *ns.ts) if ns.ts else None,
             "model_cache": ns.model_cache or (ns.out / ".model" if ns.out else None)}
    try:
        return replace(cfg, **{k: v for k, v in given.items() if v is not None})
    except ValueError as e:
        p.error(str(e))

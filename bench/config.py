"""What one benchmark run measures: the grid of cells, durations and repetitions."""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path

__all__ = ["BACKENDS", "DTYPE_BYTES", "IDS", "MODES", "SERVICE_ONLY_MODES", "BenchConfig", "Cell",
           "parse_args"]

# The three servers every cell is run against, in the order they are interleaved.
BACKENDS = ("ceiling", "naive", "service")
MODES = ("unary", "stream", "oip", "shm")
# Modes only the service has: measured against the ceiling's unary cell of the same point.
SERVICE_ONLY_MODES = ("oip", "shm")
IDS = ("uniform", "text")
# Bytes per element on the wire; the naive baseline always sends `repeated float` (4 bytes).
DTYPE_BYTES = {"float32": 4, "float16": 2, "bfloat16": 2}


@dataclass(frozen=True)
class Cell:
    """One measured point: a backend, an RPC mode, T, dtype and requests in flight."""

    backend: str
    mode: str
    T: int
    dtype: str
    concurrency: int

    @property
    def key(self) -> str:
        """Stable name used in the JSON and the plot."""
        return f"{self.backend}/{self.mode}/T{self.T}/{self.dtype}/c{self.concurrency}"


@dataclass(frozen=True)
class BenchConfig:
    """Everything ``python -m bench`` needs; defaults are the full run of ``make bench``."""

    ts: tuple[int, ...] = (16, 128, 1024)
    dtypes: tuple[str, ...] = ("float32", "bfloat16")
    concurrencies: tuple[int, ...] = (1, 16)
    modes: tuple[str, ...] = MODES
    dim: int = 768
    max_seq_len: int = 1024
    reps: int = 3
    # Seconds of measurement per cell and repetition, after a warm-up.
    duration_s: float = 1.5
    warmup_s: float = 0.3
    out: Path = Path("bench/results")
    # Where the benchmark checkpoint is cached between runs (rebuilt if its shape differs).
    model_cache: Path = Path("bench/results/.model")
    device: str = "cpu"
    # The naive baseline only has a unary form: `repeated float` has nothing to stream faster.
    naive_modes: tuple[str, ...] = ("unary",)
    backends: tuple[str, ...] = BACKENDS
    quick: bool = False
    extra_server_args: tuple[str, ...] = field(default_factory=tuple)
    # Request ids: "uniform" over the vocabulary (every row equally likely: the table is
    # read from DRAM, the worst case and the default) or "text" (windows of GPT-2 tokens of
    # the default corpus: frequent rows stay in cache, as with real traffic).
    ids: str = "uniform"

    def __post_init__(self) -> None:
        if self.reps < 1:
            raise ValueError("reps must be >= 1")
        if max(self.ts) > self.max_seq_len:
            raise ValueError(f"T {max(self.ts)} > max_seq_len {self.max_seq_len}")
        unknown = set(self.dtypes) - set(DTYPE_BYTES)
        if unknown:
            raise ValueError(f"unknown dtypes {sorted(unknown)}")
        if not set(self.modes) <= set(MODES):
            raise ValueError(f"modes must be among {MODES}")
        if not self.backends or not set(self.backends) <= set(BACKENDS):
            raise ValueError(f"backends must be among {BACKENDS}")
        if self.ids not in IDS:
            raise ValueError(f"ids must be one of {IDS}")

    def cells(self) -> list[Cell]:
        """Every cell of one repetition, grouped so the three backends of a point run together."""
        cells = []
        for mode in self.modes:
            for t in self.ts:
                for dtype in self.dtypes:
                    for conc in self.concurrencies:
                        for backend in (b for b in BACKENDS if b in self.backends):
                            if mode in SERVICE_ONLY_MODES and backend != "service":
                                continue
                            if backend == "naive" and (mode not in self.naive_modes
                                                       or dtype != self.dtypes[0]):
                                # The naive reply is fp32 floats whatever was asked: one
                                # dtype measures it.
                                continue
                            cells.append(Cell(backend, mode, t, dtype, conc))
        return cells


def _ints(text: str) -> tuple[int, ...]:
    return tuple(int(x) for x in text.split(",") if x)


def _strs(text: str) -> tuple[str, ...]:
    return tuple(x for x in text.split(",") if x)


def parse_args(argv: Sequence[str] | None = None) -> BenchConfig:
    """Command line of ``python -m bench``; ``--quick`` is the smoke-test grid."""
    p = argparse.ArgumentParser(prog="python -m bench", description=__doc__)
    p.add_argument("--quick", action="store_true",
                   help="tiny sizes, one short repetition (smoke test)")
    p.add_argument("--ts", type=_ints, help="comma-separated T values (default 16,128,1024)")
    p.add_argument("--dtypes", type=_strs, help="comma-separated: float32,bfloat16,float16")
    p.add_argument("--concurrency", type=_ints, help="requests in flight (default 1,16)")
    p.add_argument("--modes", type=_strs, help="unary,stream,oip,shm (default: all)")
    p.add_argument("--backends", type=_strs, help="subset of ceiling,naive,service")
    p.add_argument("--dim", type=int, help="C (default 768)")
    p.add_argument("--reps", type=int, help="interleaved repetitions (default 3)")
    p.add_argument("--duration", type=float, help="seconds per cell and repetition")
    p.add_argument("--warmup", type=float, help="warm-up seconds before each measurement")
    p.add_argument("--out", type=Path, help="results folder (default bench/results)")
    p.add_argument("--model-cache", type=Path,
                   help="where the benchmark checkpoint is kept (default OUT/.model)")
    p.add_argument("--device", help="service --device (default cpu)")
    p.add_argument("--ids", choices=IDS,
                   help="request ids: uniform over the vocabulary (default) or text windows")
    p.add_argument("--server-arg", action="append", default=[],
                   help="extra flag passed to the service, e.g. --server-arg=--workers=2")
    ns = p.parse_args(argv)
    cfg = BenchConfig()
    if ns.quick:
        cfg = replace(cfg, ts=(4,), concurrencies=(1, 2), dim=8, max_seq_len=16, reps=1,
                      duration_s=0.4, warmup_s=0.2, quick=True)
    overrides: dict[str, object] = {
        "ts": ns.ts, "dtypes": ns.dtypes, "concurrencies": ns.concurrency, "modes": ns.modes,
        "backends": ns.backends,
        "dim": ns.dim, "reps": ns.reps, "duration_s": ns.duration, "warmup_s": ns.warmup,
        "out": ns.out, "device": ns.device, "ids": ns.ids,
        "max_seq_len": max(cfg.max_seq_len, *ns.ts) if ns.ts else None,
    }
    cfg = replace(cfg, **{k: v for k, v in overrides.items() if v is not None})  # type: ignore[arg-type]
    if ns.model_cache is not None or ns.out is not None:
        cfg = replace(cfg, model_cache=ns.model_cache or ns.out / ".model")
    if ns.server_arg:
        cfg = replace(cfg, extra_server_args=tuple(ns.server_arg))
    return cfg

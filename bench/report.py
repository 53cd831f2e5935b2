"""Turn raw measurements into the table, the ratios and the target verdicts.

Every figure is the median over the interleaved repetitions; every ratio is computed per
repetition (service and reference measured seconds apart) and then its median taken.
"""

from __future__ import annotations

import statistics
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from bench.config import DTYPE_BYTES, SERVICE_ONLY_MODES, BenchConfig, Cell
from bench.window import Measurement, percentile

__all__ = ["P50_TARGET", "Target", "build_report", "format_report", "summarize"]

METRICS = ("req_s", "tokens_s", "mb_s", "p50_ms", "p99_ms")
MODE_ORDER = ("unary", "stream", "oip", "shm")
P50_TARGET = 1.3  # service p50 <= this x the ceiling's, small T, one in flight (grpc_floors too)


@dataclass(frozen=True)
class Target:
    """One line of the issue's targets: a measured value against a bound."""

    name: str
    value: float
    op: str  # ">=" or "<="
    bound: float

    @property
    def met(self) -> bool:
        """Whether the measured value is on the right side of the bound."""
        return self.value >= self.bound if self.op == ">=" else self.value <= self.bound


def payload_bytes(cell: Cell, dim: int) -> int:
    """Tensor bytes in one reply (the naive reply is always 4-byte floats)."""
    per = 4 if cell.backend == "naive" else DTYPE_BYTES[cell.dtype]
    return cell.T * dim * per


def summarize(m: Measurement, cell: Cell, dim: int) -> dict[str, float]:
    """req/s, tokens/s, MB/s of tensor payload, p50 and p99 latency (ms) of one measurement."""
    req_s = m.requests / m.seconds
    lat = m.latencies_ns
    return {"req_s": req_s, "tokens_s": req_s * cell.T,
            "mb_s": req_s * payload_bytes(cell, dim) / 1e6,
            "p50_ms": percentile(lat, 0.50) / 1e6, "p99_ms": percentile(lat, 0.99) / 1e6,
            "requests": float(m.requests)}


def _median_ratio(a: Sequence[Mapping[str, float]], b: Sequence[Mapping[str, float]],
                  key: str) -> float:
    ratios = [x[key] / y[key] for x, y in zip(a, b) if y[key] > 0]
    return statistics.median(ratios) if ratios else float("nan")


def _ceiling_mode(mode: str) -> str:
    # OIP and shm are unary calls: the same transport ceiling as unary Embed bounds them.
    return "unary" if mode in SERVICE_ONLY_MODES else mode


def _naive_cell(cfg: BenchConfig, cell: Cell) -> Cell:
    mode = cell.mode if cell.mode in cfg.naive_modes else cfg.naive_modes[0]
    return Cell("naive", mode, cell.T, cfg.dtypes[0], cell.concurrency)


def _targets(cfg: BenchConfig, reps: Mapping[Cell, list[dict[str, float]]]) -> list[Target]:
    out: list[Target] = []

    def add(name: str, a: Cell, b: Cell, key: str, op: str, bound: float) -> None:
        if a in reps and b in reps:
            out.append(Target(name, _median_ratio(reps[a], reps[b], key), op, bound))

    big, small = max(cfg.ts), min(cfg.ts)
    hi, lo = max(cfg.concurrencies), min(cfg.concurrencies)
    svc = Cell("service", "unary", big, "float32", hi)
    add(f"T={big} fp32 c={hi} unary: service/ceiling throughput", svc,
        Cell("ceiling", "unary", big, "float32", hi), "req_s", ">=", 0.8)
    add(f"T={big} fp32 c={hi} unary: service/naive throughput", svc,
        _naive_cell(cfg, svc), "req_s", ">=", 10.0)
    # Latency: a lower p50 is better, so the service's p50 over the ceiling's must stay small.
    add(f"T={small} fp32 c={lo} unary: service p50 / ceiling p50",
        Cell("service", "unary", small, "float32", lo),
        Cell("ceiling", "unary", small, "float32", lo), "p50_ms", "<=", P50_TARGET)
    for c in cfg.concurrencies:
        add(f"T={small} fp32 c={c}: EmbedStream / unary throughput",
            Cell("service", "stream", small, "float32", c),
            Cell("service", "unary", small, "float32", c), "req_s", ">=", 2.0)
    add(f"T={big} c={hi} unary: bf16 / fp32 tokens/s",
        Cell("service", "unary", big, "bfloat16", hi), svc, "tokens_s", ">=", 1.6)
    add(f"T={big} fp32 c={hi}: OIP ModelInfer / native unary throughput",
        Cell("service", "oip", big, "float32", hi), svc, "tokens_s", ">=", 0.9)
    shm = Cell("service", "shm", big, "float32", hi)
    add(f"T={big} fp32 c={hi}: shm tokens/s / gRPC ceiling tokens/s", shm,
        Cell("ceiling", "unary", big, "float32", hi), "tokens_s", ">=", 3.0)
    add(f"T={big} c={hi} shm: bf16 / fp32 tokens/s",
        Cell("service", "shm", big, "bfloat16", hi), shm, "tokens_s", ">=", 1.6)
    return out


def build_report(cfg: BenchConfig, results: Mapping[Cell, list[Measurement]],
                 meta: Mapping[str, Any]) -> dict[str, Any]:
    """The JSON document: per-cell medians and repetitions, comparisons, targets."""
    reps = {cell: [summarize(m, cell, cfg.dim) for m in ms] for cell, ms in results.items()}
    cells = []
    for cell, rs in reps.items():
        median = {k: statistics.median(r[k] for r in rs) for k in METRICS}
        cells.append({"key": cell.key, "backend": cell.backend, "mode": cell.mode, "T": cell.T,
                      "C": cfg.dim, "dtype": cell.dtype, "concurrency": cell.concurrency,
                      "payload_bytes": payload_bytes(cell, cfg.dim), "median": median,
                      "reps": rs})
    comparisons = []
    for cell, rs in reps.items():
        if cell.backend != "service":
            continue
        ceiling = Cell("ceiling", _ceiling_mode(cell.mode), cell.T, cell.dtype,
                       cell.concurrency)
        naive = _naive_cell(cfg, cell)
        comparisons.append({
            "key": cell.key, "mode": cell.mode, "T": cell.T, "dtype": cell.dtype,
            "concurrency": cell.concurrency,
            "service_over_ceiling": _median_ratio(rs, reps[ceiling], "req_s")
            if ceiling in reps else None,
            "service_over_naive": _median_ratio(rs, reps[naive], "req_s")
            if naive in reps else None,
            "p50_service_over_ceiling": _median_ratio(rs, reps[ceiling], "p50_ms")
            if ceiling in reps else None,
        })
    targets = [{"name": t.name, "value": t.value, "op": t.op, "bound": t.bound, "met": t.met}
               for t in _targets(cfg, reps)]
    return {"meta": dict(meta), "cells": cells, "comparisons": comparisons, "targets": targets}


def _fmt(x: float | None, spec: str) -> str:
    width = int(spec.lstrip(">").split(".")[0])
    return f"{'-':>{width}}" if x is None else format(x, spec)


def format_report(report: Mapping[str, Any]) -> str:
    """One table (a row per backend and cell, ratios on service rows), then the targets."""
    comps = {c["key"]: c for c in report["comparisons"]}
    head = (f"{'mode':6} {'T':>5} {'dtype':8} {'c':>3} {'backend':8} {'req/s':>9} "
            f"{'tokens/s':>11} {'MB/s':>8} {'p50 ms':>8} {'p99 ms':>8} {'svc/ceil':>8} "
            f"{'svc/naive':>9}")
    lines = [head, "-" * len(head)]

    def order(c: Mapping[str, Any]) -> tuple[Any, ...]:
        return (MODE_ORDER.index(c["mode"]), c["T"], c["dtype"] != "float32", c["concurrency"],
                ("ceiling", "naive", "service").index(c["backend"]))

    for c in sorted(report["cells"], key=order):
        m, comp = c["median"], comps.get(c["key"], {})
        lines.append(
            f"{c['mode']:6} {c['T']:>5} {c['dtype']:8} {c['concurrency']:>3} {c['backend']:8} "
            f"{m['req_s']:>9.1f} {m['tokens_s']:>11.0f} {m['mb_s']:>8.1f} {m['p50_ms']:>8.3f} "
            f"{m['p99_ms']:>8.3f} {_fmt(comp.get('service_over_ceiling'), '>8.2f')} "
            f"{_fmt(comp.get('service_over_naive'), '>9.1f')}")
    meta = report["meta"]
    lines += ["", f"targets (medians of {meta.get('reps', '?')} interleaved repetitions; "
                  f"{meta.get('ids', 'uniform')} ids):"]
    for t in report["targets"]:
        verdict = "MET    " if t["met"] else "NOT MET"
        lines.append(f"  [{verdict}] {t['name']} = {t['value']:.2f} (target {t['op']} "
                     f"{t['bound']:g})")
    if meta.get("quick"):
        lines.append("  (--quick: tiny sizes; these verdicts say nothing about the targets)")
    # The run itself loads every core; only load already there before it is other work.
    load, cpus = meta.get("loadavg_before", 0), meta.get("cpus")
    if cpus and load > 0.5 * cpus:
        lines.append(f"  warning: load average {load:.1f} on {cpus} CPUs before the run: other "
                     "work on this machine skewed these figures")
    return "\n".join(lines)

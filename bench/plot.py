"""The PNGs: throughput of the service beside its references (ceiling, naive, floor) for
every cell of ``python -m bench`` and ``python -m bench.http``."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from training.plot import pyplot

__all__ = ["plot_floors", "plot_http", "plot_report"]

_SHORT = {"float32": "fp32", "float16": "fp16", "bfloat16": "bf16"}
_COLORS = {"ceiling": "#999999", "naive": "#d62728", "service": "#1f77b4", "floor": "#ff7f0e",
           "frame": "#ffbb78", "lookup": "#ff7f0e"}  # grpc_floors' two floors


def plot_report(report: Mapping[str, Any], path: Path) -> Path:
    """Grouped bars of median req/s (log scale), one panel per RPC mode; returns ``path``."""
    plt = pyplot()  # PlotsUnavailable without matplotlib (the bench extra)
    modes = sorted({c["mode"] for c in report["cells"]}, key=lambda m: m != "unary")
    fig, axes = plt.subplots(len(modes), 1, figsize=(12, 4 * len(modes)), squeeze=False)
    for ax, mode in zip(axes[:, 0], modes):
        cells = [c for c in report["cells"] if c["mode"] == mode]
        points = sorted({(c["T"], c["dtype"], c["concurrency"]) for c in cells},
                        key=lambda p: (p[0], p[1] != "float32", p[2]))
        width = 0.27
        shown = []
        for i, backend in enumerate(("ceiling", "naive", "service")):
            by_point = {(c["T"], c["dtype"], c["concurrency"]): c["median"]["req_s"]
                        for c in report["cells"]
                        if c["backend"] == backend and (c["mode"] == mode or backend == "naive")}
            xs = [j + (i - 1) * width for j, p in enumerate(points) if p in by_point]
            ys = [by_point[p] for p in points if p in by_point]
            if ys:  # an empty bar set would still draw a (wrongly coloured) legend entry
                ax.bar(xs, ys, width, label=backend, color=_COLORS[backend])
                shown.append(backend)
        naive_note = "" if mode in {c["mode"] for c in report["cells"] if c["backend"] == "naive"} \
            else "; naive bars are its unary figures"
        refs = " vs ".join(["transport ceiling" if b == "ceiling" else b
                            for b in shown if b != "service"])
        _panel(ax, [f"T{t}\n{_SHORT.get(d, d)}\nc{c}" for t, d, c in points],
               f"{mode}: service{' vs ' + refs if refs else ''} (repeated float{naive_note})")
    return _save(plt, fig, path)


def plot_http(rows: Sequence[Mapping[str, Any]], path: Path) -> Path:
    """``bench.http``: median req/s of service, floor and ceiling per cell (log scale), one
    panel per output (binary, JSON), each bar labelled with its share of the ceiling."""
    plt = pyplot()
    outputs = [o for o in ("binary", "json") if any(r["output"] == o for r in rows)]
    fig, axes = plt.subplots(len(outputs), 1, figsize=(11, 4 * len(outputs)), squeeze=False)
    for ax, output in zip(axes[:, 0], outputs):
        cells = [r for r in rows if r["output"] == output]
        width = 0.27
        for i, side in enumerate(("service", "floor", "ceiling")):
            key = "rps" if side == "service" else f"{side}_rps"
            points = [(j, r) for j, r in enumerate(cells) if r.get(key) is not None]
            if not points:  # the floor serves binary cells only
                continue
            xs = [j + (i - 1) * width for j, _ in points]
            bars = ax.bar(xs, [r[key] for _, r in points], width, label=side,
                          color=_COLORS[side])
            if side != "ceiling":  # the paired per-round medians, as the table prints
                share = [r["ratio" if side == "service" else "floor_ratio"] for _, r in points]
                ax.bar_label(bars, [f"{x:.2f}" for x in share], fontsize=7)
        _panel(ax, [f"T{r['T']}\n{r['datatype']}\nc{r['c']}" for r in cells],
               f"REST infer, {output} output: service and lookup floor vs the HTTP ceiling "
               f"(labels: share of the ceiling)")
    return _save(plt, fig, path)


def plot_floors(report: Mapping[str, Any], path: Path, target: float) -> Path:
    """``bench.grpc_floors``: each server's median p50 as a bar labelled with its paired
    ratio to the ceiling's, and the p50 target (``target`` x the ceiling's) as a line."""
    plt = pyplot()
    rows = report["rows"]
    fig, ax = plt.subplots(figsize=(7, 4))
    bars = ax.bar([r["server"] for r in rows], [r["p50_us"] for r in rows],
                  color=[_COLORS[r["server"]] for r in rows])
    ax.bar_label(bars, [f"{r['ratio']:.2f}x" for r in rows], fontsize=9)
    ceiling = next(r["p50_us"] for r in rows if r["server"] == "ceiling")
    ax.axhline(ceiling * target, color="#2ca02c", linestyle="--",
               label=f"target: {target} x the ceiling's p50")
    ax.set_ylabel("p50 µs (median of rounds)")
    ax.set_title(f"gRPC unary T={report['T']} c=1: what each layer adds to the ceiling")
    ax.legend()
    ax.grid(axis="y", alpha=0.3)
    return _save(plt, fig, path)


def _panel(ax: Any, ticks: list[str], title: str) -> None:
    """One panel's axes: a tick per cell, req/s on a log scale, legend and grid."""
    ax.set_xticks(range(len(ticks)))
    ax.set_xticklabels(ticks, fontsize=8)
    ax.set_yscale("log")
    ax.set_ylabel("requests/s (median)")
    ax.set_title(title)
    ax.legend()
    ax.grid(axis="y", alpha=0.3)


def _save(plt: Any, fig: Any, path: Path) -> Path:
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path

"""The PNG: throughput of ceiling, naive and service side by side for every cell."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from training.plot import pyplot

__all__ = ["plot_report"]

_SHORT = {"float32": "fp32", "float16": "fp16", "bfloat16": "bf16"}
_COLORS = {"ceiling": "#999999", "naive": "#d62728", "service": "#1f77b4"}


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
        for i, backend in enumerate(("ceiling", "naive", "service")):
            by_point = {(c["T"], c["dtype"], c["concurrency"]): c["median"]["req_s"]
                        for c in report["cells"]
                        if c["backend"] == backend and (c["mode"] == mode or backend == "naive")}
            xs = [j + (i - 1) * width for j, p in enumerate(points) if p in by_point]
            ys = [by_point[p] for p in points if p in by_point]
            ax.bar(xs, ys, width, label=backend, color=_COLORS[backend])
        ax.set_xticks(range(len(points)))
        ax.set_xticklabels([f"T{t}\n{_SHORT.get(d, d)}\nc{c}"
                            for t, d, c in points], fontsize=8)
        ax.set_yscale("log")
        ax.set_ylabel("requests/s (median)")
        naive_note = "" if mode in {c["mode"] for c in report["cells"] if c["backend"] == "naive"} \
            else "; naive bars are its unary figures"
        ax.set_title(f"{mode}: service vs transport ceiling vs naive (repeated float{naive_note})")
        ax.legend()
        ax.grid(axis="y", alpha=0.3)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path

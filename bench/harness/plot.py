"""The serving suite's PNG: req/s of every server per cell, one panel per mode."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from training.plot import pyplot

__all__ = ["plot_serving"]

_SHORT = {"float32": "fp32", "float16": "fp16", "bfloat16": "bf16"}
_COLORS = {"ceiling": "#999999", "floor": "#ff7f0e", "naive": "#d62728", "service": "#1f77b4"}
_TITLES = {"unary": "gRPC Embed", "stream": "gRPC EmbedStream", "oip": "gRPC ModelInfer (OIP)",
           "shm": "shared-memory output", "rest": "REST, binary output",
           "json": "REST, JSON output"}


def plot_serving(rows: Sequence[Mapping[str, Any]], path: Path) -> Path:
    """Grouped bars of median req/s (log scale) per mode, each service bar labelled with its
    paired ratio to the transport's ceiling; ``PlotsUnavailable`` without matplotlib."""
    plt = pyplot()
    modes = [m for m in _TITLES if any(r["mode"] == m for r in rows)]
    fig, axes = plt.subplots(len(modes), 1, figsize=(12, 3.6 * len(modes)), squeeze=False)
    for ax, mode in zip(axes[:, 0], modes):
        cells = [r for r in rows if r["mode"] == mode]
        points = sorted({(r["T"], r["dtype"], r["c"]) for r in cells},
                        key=lambda p: (p[0], p[1] != "float32", p[2]))
        servers = [b for b in _COLORS if any(r["backend"] == b for r in cells)]
        width = 0.8 / len(servers)
        for i, backend in enumerate(servers):
            mine = {(r["T"], r["dtype"], r["c"]): r for r in cells if r["backend"] == backend}
            xs = [j + (i - (len(servers) - 1) / 2) * width
                  for j, p in enumerate(points) if p in mine]
            shown = [mine[p] for p in points if p in mine]
            bars = ax.bar(xs, [r["median"]["req_s"] for r in shown], width, label=backend,
                          color=_COLORS[backend])
            if backend == "service":
                ratios = [r.get("over_ceiling") for r in shown]
                ax.bar_label(bars, ["" if x is None else f"{x:.2f}" for x in ratios],
                             fontsize=7)
        ax.set_xticks(range(len(points)))
        ax.set_xticklabels([f"T{t}\n{_SHORT.get(d, d)}\nc{c}" for t, d, c in points],
                           fontsize=8)
        ax.set_yscale("log")
        ax.set_ylabel("requests/s (median)")
        ax.set_title(f"{_TITLES[mode]} (labels: service / ceiling, per-round median)")
        ax.legend()
        ax.grid(axis="y", alpha=0.3)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path

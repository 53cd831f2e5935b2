"""The PNGs: the serving suite's req/s of every server per cell, and the soak's latency and
RSS over time. Without matplotlib (the bench extra) a run says so and writes the rest."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from training.plot import PlotsUnavailable, pyplot

__all__ = ["save_png", "serving_figure", "soak_figure"]

_SHORT = {"float32": "fp32", "float16": "fp16", "bfloat16": "bf16"}
_COLORS = {"ceiling": "#999999", "floor": "#ff7f0e", "naive": "#d62728", "service": "#1f77b4"}
_TITLES = {"unary": "gRPC Embed", "stream": "gRPC EmbedStream", "oip": "gRPC ModelInfer (OIP)",
           "shm": "shared-memory output", "rest": "REST, binary output",
           "json": "REST, JSON output"}
_EVENTS = {"publish": "#9467bd", "bad": "#ff7f0e", "kill": "#000000", "restarted": "#7f7f7f"}


def save_png(path: Path, dpi: int, say: Callable[[str], Any], prog: str,
             figure: Callable[..., Any], *args: Any) -> None:
    """``figure(pyplot, *args)`` saved at ``path``; without matplotlib, ``say`` so (the JSON
    and the printed figures are the result)."""
    try:
        plt = pyplot()
    except PlotsUnavailable as e:
        say(f"{prog}: no {path.name}: {e}")
        return
    fig = figure(plt, *args)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=dpi)
    plt.close(fig)


def serving_figure(plt: Any, rows: Sequence[Mapping[str, Any]]) -> Any:
    """Grouped bars of median req/s (log scale) per mode, each service bar labelled with its
    paired ratio to the transport's ceiling."""
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
    return fig


def soak_figure(plt: Any, report: Mapping[str, Any]) -> Any:
    """Two panels sharing the time axis: p50/p99 latency, and the server's RSS; events as
    vertical lines (versions published, the bad version, the SIGKILL, the restart)."""
    fig, (ax1, ax2) = plt.subplots(2, 1, figsize=(11, 7), sharex=True)
    w = [x for x in report["latency_windows"] if x["answers"]]
    ax1.plot([x["t"] for x in w], [x["p50_ms"] for x in w], label="p50", color="#1f77b4")
    ax1.plot([x["t"] for x in w], [x["p99_ms"] for x in w], label="p99", color="#d62728")
    ax1.set_yscale("log")
    ax1.set_ylabel("latency, ms (valid answers)")
    ax1.legend(loc="upper left")
    rss = report["rss"]
    ax2.plot([r["t"] for r in rss], [r["total_mb"] for r in rss], color="#2ca02c",
             label="server RSS (parent + workers)")
    ax2.set_ylabel("RSS, MB")
    ax2.set_xlabel("seconds since the clients started")
    ax2.set_ylim(bottom=0)
    ax2.legend(loc="lower right")
    for st in report.get("slow_reader", {}).get("rss", []):  # slow readers holding back
        ax2.axvspan(st["start"], st["end"], color="#ffbb78" if st["clean"] else "#dddddd",
                    alpha=0.4, lw=0)
    for ev in report["events"]:
        for ax in (ax1, ax2):
            ax.axvline(ev["t"], color=_EVENTS.get(ev["kind"], "#333333"), ls="--", lw=1)
        ax1.annotate(ev["label"], (ev["t"], 1), xycoords=("data", "axes fraction"),
                     rotation=90, va="top", ha="right", fontsize=7)
    for ax in (ax1, ax2):
        ax.grid(alpha=0.3)
    c, t = report["config"], report["totals"]
    fig.suptitle(f"soak: {c['clients']} clients x {c['minutes']} min, --workers "
                 f"{c['workers']}, {t['requests']} requests, lost {t['lost']}, corrupted "
                 f"{t['corrupted']}")
    return fig

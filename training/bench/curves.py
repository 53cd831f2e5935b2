"""Loss curves of several runs in one plot (e.g. the fp32 and bf16-head anchor runs).

    .venv/bin/python -m training.bench.curves bf16=runs/anchor-bf16/state/trainer.pt \\
        fp32=runs/anchor/state/trainer.pt [--val fp32-2026-12-03=100:3.966,200:3.495] \\
        --out docs/train-precision.png

Each ``label=path`` is a trainer state written by ``python -m training`` (its loss
history: train loss per step, val loss per evaluation). ``--val label=step:loss,...``
adds val points of a run whose state is gone, from its recorded figures.
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from pathlib import Path

from training.plot import pyplot, write_loss_plot
from training.state import load_state

__all__ = ["main", "plot_runs"]


def plot_runs(runs: dict[str, list[dict[str, float]]],
              val_points: dict[str, list[tuple[int, float]]],
              path: Path) -> Path:
    """Train loss (thin) and val loss (markers) per run; extra val-only series."""
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(8, 4.5))
    for label, history in runs.items():
        line = ax.plot([h["step"] for h in history], [h["train_loss"] for h in history],
                       linewidth=0.6, alpha=0.6, label=f"{label} train")[0]
        evals = [h for h in history if "val_loss" in h]
        ax.plot([h["step"] for h in evals], [h["val_loss"] for h in evals], "o-",
                color=line.get_color(), label=f"{label} val")
    for label, points in val_points.items():
        ax.plot([s for s, _ in points], [v for _, v in points], "s--", label=f"{label} val")
    ax.set_ylim(top=6.0)
    return write_loss_plot(fig, ax, path, legend_fontsize=8)


def main(argv: Sequence[str] | None = None) -> int:
    """Parse ``label=state`` pairs and ``--val`` series; write the plot; print val losses."""
    p = argparse.ArgumentParser(prog="python -m training.bench.curves", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("runs", nargs="*", help="label=path/to/trainer.pt")
    p.add_argument("--val", action="append", default=[], help="label=step:loss,step:loss")
    p.add_argument("--out", type=Path, required=True)
    args = p.parse_args(argv)
    runs = {}
    for item in args.runs:
        label, _, where = item.partition("=")
        runs[label] = load_state(Path(where)).history
        evals = [(int(h["step"]), round(h["val_loss"], 4)) for h in runs[label] if "val_loss" in h]
        print(f"{label}: val {evals}")
    vals = {}
    for item in args.val:
        label, _, pairs = item.partition("=")
        vals[label] = [(int(s), float(v)) for s, v in (x.split(":") for x in pairs.split(","))]
    print(f"wrote {plot_runs(runs, vals, args.out)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

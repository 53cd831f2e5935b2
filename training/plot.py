"""Plots, an optional extra: matplotlib loaded only where a figure is written, and the loss
curve of a run as a PNG next to its trainer state.

``make run`` trains the default model in the runtime environment, which has no matplotlib:
there the run skips its loss curve (saying so) and everything else is the same.
"""

from __future__ import annotations

from pathlib import Path
from types import ModuleType
from typing import Any

__all__ = ["MISSING", "PlotsUnavailable", "plot_losses", "pyplot", "write_loss_plot"]

MISSING = ("matplotlib is not installed: plots are an extra "
           "(pip install -e '.[train]' or '.[bench]'; scripts/setup.sh dev installs it)")


class PlotsUnavailable(RuntimeError):
    """matplotlib is not installed; the message says how to get it."""


def pyplot() -> ModuleType:
    """matplotlib.pyplot on the file-only Agg backend (no display on servers or in CI).

    Raises PlotsUnavailable when matplotlib is missing.
    """
    try:
        import matplotlib
    except ImportError as e:
        raise PlotsUnavailable(MISSING) from e
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def plot_losses(history: list[dict[str, float]], unigram_val_loss: float, path: Path) -> Path:
    """Train loss per step, val loss at each evaluation, the unigram baseline as a line.

    Raises PlotsUnavailable without matplotlib.
    """
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(7, 4))
    ax.plot([h["step"] for h in history], [h["train_loss"] for h in history],
            label="train", linewidth=1)
    evals = [h for h in history if "val_loss" in h]
    ax.plot([h["step"] for h in evals], [h["val_loss"] for h in evals], "o-", label="val")
    ax.axhline(unigram_val_loss, color="gray", linestyle="--", label="unigram baseline (val)")
    return write_loss_plot(fig, ax, path)


def write_loss_plot(fig: Any, ax: Any, path: Path, legend_fontsize: float | None = None
                    ) -> Path:
    """Label the axes of a loss-per-step figure, write it to ``path`` as a PNG (its
    directory made) and close it."""
    ax.set_xlabel("step")
    ax.set_ylabel("cross-entropy (nats)")
    ax.legend(fontsize=legend_fontsize)
    ax.grid(alpha=0.3)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    pyplot().close(fig)
    return path

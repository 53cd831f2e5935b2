"""The loss curve of a run, as a PNG next to its trainer state."""

from __future__ import annotations

from pathlib import Path

__all__ = ["plot_losses"]


def plot_losses(history: list[dict[str, float]], unigram_val_loss: float, path: Path) -> Path:
    """Train loss per step, val loss at each evaluation, the unigram baseline as a line."""
    import matplotlib

    matplotlib.use("Agg")  # files only: no display on servers or in CI
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4))
    ax.plot([h["step"] for h in history], [h["train_loss"] for h in history],
            label="train", linewidth=1)
    evals = [h for h in history if "val_loss" in h]
    ax.plot([h["step"] for h in evals], [h["val_loss"] for h in evals], "o-", label="val")
    ax.axhline(unigram_val_loss, color="gray", linestyle="--", label="unigram baseline (val)")
    ax.set_xlabel("step")
    ax.set_ylabel("cross-entropy (nats)")
    ax.legend()
    ax.grid(alpha=0.3)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path

"""Trainer state on disk: what an exact resume needs, kept apart from the model repository.

One file, ``<runs_dir>/<name>/state/trainer.pt``, replaced atomically (write a temp file,
fsync, rename). It holds only tensors, numbers, strings, lists and dicts, so it loads with
``torch.load(weights_only=True)``: our own file, and still never unpickled as code.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from client.files import write_atomically
from training.errors import UsageError

__all__ = ["SHAPE_FIELDS", "STATE_FILE", "TrainerState", "check_resumable", "check_same_model",
           "load_resumable", "load_state", "save_state", "state_path"]

STATE_FILE = "trainer.pt"
# The config fields that decide the saved tensors' shapes: a state resumes only into a model
# built with the same ones.
SHAPE_FIELDS = ("n_layer", "n_head", "n_embd", "block_size", "position", "tie_weights",
                "sparse_embeddings", "table_rows")


@dataclass
class TrainerState:
    """Everything that changes while training, at the end of ``step``."""

    step: int
    tokens: int  # training tokens consumed so far (global, all ranks)
    model: dict[str, torch.Tensor]
    optimizers: list[dict[str, Any]]
    row_updates: torch.Tensor  # (table_rows,) int64
    batch_rng: torch.Tensor  # the batch sampler's generator state
    torch_rng: torch.Tensor  # global CPU RNG (dropout on CPU)
    cuda_rng: torch.Tensor | None
    corpus_sha256: str
    history: list[dict[str, float]] = field(default_factory=list)
    config: dict[str, Any] = field(default_factory=dict)


def state_path(runs_dir: Path, name: str) -> Path:
    """Where the state of run ``name`` lives."""
    return Path(runs_dir) / name / "state" / STATE_FILE


def save_state(path: Path, state: TrainerState) -> None:
    """Write atomically: a reader sees the old file or the new one, never half of one; the
    file gets the usual mode (0666 less the umask), not mkstemp's 0600."""
    path.parent.mkdir(parents=True, exist_ok=True)
    try:
        write_atomically(path, lambda f: torch.save(vars(state), f))
    except BaseException as e:
        # A failed write (a full disk) is the machine's answer, named for the file it was
        # for; torch.save's zip writer hides it behind a RuntimeError of its own.
        failed = e.__context__ if isinstance(e, RuntimeError) else e
        if isinstance(failed, OSError) and not failed.filename:
            raise OSError(failed.errno, failed.strerror, str(path)) from None
        raise


def load_state(path: Path) -> TrainerState:
    """Read a state written by :func:`save_state` (weights_only: no code runs)."""
    data = torch.load(path, map_location="cpu", weights_only=True)
    return TrainerState(**data)


def check_resumable(path: Path) -> None:
    """UsageError naming the file and the fix when ``--resume`` has no state to read."""
    if not path.is_file():
        raise UsageError(f"--resume: no trainer state at {path}; a run saves it there (its "
                         f"--runs-dir/--name) at --checkpoint-every steps and at its end: give "
                         f"the --runs-dir and --name of the run to continue, or drop --resume "
                         f"to start fresh")


def load_resumable(path: Path) -> TrainerState:
    """The state ``--resume`` continues from; UsageError naming the file and the fix when
    there is none or it cannot be read."""
    check_resumable(path)
    try:
        return load_state(path)
    except Exception as e:  # torch.load: truncated, not a state file, another version's
        raise UsageError(f"--resume: {path} is not a readable trainer state ("
                         f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}); "
                         f"remove it to start fresh") from e


def check_same_model(path: Path, saved: dict[str, Any], current: dict[str, Any]) -> None:
    """UsageError naming each model flag whose value differs from the state's run."""
    differ = [f"--{k.replace('_', '-')} {saved[k]} (this run: {current[k]})"
              for k in SHAPE_FIELDS if k in saved and saved[k] != current[k]]
    if differ:
        raise UsageError(f"--resume: {path} was trained with {', '.join(differ)}; resume with "
                         f"the run's own model flags, or start fresh without --resume")

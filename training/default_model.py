"""``python -m training.default_model``: make sure the repository has a model to serve.

What ``make run`` calls on a fresh clone. If any model in the repository has a valid
version, say so and exit; otherwise train the default config and export it as model
"default" (version 1).
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path

from service.format.checkpoint import CheckpointError, list_versions, verify_checkpoint
from training.config import parse_config
from training.malloc import reexec_with_tunables

__all__ = ["first_valid_version", "main"]


def first_valid_version(repository: Path) -> Path | None:
    """The newest valid version of the first model (by name) that has one, else None."""
    if not repository.is_dir():
        return None
    for model_dir in sorted(p for p in repository.iterdir() if p.is_dir()):
        for version in reversed(list_versions(model_dir)):
            try:
                verify_checkpoint(model_dir / str(version))
            except CheckpointError:
                continue
            return model_dir / str(version)
    return None


def main(argv: Sequence[str] | None = None, reexec: bool = False) -> int:
    """Exit 0 with a valid model in the repository (trained here if there was none).

    ``reexec``: restart with the malloc tunables before training (command line only).
    """
    parser = argparse.ArgumentParser(prog="python -m training.default_model")
    parser.add_argument("--model-repository", default="models")
    args, rest = parser.parse_known_args(argv)
    repository = Path(args.model_repository)
    present = first_valid_version(repository)
    if present is not None:
        print(f"{present} present")
        return 0
    if reexec:  # only now: the "present" answer should not pay for a second start
        reexec_with_tunables("training.default_model", list(argv or sys.argv[1:]))
    from training.__main__ import run

    print(f"{repository}: no valid model; training the default config (~3 min on 2 cores)")
    run(parse_config([*rest, "--out-repository", str(repository), "--name", "default"]))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:], reexec=True))

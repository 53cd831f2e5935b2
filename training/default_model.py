"""``python -m training.default_model``: make sure the repository has a model to serve.

What ``make run`` calls on a fresh clone. If any model in the repository has a valid
version, say so and exit; otherwise train the default config and export it as model
"default" (version 1). Every other flag is ``python -m training``'s, checked as that
command checks it, before anything else is done.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path

from client import flags
from service.format.checkpoint import list_versions, verify_checkpoint
from service.format.tensorfile import CheckpointError
from training.config import parse_config
from training.malloc import reexec_with_tunables

__all__ = ["RULES", "first_valid_version", "main"]

PROG = "python -m training.default_model"
RULES = {"model_repository": flags.output_dir(convert=Path)}
# Set by this command itself: given, they would be overridden without a word.
_SET_HERE = ("--out-repository", "--name", "--no-export")


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


def _parser() -> argparse.ArgumentParser:
    parser = flags.OneLineParser(
        prog=PROG, description="Train and export model 'default' unless the repository "
        "already has a valid model version.", epilog="Any other flag is python -m "
        "training's (python -m training --help), except --out-repository, --name and "
        "--no-export, which this command sets.")
    parser.add_argument("--model-repository", default=Path("models"), metavar="DIR",
                        help="the model repository: an existing directory, or a new one in "
                             "an existing directory (default models)")
    flags.install(parser, RULES)
    return parser


def main(argv: Sequence[str] | None = None, reexec: bool = False) -> int:
    """Exit 0 with a valid model in the repository (trained here if there was none).

    ``reexec``: restart with the malloc tunables before training (command line only).
    """
    parser = _parser()
    args, rest = parser.parse_known_args(argv)
    for flag in _SET_HERE:
        if any(a == flag or a.startswith(flag + "=") for a in rest):
            parser.error(f"{flag}: set by this command (it exports model 'default' into "
                         f"--model-repository); run python -m training to choose it")
    repository = args.model_repository
    cfg = parse_config([*rest, "--out-repository", str(repository), "--name", "default"],
                       prog=PROG)
    refusal = flags.check_places(RULES, vars(args))
    if refusal is not None:
        parser.error(refusal)
    present = first_valid_version(repository)
    if present is not None:
        print(f"{present} present")
        return 0
    if reexec:  # only now: the "present" answer should not pay for a second start
        reexec_with_tunables("training.default_model", list(argv or sys.argv[1:]))
    from training.__main__ import execute

    print(f"{repository}: no valid model; training the default config (a minute or two on 2 cores)")
    return execute(cfg, PROG)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:], reexec=True))

"""``python -m training``: tokenize, train, plot, export (``--help`` lists every flag).

A mistake a person can make (a flag's value, ``--data`` matching nothing, ``--resume``
without state, an output directory that cannot be made, a device that is not there, a
corpus too small) is one line on stderr and exit status 2, checked before the corpus is
tokenized where it can be (training/errors.py). A bug is one line saying "internal error"
and naming the file holding its traceback, exit status 70.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence
from pathlib import Path

from client.flags import internal_error
from service.format.tokenizer import default_ranks_path, gpt2_spec, load_tokenizer
from training import distributed
from training.config import TrainConfig, check_places, parse_config
from training.data import load_tokens, resolve_sources
from training.errors import UsageError
from training.export import export_model
from training.malloc import reexec_with_tunables
from training.plot import PlotsUnavailable, plot_losses
from training.state import check_resumable, state_path
from training.train import TrainResult, train

__all__ = ["check_inputs", "execute", "main", "run"]

PROG = "python -m training"


def run(cfg: TrainConfig) -> tuple[TrainResult, Path | None]:
    """The whole job; returns the result and the exported version (rank 0, if exported)."""
    topo = distributed.setup(cfg.device)
    try:
        spec, ranks = gpt2_spec(), default_ranks_path()
        tokenizer = load_tokenizer(spec, ranks)
        data = load_tokens(cfg.data, tokenizer, Path(cfg.cache_dir), cfg.val_fraction,
                           progress=cfg.progress and topo.is_main)
        result = train(cfg, tokenizer, data, topo)
        cfg = result.config  # as it ran: the export's provenance names it
        version_dir = None
        if topo.is_main:
            try:
                curve = str(plot_losses(result.history, result.unigram_val_loss,
                                        Path(cfg.runs_dir) / cfg.name / "loss.png"))
            except PlotsUnavailable as e:  # the runtime environment (make run): no plots
                curve = f"none ({e})"
            finished = result.step >= cfg.max_steps
            if cfg.export and finished:
                version_dir, _ = export_model(result, cfg, spec, ranks, tokenizer.n_vocab)
            print(f"step {result.step}: train loss {result.train_loss:.4f}, "
                  f"val loss {result.val_loss:.4f}, unigram baseline (val) "
                  f"{result.unigram_val_loss:.4f}, {result.tokens} tokens, "
                  f"{result.seconds:.1f} s")
            print(f"trainer state: {result.state_file}")
            print(f"loss curve: {curve}")
            if version_dir is not None:
                print(f"exported: {version_dir}")
            elif not finished:
                print(f"stopped at step {result.step} of {cfg.max_steps}: "
                      f"continue with --resume")
        return result, version_dir
    finally:
        distributed.teardown()


def check_inputs(cfg: TrainConfig) -> None:
    """What can be refused before any work: the output directories, the --data sources
    and the --resume state."""
    refusal = check_places(cfg)
    if refusal is not None:
        raise UsageError(refusal)
    resolve_sources(cfg.data)
    if cfg.resume:
        check_resumable(state_path(Path(cfg.runs_dir), cfg.name))


def execute(cfg: TrainConfig, prog: str = PROG) -> int:
    """Check the inputs, then run: 0 done, 2 a mistake (one line), 1 the machine refused
    (a disk full, a permission), 70 a bug (one line naming the log of its traceback)."""
    try:
        check_inputs(cfg)
        run(cfg)
    except UsageError as e:
        print(f"{prog}: error: {e}", file=sys.stderr, flush=True)
        return 2
    except OSError as e:  # the machine's answer (disk full, permissions): not a bug
        where = f"{e.filename}: " if e.filename else ""
        print(f"{prog}: {where}{e.strerror or e}", file=sys.stderr, flush=True)
        return 1
    except KeyboardInterrupt:
        return 130
    except Exception as e:  # a bug: its traceback to a file, one line here
        return internal_error(prog, e)
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point; 0 on success, 2 with one line on a mistake in the flags or inputs."""
    return execute(parse_config(argv))


if __name__ == "__main__":
    reexec_with_tunables("training", sys.argv[1:])
    sys.exit(main())

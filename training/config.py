"""TrainConfig: every knob of the training job, parsed once from flags and EMBED_TRAIN_* env.

Each flag ``--foo-bar`` falls back to the environment variable ``EMBED_TRAIN_FOO_BAR``,
then to the default below. The defaults are the `make run` model: small enough to train
in under 3 minutes on 2 CPU cores (measured in docs/training.md). What each accepts is its
rule in training/config_rules.py: a flag or variable that cannot work is refused as it is
parsed, naming it, and a config built in code is checked by the same rules. What the
filesystem must hold (the output directories) is checked by ``python -m training`` before
any work (``check_places``).
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import shutil
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, fields
from typing import Any

from client import flags
from training.config_rules import ADAMW_IMPLS, HEAD_CHOICES, HELP, RULES, field_problems
from training.loss import DEFAULT_CHUNK, HEAD_PRECISIONS, auto_head_precision
from training.model import POSITIONS, ModelConfig

__all__ = ["ADAMW_IMPLS", "ENV_PREFIX", "HEAD_CHOICES", "TrainConfig", "check_places",
           "compiler_available", "compilers_for", "parse_config"]

ENV_PREFIX = "EMBED_TRAIN_"
PROG = "python -m training"


def compilers_for(device_type: str) -> tuple[str, ...]:
    """What torch.compile's backend builds its code with: inductor writes C++ for CPU
    kernels and needs a C compiler for CUDA's launchers."""
    return ("g++", "c++") if device_type == "cpu" else ("cc", "gcc")


def compiler_available(device_type: str) -> bool:
    """Whether one of ``compilers_for(device_type)`` (or $CXX/$CC) is on this machine."""
    named = [os.environ[v] for v in ("CXX", "CC") if os.environ.get(v)]
    return any(shutil.which(c) for c in (*named, *compilers_for(device_type)))


@dataclass(frozen=True)
class TrainConfig:
    """The whole training run: data, model shape, optimisation, outputs."""

    # data
    data: tuple[str, ...] = ()  # files, globs, dirs, *.jsonl; empty = pydoc_data.topics
    val_fraction: float = 0.1  # last 10% of the token stream is validation
    cache_dir: str = "data_cache"  # tokenized shards, keyed by content hash
    # model
    n_layer: int = 2  # 2 blocks: enough to beat unigram clearly, cheap on 2 cores
    n_head: int = 4  # head dim 32
    n_embd: int = 128  # C: the exported tables are [table_rows, 128] and [block_size, 128]
    block_size: int = 128  # context window = max_seq_len of the exported position table
    dropout: float = 0.0  # the default run sees the corpus ~2 times: too short to overfit
    position: str = "learned"  # learned | sinusoidal | none (RoPE)
    tie_weights: bool = False  # untied: a token row moves only when that token is an input
    sparse_embeddings: bool = False  # sparse table grads + SparseAdam: idle rows never move
    table_rows: int = 50304  # GPT-2's 50257 padded to a multiple of 64
    loss_chunk: int = DEFAULT_CHUNK  # rows per chunk of the fused head + loss; 0 = full logits
    # auto | fp32 | bf16: the chunked head's training matmuls (loss.py). auto = bf16 on a CPU
    # with native bf16 (avx512_bf16/amx_bf16), else fp32; the resolved value is recorded.
    head_precision: str = "auto"
    # fp32 | bf16: CPU autocast of the blocks (attention, MLP) to bf16; the head keeps
    # head_precision and the loss stays fp32 (measured as a lever: docs/training.md).
    block_precision: str = "fp32"
    # optimisation
    batch_size: int = 8  # sequences per optimizer step (global, across all DDP ranks)
    grad_accum: int = 1  # micro-batches per step; each holds batch_size / grad_accum rows
    max_steps: int = 100  # 102k tokens, ~0.8 epoch of the default corpus: fits 3 min
    lr: float = 3e-3  # peak; a 2-layer model tolerates a high rate
    min_lr_ratio: float = 0.1  # cosine decays to lr * 0.1
    warmup_steps: int = 10  # linear warmup: Adam's moments settle before the peak rate
    weight_decay: float = 0.1  # on matrices only: never on the tables, biases or LayerNorm
    beta1: float = 0.9
    beta2: float = 0.95  # nanoGPT's value: faster second-moment tracking for short runs
    grad_clip: float = 1.0  # 0 disables
    adamw_impl: str = "fused"  # single | foreach | fused: the AdamW kernel (same maths)
    # evaluation, checkpointing, outputs
    eval_every: int = 50  # steps between val evaluations (and one at the end)
    eval_tokens: int = 16384  # val tokens per evaluation (the default corpus has ~14k)
    checkpoint_every: int = 0  # steps between trainer-state saves; 0 = only at the end
    stop_at: int = 0  # halt after this step (state saved, no export); 0 = run to max_steps
    resume: bool = False  # continue from runs/<name>/state/trainer.pt
    # Continue from that state when it exists, start fresh when it does not: what an elastic
    # job's restarted workers need (the first start has no state yet, a restart must not
    # begin again at step 0). --resume still insists on the state being there.
    resume_if_present: bool = False
    seed: int = 1337
    device: str = "auto"  # auto | cpu | cuda | cuda:N
    compile: bool = False  # torch.compile the model, whatever the run's length
    # Runs of at least this many steps compile where a compiler is present: ~30 s of
    # compiling pays for itself after ~300 steps at the anchor config (docs/training.md);
    # 0 = only with --compile. Resolved per run, recorded as what ran.
    compile_min_steps: int = 400
    threads: int = 0  # torch intra-op threads; 0 = all cores of this process
    out_repository: str = "models"  # the model repository the service reads
    name: str = "default"  # model name: writes <out_repository>/<name>/<N+1>/
    runs_dir: str = "runs"  # trainer state, loss history and plot: <runs_dir>/<name>/
    export: bool = True  # write a model version at the end
    progress: bool = True  # progress on stderr: tqdm bar, or plain lines without tqdm

    def __post_init__(self) -> None:
        for problem in [*field_problems(dataclasses.asdict(self)), *self._relations()]:
            raise ValueError(problem)
        self.model_config(vocab_size=1)  # shape checks live in ModelConfig

    def _relations(self) -> list[str]:
        """The rules between fields, each naming the flags."""
        problems = []
        if self.batch_size % self.grad_accum:
            problems.append(f"--batch-size {self.batch_size} is not divisible by "
                            f"--grad-accum {self.grad_accum}")
        if self.n_embd % self.n_head:
            problems.append(f"--n-embd {self.n_embd} is not divisible by --n-head "
                            f"{self.n_head}")
        elif self.position == "none" and (self.n_embd // self.n_head) % 2:
            problems.append(f"--position none (RoPE) needs an even head width: --n-embd "
                            f"{self.n_embd} / --n-head {self.n_head} is odd")
        if self.head_precision == "bf16" and not self.loss_chunk:
            problems.append("--head-precision bf16 needs the chunked loss: --loss-chunk > 0")
        if self.tie_weights and self.sparse_embeddings:
            problems.append("--sparse-embeddings needs an untied head (tied rows are all "
                            "dense): drop --tie-weights")
        if self.resume and self.resume_if_present:
            problems.append("--resume and --resume-if-present cannot go together: --resume "
                            "insists on the state, --resume-if-present starts fresh without")
        for name in ("stop_at", "checkpoint_every"):
            value = getattr(self, name)
            if value >= self.max_steps:
                problems.append(f"--{name.replace('_', '-')} {value} must be below "
                                f"--max-steps {self.max_steps} (0 = "
                                f"{'run to the end' if name == 'stop_at' else 'at the end'})")
        return problems

    def resolved(self, device_type: str) -> TrainConfig:
        """This config as it runs on ``device_type``: ``head_precision`` auto made
        concrete, ``compile`` true where wanted (asked, or a run of ``compile_min_steps``
        or more) and a compiler is there to build its code."""
        head = self.head_for(device_type)
        wanted = self.compile or 0 < self.compile_min_steps <= self.max_steps
        compile_ = wanted and compiler_available(device_type)
        if (head, compile_) == (self.head_precision, self.compile):
            return self
        return dataclasses.replace(self, head_precision=head, compile=compile_)

    def head_for(self, device_type: str) -> str:
        """``head_precision`` as a run on ``device_type`` takes it (auto made concrete)."""
        if self.head_precision == "auto":
            return auto_head_precision(device_type, self.loss_chunk)
        return self.head_precision

    def model_config(self, vocab_size: int, device_type: str = "cpu") -> ModelConfig:
        """The network shape for a tokenizer with ``vocab_size`` ids, its head precision
        resolved for ``device_type`` (train() resolves the whole config first)."""
        return ModelConfig(vocab_size=vocab_size, table_rows=self.table_rows,
                           block_size=self.block_size, n_layer=self.n_layer,
                           n_head=self.n_head, n_embd=self.n_embd, dropout=self.dropout,
                           position=self.position, tie_weights=self.tie_weights,
                           sparse_embeddings=self.sparse_embeddings,
                           loss_chunk=self.loss_chunk,
                           head_precision=self.head_for(device_type))

    def to_dict(self) -> dict[str, Any]:
        """JSON-able form, recorded in the manifest's provenance."""
        d = dataclasses.asdict(self)
        d["data"] = list(self.data)
        return d


def _parse_bool(text: str) -> bool:
    low = text.strip().lower()
    if low in ("1", "true", "yes", "on"):
        return True
    if low in ("0", "false", "no", "off", ""):
        return False
    raise ValueError(f"not a boolean: {text!r}")


_ENV_BOOL = flags.Rule("1 or 0 (true/false, yes/no, on/off)", _parse_bool)
# Given on the command line, each of these is meaningless with the other setting named.
RELATIONS = (
    flags.Relation(("out_repository", "export"), lambda values, given: (
        "--out-repository needs --export: with --no-export nothing is written there"
        if "out_repository" in given and not values["export"] else None)),
    flags.Relation(("compile_min_steps", "compile"), lambda values, given: (
        "--compile-min-steps and --compile cannot go together: --compile compiles whatever "
        "the run's length" if "compile_min_steps" in given and values["compile"] else None)),
)


_METAVARS: dict[Any, str] = {
    int: "N", float: "X", str: "TEXT", "data": "PATH", "cache_dir": "DIR", "runs_dir": "DIR",
    "out_repository": "DIR", "name": "NAME", "device": "DEVICE",
    "position": "{" + ",".join(POSITIONS) + "}", "adamw_impl": "{" + ",".join(ADAMW_IMPLS) + "}",
    "head_precision": "{" + ",".join(HEAD_CHOICES) + "}",
    "block_precision": "{" + ",".join(HEAD_PRECISIONS) + "}"}


def _parser(defaults: TrainConfig, prog: str = PROG) -> argparse.ArgumentParser:
    parser = flags.OneLineParser(
        prog=prog,
        description="Train a small GPT and export its tables. Every flag also reads "
                    "EMBED_TRAIN_<FLAG> (booleans 1|0, --data paths separated by ':'); a flag "
                    "given here wins. A mistake in a flag or input is one line and exit "
                    "status 2.")
    for f in fields(TrainConfig):
        default = getattr(defaults, f.name)
        shown = "pydoc_data.topics" if f.name == "data" else default
        accepts = f"; {RULES[f.name].accepts}" if RULES[f.name].takes_value else ""
        text = f"{HELP[f.name]}{accepts} (default {shown}; env {ENV_PREFIX}{f.name.upper()})"
        if isinstance(default, bool):
            parser.add_argument(flags.flag_name(f.name), action=argparse.BooleanOptionalAction,
                                default=None, help=text.replace("%", "%%"))
        else:
            parser.add_argument(flags.flag_name(f.name), default=None,
                                help=text.replace("%", "%%"),
                                nargs="+" if f.name == "data" else None,
                                metavar=_METAVARS.get(f.name) or _METAVARS[type(default)])
    flags.install(parser, RULES)
    return parser


def parse_config(argv: Sequence[str] | None = None,
                 env: Mapping[str, str] | None = None, prog: str = PROG) -> TrainConfig:
    """Flags, then EMBED_TRAIN_* environment variables, then the defaults; a mistake exits
    with status 2 and one line naming the flag or variable, as ``prog`` (the command the
    user typed: training.default_model passes its own flags on)."""
    env = os.environ if env is None else env
    defaults = TrainConfig()
    parser = _parser(defaults, prog)
    ns = vars(parser.parse_args(argv))
    values: dict[str, Any] = {}
    for f in fields(TrainConfig):
        # Every variable set is checked, also one a flag overrides: it is still a mistake
        # in the environment, waiting for the run without that flag.
        var = ENV_PREFIX + f.name.upper()
        if f.name == "data":
            from_env = [flags.from_env(parser, RULES["data"], var, {var: item})
                        for item in env[var].split(os.pathsep)] if env.get(var) else None
        else:
            rule = _ENV_BOOL if isinstance(f.default, bool) else RULES[f.name]
            from_env = flags.from_env(parser, rule, var, env)
        value = ns[f.name] if ns[f.name] is not None else from_env
        values[f.name] = getattr(defaults, f.name) if value is None else value
    values["data"] = tuple(values["data"])
    flags.check_relations(parser, RELATIONS, values, flags.given(parser, argv))
    try:
        return TrainConfig(**values)
    except ValueError as e:
        parser.error(str(e))


def check_places(cfg: TrainConfig) -> str | None:
    """The first output directory that cannot be written where it is named (its parent
    missing, or a file in its place), as one line; None when all can."""
    values = {name: getattr(cfg, name) for name in ("cache_dir", "runs_dir")}
    if cfg.export:
        values["out_repository"] = cfg.out_repository
    return flags.check_places(RULES, values)

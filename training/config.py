"""TrainConfig: every knob of the training job, parsed once from flags and EMBED_TRAIN_* env.

Each flag ``--foo-bar`` falls back to the environment variable ``EMBED_TRAIN_FOO_BAR``,
then to the default below. The defaults are the `make run` model: small enough to train
in under 3 minutes on 2 CPU cores (measured in docs/training.md).
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import shutil
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, fields
from typing import Any, NoReturn

from training.loss import DEFAULT_CHUNK, HEAD_PRECISIONS, auto_head_precision
from training.model import POSITIONS, ModelConfig

__all__ = ["ADAMW_IMPLS", "ENV_PREFIX", "HEAD_CHOICES", "TrainConfig", "compiler_available",
           "compilers_for", "parse_config"]

ENV_PREFIX = "EMBED_TRAIN_"
# torch's three AdamW kernels: one loop per tensor, multi-tensor (foreach), one fused pass.
ADAMW_IMPLS = ("single", "foreach", "fused")
HEAD_CHOICES = ("auto", *HEAD_PRECISIONS)  # auto: resolved per device by TrainConfig.resolved


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
        if self.grad_accum < 1 or self.batch_size % self.grad_accum:
            raise ValueError(f"--batch-size {self.batch_size} is not divisible by "
                             f"--grad-accum {self.grad_accum}")
        if not 0.0 < self.val_fraction < 1.0:
            raise ValueError(f"--val-fraction {self.val_fraction}: must be in (0, 1)")
        if self.max_steps <= 0 or self.warmup_steps < 0:
            raise ValueError("--max-steps must be > 0 and --warmup-steps >= 0")
        if self.adamw_impl not in ADAMW_IMPLS:
            raise ValueError(f"--adamw-impl {self.adamw_impl!r} not in {ADAMW_IMPLS}")
        if self.block_precision not in HEAD_PRECISIONS:
            raise ValueError(f"--block-precision {self.block_precision!r} not in "
                             f"{HEAD_PRECISIONS}")
        if self.head_precision not in HEAD_CHOICES:
            raise ValueError(f"--head-precision {self.head_precision!r} not in {HEAD_CHOICES}")
        self.model_config(vocab_size=1)  # shape checks live in ModelConfig

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


def _flag(name: str) -> str:
    return "--" + name.replace("_", "-")


class _OneLineParser(argparse.ArgumentParser):
    """argparse, but a mistake is one line on stderr and exit status 2 (no usage block)."""

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"{self.prog}: error: {message} (see --help)\n")


def _parse_bool(text: str) -> bool:
    low = text.strip().lower()
    if low in ("1", "true", "yes", "on"):
        return True
    if low in ("0", "false", "no", "off", ""):
        return False
    raise ValueError(f"not a boolean: {text!r}")


def _from_env(parser: argparse.ArgumentParser, name: str, raw: str | None,
              kind: Callable[[str], Any], default: Any) -> Any:
    """An EMBED_TRAIN_* value, or the default; a bad one is a one-line error naming it."""
    if raw is None:
        return default
    try:
        return kind(raw)
    except ValueError:
        parser.error(f"{ENV_PREFIX}{name.upper()}={raw!r} is not a valid "
                     f"{'bool (1|0)' if kind is _parse_bool else kind.__name__}")


def parse_config(argv: Sequence[str] | None = None,
                 env: Mapping[str, str] | None = None) -> TrainConfig:
    """Flags, then EMBED_TRAIN_* environment variables, then the defaults."""
    env = os.environ if env is None else env
    defaults = TrainConfig()
    parser = _OneLineParser(prog="python -m training",
                            description="Train a small GPT and export its tables. A mistake "
                                        "in a flag or input is one line and exit status 2.")
    for f in fields(TrainConfig):
        default = getattr(defaults, f.name)
        raw = env.get(ENV_PREFIX + f.name.upper())
        if f.name == "data":
            env_data = tuple(raw.split(os.pathsep)) if raw else default
            parser.add_argument("--data", nargs="+", default=list(env_data),
                                help="text files, globs, directories or .jsonl "
                                     "(default: pydoc_data.topics)")
        elif isinstance(default, bool):
            value = _from_env(parser, f.name, raw, _parse_bool, default)
            parser.add_argument(_flag(f.name), action=argparse.BooleanOptionalAction,
                                default=value)
        else:
            kind = type(default)
            value = _from_env(parser, f.name, raw, kind, default)
            choices = {"position": POSITIONS, "adamw_impl": ADAMW_IMPLS,
                       "head_precision": HEAD_CHOICES,
                       "block_precision": HEAD_PRECISIONS}.get(f.name)
            parser.add_argument(_flag(f.name), type=kind, default=value, choices=choices,
                                help=f"(default {value}; env {ENV_PREFIX}{f.name.upper()})")
    ns = vars(parser.parse_args(argv))
    ns["data"] = tuple(ns["data"])
    try:
        return TrainConfig(**ns)
    except ValueError as e:
        parser.error(str(e))

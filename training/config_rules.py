"""What each flag of ``python -m training`` accepts (``RULES``, client/flags.py) and what it
is for (``HELP``), one entry per TrainConfig field; and the rules between fields."""

from __future__ import annotations

from client import flags
from training.loss import HEAD_PRECISIONS
from training.model import POSITIONS, ModelConfig

__all__ = ["ADAMW_IMPLS", "GPT2_IDS", "HEAD_CHOICES", "HELP", "RULES"]

# torch's three AdamW kernels: one loop per tensor, multi-tensor (foreach), one fused pass.
ADAMW_IMPLS = ("single", "foreach", "fused")
HEAD_CHOICES = ("auto", *HEAD_PRECISIONS)  # auto: resolved per device by TrainConfig.resolved
GPT2_IDS = ModelConfig().vocab_size  # the job trains with GPT-2's tokenizer: its n_vocab ids

_STEPS = "a number of steps"
RULES: dict[str, flags.Rule] = {
    "data": flags.text("a file, glob, directory or .jsonl file"),
    "val_fraction": flags.number(0, 1, low_open=True, high_open=True),
    "cache_dir": flags.output_dir(),
    "n_layer": flags.integer(1, what="a number of blocks"),
    "n_head": flags.integer(1, what="a number of heads"),
    "n_embd": flags.integer(1, what="a width"),
    "block_size": flags.integer(1, what="a number of positions"),
    "dropout": flags.number(0, 1, high_open=True),
    "position": flags.choice(*POSITIONS),
    "tie_weights": flags.SWITCH,
    "sparse_embeddings": flags.SWITCH,
    "table_rows": flags.integer(GPT2_IDS, what="a number of rows",
                                note="GPT-2's ids, plus padding"),
    "loss_chunk": flags.integer(0, what="a number of rows", note="0 = full logits"),
    "head_precision": flags.choice(*HEAD_CHOICES),
    "block_precision": flags.choice(*HEAD_PRECISIONS),
    "batch_size": flags.integer(1, what="a number of sequences"),
    "grad_accum": flags.integer(1, what="a number of micro-batches"),
    "max_steps": flags.integer(1, what=_STEPS),
    "lr": flags.number(0, low_open=True),
    "min_lr_ratio": flags.number(0, 1),
    "warmup_steps": flags.integer(0, what=_STEPS),
    "weight_decay": flags.number(0),
    "beta1": flags.number(0, 1, high_open=True),
    "beta2": flags.number(0, 1, high_open=True),
    "grad_clip": flags.number(0, note="0 = off"),
    "adamw_impl": flags.choice(*ADAMW_IMPLS),
    "eval_every": flags.integer(1, what=_STEPS),
    "eval_tokens": flags.integer(1, what="a number of tokens"),
    "checkpoint_every": flags.integer(0, what=_STEPS, note="0 = only at the end"),
    "stop_at": flags.integer(0, what="a step", note="0 = run to --max-steps"),
    "resume": flags.SWITCH,
    "resume_if_present": flags.SWITCH,
    "seed": flags.integer(0, 2**63 - 1),
    "device": flags.DEVICE,
    "compile": flags.SWITCH,
    "compile_min_steps": flags.integer(0, what=_STEPS, note="0 = only with --compile"),
    "threads": flags.integer(0, note="0 = this process's share of the cores"),
    "out_repository": flags.output_dir(),
    "name": flags.model_name(),
    "runs_dir": flags.output_dir(),
    "export": flags.SWITCH,
    "progress": flags.SWITCH,
}

HELP: dict[str, str] = {
    "data": "the corpus, one or more paths (a .jsonl file: its 'text' field, one document "
            "per line)",
    "val_fraction": "last fraction of the token stream kept for validation",
    "cache_dir": "tokenized shards, keyed by content hash",
    "n_layer": "transformer blocks",
    "n_head": "attention heads; --n-embd must be divisible by it",
    "n_embd": "C, the width of both exported tables",
    "block_size": "context window: the exported position table's rows (max_seq_len)",
    "dropout": "dropout probability",
    "position": "learned or sinusoidal position table, or none (RoPE in attention)",
    "tie_weights": "share the token table with the LM head",
    "sparse_embeddings": "sparse table gradients and SparseAdam: idle rows never move",
    "table_rows": "rows of the token table; rows past GPT-2's ids are padding, never an "
                  "input",
    "loss_chunk": "rows per chunk of the fused head + cross-entropy",
    "head_precision": "the chunked head's matmuls in training; auto = bf16 where the CPU "
                      "has it natively",
    "block_precision": "CPU autocast of the blocks",
    "batch_size": "sequences per optimizer step, global across DDP ranks",
    "grad_accum": "micro-batches per step; --batch-size must be divisible by it",
    "max_steps": "optimizer steps: the cosine schedule's length",
    "lr": "peak learning rate",
    "min_lr_ratio": "the cosine schedule ends at --lr times this",
    "warmup_steps": "linear warmup to --lr",
    "weight_decay": "AdamW weight decay, on matrices only",
    "beta1": "AdamW beta1",
    "beta2": "AdamW beta2",
    "grad_clip": "global-norm gradient clip",
    "adamw_impl": "the AdamW kernel (same maths)",
    "eval_every": "steps between validation evaluations (and one at the end)",
    "eval_tokens": "validation tokens per evaluation",
    "checkpoint_every": "steps between trainer-state saves, fewer than --max-steps",
    "stop_at": "stop after this step, below --max-steps (state saved, nothing exported; "
               "continue with --resume)",
    "resume": "continue from <runs-dir>/<name>/state/trainer.pt, which must be there",
    "resume_if_present": "continue from that state when it is there, else start at step 0",
    "seed": "model init and batch sampling",
    "device": "where to train; auto = cuda when torch sees a GPU",
    "compile": "torch.compile the model whatever the run's length",
    "compile_min_steps": "runs of at least this many steps compile where a compiler is "
                         "present",
    "threads": "torch intra-op threads",
    "out_repository": "the model repository the version is exported into",
    "name": "model name: exports <out-repository>/<name>/<N+1>/, state in <runs-dir>/<name>/",
    "runs_dir": "trainer state, loss history and loss plot: <runs-dir>/<name>/",
    "export": "write a model version at the end",
    "progress": "progress on stderr (tqdm bars, or plain lines without tqdm)",
}


def field_problems(values: dict[str, object]) -> list[str]:
    """Each field by its rule: ``--flag: must be ..., got ...`` (``data`` item by item)."""
    problems = []
    for name, rule in RULES.items():
        value = values[name]
        for item in value if isinstance(value, tuple) else (value,):
            problem = rule.problem(item)
            if problem is not None:
                problems.append(f"--{name.replace('_', '-')}: {problem}")
    return problems

"""``python -m training.importers``' options, each checked before any work is done.

A value that cannot work is a usage error: exit status 2 and one line naming the option
and what it accepts (``python -m training.importers: error: ... (see --help)``), before
any file of the source is read. ``RULES`` says, for every option of every subcommand, what
is checked; the tests walk the parser's own options against it, so an option added
without a rule fails them.

``parse`` checks the values (``--max-seq-len 0``, ``--out models/m/01``, options that
another makes meaningless), then the paths: the source must exist; ``--out`` must not (a
version is immutable), and every directory it needs must be creatable (missing ones are
made, as the training job makes its repository; an existing file in the way or an
unwritable parent is refused).
"""

from __future__ import annotations

import argparse
import json
import os
from collections.abc import Callable, Sequence
from pathlib import Path

from client.flags import OneLineParser, flag_name
from service.format.checkpoint import is_version_name

__all__ = ["DTYPES", "HF_COMMANDS", "PROG", "RULES", "build_parser", "parse"]

PROG = "python -m training.importers"

DTYPES = ("float32", "float16", "bfloat16")
HF_COMMANDS = {"hf": None, "hf-gpt2": "gpt2", "hf-llama": "llama"}  # alias -> model_type
_MAX_SEQ_LEN = (1 << 31) - 1
# What each option accepts, by dest; the parser walk in the tests requires one per option.
RULES: dict[str, str] = {
    "dir": "an existing directory (config.json + safetensors)",
    "ckpt": "an existing file (nanoGPT's ckpt.pt)",
    "out": "models/<name>/<version>: a version that does not exist yet, a positive integer "
           "without leading zeros, under a directory that can be created",
    "dtype": f"keep, {', '.join(DTYPES)}; not with --name-map-check",
    "name_map_check": "not with --out, --dtype or any tokenizer option (it writes nothing)",
    "tokenizer": "an existing .tiktoken ranks file; not with --no-tokenizer or "
                 "--name-map-check",
    "no_tokenizer": "not with --tokenizer, --pat-str, --special-tokens, --encoding or "
                    "--name-map-check",
    "max_seq_len": f"an integer from 1 to {_MAX_SEQ_LEN}",
    "pat_str": "a regular expression; only with --tokenizer",
    "special_tokens": "a JSON object of token -> id (id >= 0), or a file holding one; only "
                      "with --tokenizer",
    "encoding": "a name of letters, digits, '_', '-' or '.'; only with --tokenizer",
    "discover": "a flag (hf, hf-gpt2, hf-llama)",
}


def _positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        value = 0
    if not 1 <= value <= _MAX_SEQ_LEN:
        raise argparse.ArgumentTypeError(f"{text!r}: accepts {RULES['max_seq_len']}")
    return value


def _version_dir(text: str) -> Path:
    path = Path(text)
    if not is_version_name(path.name) or path.parent.name in ("", ".", ".."):
        raise argparse.ArgumentTypeError(f"{text!r}: accepts {RULES['out']}")
    return path


def _encoding(text: str) -> str:
    if not text or not all(c.isascii() and (c.isalnum() or c in "_-.") for c in text):
        raise argparse.ArgumentTypeError(f"{text!r}: accepts {RULES['encoding']}")
    return text


def _pat_str(text: str) -> str:
    import regex  # tiktoken's own dependency: the same \p{L} syntax it compiles

    try:
        regex.compile(text)
    except regex.error as e:
        raise argparse.ArgumentTypeError(f"{text!r} is not a regular expression ({e})"
                                          ) from None
    return text


# The --tokenizer file's own settings (only with --tokenizer), by dest in --help's order:
# the value's type, its metavar, and what it is.
_TIKTOKEN_ONLY: dict[str, tuple[Callable[[str], str] | None, str, str]] = {
    "pat_str": (_pat_str, "REGEX", "pre-tokenizer regular expression (default: GPT-2's for "
                                   "gpt2, Llama 3's otherwise)"),
    "special_tokens": (None, "JSON", "special tokens: a JSON object of token -> id (id >= 0), "
                                     "or a file holding one"),
    "encoding": (_encoding, "NAME", "encoding name: letters, digits, '_', '-' or '.' "
                                    "(default: gpt2 for gpt2, llama3 otherwise)"),
}


def build_parser(description: str = "") -> argparse.ArgumentParser:
    """The parser, one subparser per importer (values checked by their types here; the
    combinations and paths by ``parse``)."""
    p = OneLineParser(prog=PROG, description=description,
                      formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="command", required=True, metavar="COMMAND")
    helps = {"hf": "a Hugging Face model directory (config.json + safetensors), any "
                   "supported model_type",
             "hf-gpt2": "alias of hf for model_type gpt2 (GPT-2 ranks if no tokenizer.json)",
             "hf-llama": "alias of hf for model_type llama",
             "nanogpt": "nanoGPT ckpt.pt (loaded with weights_only=True)"}
    for name, help_ in helps.items():
        s = sub.add_parser(name, help=help_)
        if name == "nanogpt":
            s.add_argument("ckpt", type=Path, metavar="CKPT", help=RULES["ckpt"])
        else:
            s.add_argument("dir", type=Path, metavar="DIR", help=RULES["dir"])
        s.add_argument("--out", type=_version_dir, metavar="MODELS/NAME/VERSION",
                       help="the version to write: a version that does not exist yet (a "
                            "positive integer without leading zeros) under the model's "
                            "directory; missing directories above it are created. Required "
                            "unless --name-map-check")
        s.add_argument("--dtype", choices=["keep", *DTYPES], default=None,
                       help="storage dtype of the tables (default: keep the source's); not "
                            "with --name-map-check")
        s.add_argument("--name-map-check", action="store_true",
                       help="resolve names and check shapes, print the map, write nothing")
        if name == "nanogpt":
            s.add_argument("--tokenizer", type=Path, metavar="FILE.tiktoken",
                           help="a tiktoken ranks file (default: GPT-2's ranks)")
            continue
        s.add_argument("--tokenizer", type=Path, metavar="FILE.tiktoken",
                       help="a tiktoken ranks file, instead of DIR's own tokenizer.json or "
                            "tokenizer.model (default: those; without them, ids-only"
                            + (", or GPT-2's ranks for hf-gpt2" if name == "hf-gpt2" else "")
                            + ")")
        s.add_argument("--no-tokenizer", action="store_true",
                       help="import ids-only even when DIR has a tokenizer.json or "
                            "tokenizer.model")
        s.add_argument("--max-seq-len", type=_positive_int, metavar="N",
                       help=f"context length, an integer from 1 to {_MAX_SEQ_LEN}: for a "
                            "family without a position table whose config.json states none "
                            "(BLOOM); it may override the config's; refused for learned "
                            "position tables (their row count is the limit)")
        for dest, (type_, metavar, what) in _TIKTOKEN_ONLY.items():
            s.add_argument(flag_name(dest), type=type_, metavar=metavar,
                           help=f"the --tokenizer file's {what}")
        s.add_argument("--discover", action="store_true",
                       help="find the rule by running the family's transformers code even "
                            "for a hand-written family, and refuse unless both agree "
                            "(model types without an entry are always discovered)")
    return p


def _special_tokens(text: str) -> dict[str, int]:
    """The --special-tokens value: a JSON object, or a file holding one."""
    path = Path(text)
    try:
        source = path.read_text(encoding="utf-8") if path.is_file() else text
        value = json.loads(source)
    except (OSError, UnicodeDecodeError, ValueError):
        value = None
    if (not isinstance(value, dict)
            or not all(isinstance(v, int) and not isinstance(v, bool) and v >= 0
                       for v in value.values())):
        raise ValueError(f"{text!r}: accepts {RULES['special_tokens']}")
    return {str(k): int(v) for k, v in value.items()}


def _writable_under(out: Path) -> str | None:
    """Why ``out`` cannot be created (None when it can): the nearest existing directory
    above it must be a directory this process can write into."""
    for parent in out.parents:  # ends at "." or "/", which exist
        if parent.exists():
            if not parent.is_dir():
                return f"{parent} is not a directory"
            if not os.access(parent, os.W_OK | os.X_OK):
                return f"{parent} is not writable"
            return None
    return None


def _check(args: argparse.Namespace) -> str | None:
    """The first problem with the options (None when they can work), one line."""
    hf = args.command in HF_COMMANDS
    given = {k for k in ("tokenizer", *_TIKTOKEN_ONLY) if getattr(args, k, None) is not None}
    if args.name_map_check:
        writes = [flag_name(k) for k in ("out", "dtype") if getattr(args, k)]
        writes += [flag_name(k) for k in sorted(given)]
        writes += ["--no-tokenizer"] if getattr(args, "no_tokenizer", False) else []
        if writes:
            return f"--name-map-check writes nothing: {', '.join(writes)} would not be used"
    elif args.out is None:
        return "--out models/<name>/<version> is required (or --name-map-check)"
    if hf and args.no_tokenizer and given:
        named = ", ".join(flag_name(k) for k in sorted(given))
        return f"--no-tokenizer imports ids-only: {named} would not be used"
    if hf and args.tokenizer is None:
        for k in _TIKTOKEN_ONLY:
            if getattr(args, k) is not None:
                return f"{flag_name(k)}: {RULES[k]}"
    source = args.dir if hf else args.ckpt
    label = "DIR" if hf else "CKPT"
    if hf and not source.is_dir():
        return f"{label} {source}: not a directory; accepts {RULES['dir']}"
    if not hf and not source.is_file():
        return f"{label} {source}: not a file; accepts {RULES['ckpt']}"
    if args.tokenizer is not None and not args.tokenizer.is_file():
        return f"--tokenizer {args.tokenizer}: not a file; accepts {RULES['tokenizer']}"
    if hf and args.special_tokens is not None:
        try:
            args.special_tokens = _special_tokens(args.special_tokens)
        except ValueError as e:
            return f"--special-tokens {e}"
    if args.out is not None:
        if args.out.exists() or args.out.is_symlink():
            return f"--out {args.out}: exists; versions are immutable, name a new version"
        why = _writable_under(args.out)
        if why:
            return f"--out {args.out}: cannot be created: {why}"
    return None


def parse(argv: Sequence[str] | None, description: str = "") -> argparse.Namespace:
    """The checked options (``--dtype`` None = keep; ``--special-tokens`` parsed to a
    dict); exit status 2 with one line on the first problem, before any work."""
    parser = build_parser(description)
    args = parser.parse_args(argv)
    problem = _check(args)
    if problem is not None:
        parser.error(problem)
    return args

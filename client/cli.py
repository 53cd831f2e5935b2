"""``embedctl``: the embedding service from a shell.

    embedctl embed "hello world"              # shape, ids, a preview of the rows, timing
    embedctl embed --ids 1,2,3 --out x.npy    # also save the (T, C) array, at exactly x.npy
    embedctl embed --shm "hello world"        # rows through /dev/shm, not the response
    embedctl tokenize "hello world"
    embedctl detokenize 31373,995
    embedctl info [--model NAME]
    embedctl models

Every option is checked by its rule (``RULES``, client/flags.py) when it is parsed: a
mistake is one line, ``embedctl: error: ...``, and exit status 2, before any connection. A
failed call prints one line, ``embedctl: <what happened>``, and exits 1; a bug in embedctl
one line naming the log of its traceback (exit 70). Never a traceback on the terminal.
"""

from __future__ import annotations

import os

# grpc's core logs a failed TLS handshake at INFO on stderr, and reads this only when grpc
# is first imported: embedctl says what failed in one line itself.
os.environ.setdefault("GRPC_VERBOSITY", "ERROR")

import argparse
import dataclasses
import re
import sys
from collections.abc import Callable, Mapping, Sequence

import grpc
import numpy as np

from client import flags
from client.cli_output import format_embedding, save_array, token_text
from client.client import DEFAULT_TARGET, EmbeddingClient
from client.codec import COMPOSE, DTYPES, TRUNCATE, Embedding, EmbeddingError
from client.diagnose import explain, probe, split_target
from client.grammar import (
    IDS_FORM,
    MAX_ID,
    SPELLINGS,
    TARGET,
    TARGET_FORM,
    UINT32_MAX,
    enum_value,
    parse_ids,
)
from client.shm import SharedMemoryRegion

__all__ = ["RELATIONS", "RULES", "CommandError", "build_parser", "format_embedding", "main",
           "parse_args", "save_array"]

class CommandError(Exception):
    """A failure embedctl reports as one line (the message) with exit status 1."""


def _enum_help(field: str) -> str:
    others = [s for name, short in SPELLINGS[field].items() for s in (*short[1:], name)]
    return f"also: {', '.join(others)}"


def _embed(client: EmbeddingClient, args: argparse.Namespace) -> None:
    options = {"model": args.model, "version": args.version,
               "start_position": args.start_position, "compose": args.compose,
               "dtype": args.dtype, "truncate": args.truncate,
               "allow_special_tokens": args.allow_special_tokens}
    if args.add_special_tokens is not None:  # absent: the model's default (e.g. BOS)
        options["add_special_tokens"] = args.add_special_tokens
    if not args.shm:
        e = client.embed(args.text, args.ids, **options)
        _show(e, args)
        return
    # The server must share this machine's /dev/shm (same host, or one pod).
    with SharedMemoryRegion(f"embedctl-{os.getpid()}", args.shm_bytes) as region:
        client.register_shared_memory(region)
        try:
            e = client.embed(args.text, args.ids, shm=region, **options)
            e = dataclasses.replace(e, array=np.array(e.array))  # copy out before unmapping
        finally:
            client.unregister_shared_memory(region.name)
    _show(e, args)
    print(f"via shared memory {region.key}")


def _show(e: Embedding, args: argparse.Namespace) -> None:
    if args.out:
        try:
            save_array(args.out, e.array)
        except OSError as err:
            raise CommandError(f"cannot write {args.out}: {err.strerror}") from None
    print("\n".join(format_embedding(e)))
    if args.out:
        print(f"saved {args.out}")


def _tokenize(client: EmbeddingClient, args: argparse.Namespace) -> None:
    ids, tokens = client.tokenize(args.text, model=args.model, version=args.version,
                                  allow_special_tokens=args.allow_special_tokens)
    print(f"{len(ids)} tokens")
    for i, tok in zip(ids, tokens):
        print(f"{i:>6}  {token_text(tok)}")


def _detokenize(client: EmbeddingClient, args: argparse.Namespace) -> None:
    print(client.detokenize(args.ids, model=args.model, version=args.version))


def _info(client: EmbeddingClient, args: argparse.Namespace) -> None:
    m = client.model_info(args.model, args.version)
    print(f"model {m.model}  version {m.version}{'  (default)' if m.is_default else ''}")
    print(f"checkpoint_id {m.checkpoint_id}")
    print(f"vocab_size {m.vocab_size}  table_rows {m.table_rows}  dim {m.dim}  "
          f"max_seq_len {m.max_seq_len}  position {m.position}")
    print(f"storage_dtype {m.storage_dtype}  device {m.device}")
    if m.has_tokenizer:
        kind = m.tokenizer.kind or "tiktoken"
        print(f"tokenizer {kind} {m.tokenizer.encoding}  {m.tokenizer.file}  "
              f"sha256 {m.tokenizer.sha256}")
    else:
        print("tokenizer none (ids-only: text requests are refused)")
    # family "" = trained by this project's job; hidden_size differs from dim for OPT's
    # project_in (token-only rows have dim columns, the default compose hidden_size).
    print(f"family {m.family or '-'}  rules {m.rules or 'none'}  "
          f"hidden_size {m.hidden_size or m.dim}")
    print(f"limits  max_tokens_per_request {m.max_tokens_per_request}  "
          f"max_text_bytes {m.max_text_bytes}  max_message_bytes {m.max_message_bytes}")
    rows = f"{m.untrained_rows} untrained rows" if m.has_row_updates else "no row statistics"
    print(f"row_updates: {rows}")
    print(f"provenance {m.provenance_json}")


def _models(client: EmbeddingClient, args: argparse.Namespace) -> None:
    models = client.list_models()
    if not models:  # a server on an empty (or still filling) repository
        print("no model is loaded: the server's model repository has no valid version yet")
    for m in models:
        print(f"{m.model}  v{m.version}{'  default' if m.is_default else ''}  "
              f"C={m.dim}  vocab_size={m.vocab_size}  max_seq_len={m.max_seq_len}  "
              f"position={m.position}  checkpoint {m.checkpoint_id[:12]}")


def _enum_rule(field: str) -> flags.Rule:
    """Every spelling client.grammar accepts (token, token_only, COMPOSE_TOKEN_ONLY)."""
    def convert(value: str) -> str:
        enum_value(field, value)  # ValueError naming the accepted spellings
        return value
    spellings = [s for name, short in SPELLINGS[field].items() for s in (*short, name)]
    return flags.Rule(f"one of {', '.join(spellings)}", convert, explains=True)


# What each option accepts (client/flags.py): every option of every subcommand has a rule.
RULES: dict[str, flags.Rule] = {
    "target": TARGET,
    "timeout": flags.number(0, low_open=True, what="a number of seconds"),
    "token": flags.TOKEN,
    "tls": flags.SWITCH,
    "tls_ca": flags.input_file(what="a PEM file"),
    "tls_cert": flags.input_file(what="a PEM file"),
    "tls_key": flags.input_file(what="a PEM file"),
    "model": flags.model_name(empty="the server's default model"),
    "version": flags.integer(0, MAX_ID, note="0 = the newest loaded"),
    "text": flags.text(),
    "ids": flags.Rule(IDS_FORM, parse_ids, explains=True),
    "start_position": flags.integer(0, UINT32_MAX),
    "compose": _enum_rule("compose"),
    "dtype": _enum_rule("dtype"),
    "truncate": _enum_rule("truncate"),
    "add_special_tokens": flags.SWITCH,
    "allow_special_tokens": flags.SWITCH,
    "out": flags.output_file((".npy",)),
    "shm": flags.SWITCH,
    "shm_bytes": flags.integer(1, what="a size in bytes"),
}
_TEXT_ONLY = "special tokens are a matter of tokenizing text; ids are sent as given"
RELATIONS = (
    flags.one_of("text", "ids", names=("TEXT", "--ids")),
    flags.conflicts("allow_special_tokens", "ids", _TEXT_ONLY),
    flags.conflicts("add_special_tokens", "ids", _TEXT_ONLY),
    flags.needs("shm_bytes", "shm", "it sizes the shared-memory region"),
    flags.needs("tls_cert", "tls_key", "mutual TLS takes the certificate and its key"),
    flags.needs("tls_key", "tls_cert", "mutual TLS takes the certificate and its key"),
    flags.conflicts("tls", "tls_ca", "--tls trusts the system roots, --tls-ca only the "
                    "given ones (and implies TLS)"),
)
ENVIRONMENT = {"target": "EMBED_TARGET", "token": "EMBED_TOKEN"}


def build_parser() -> argparse.ArgumentParser:
    """The embedctl argument parser, each option checked by its rule in RULES."""
    p = flags.OneLineParser(prog="embedctl", description="Talk to the embedding service. "
                            "The options below go before COMMAND; each command's own "
                            "options after it (embedctl COMMAND --help). A mistake in the "
                            "options is one line on stderr and exit status 2; a failed call "
                            "one line and exit status 1.")
    p.add_argument("--target", metavar="HOST:PORT",
                   help=f"the service's gRPC port: {TARGET_FORM} (env EMBED_TARGET; "
                        f"default {DEFAULT_TARGET})")
    p.add_argument("--timeout", default=10.0, metavar="SECONDS",
                   help="deadline of each call, seconds > 0 (default %(default)g)")
    p.add_argument("--token", help="bearer token: visible ASCII without spaces or line "
                   "breaks (env EMBED_TOKEN)")
    p.add_argument("--tls", action="store_true", help="TLS, trusting the system's roots")
    p.add_argument("--tls-ca", metavar="PEM", help="TLS, trusting only the root "
                   "certificates in this PEM file; not with --tls")
    p.add_argument("--tls-cert", metavar="PEM", help="client certificate chain, a PEM file "
                   "(mutual TLS; with --tls-key)")
    p.add_argument("--tls-key", metavar="PEM", help="its unencrypted private key, a PEM "
                   "file (mutual TLS; with --tls-cert)")
    sub = p.add_subparsers(dest="command", required=True, metavar="COMMAND")

    def command(name: str, run: Callable[[EmbeddingClient, argparse.Namespace], None],
                help_: str, model: bool = True) -> argparse.ArgumentParser:
        c = sub.add_parser(name, help=help_, description=help_)
        if model:
            c.add_argument("--model", default="", help="model name: letters, digits, '.', "
                           "'_', '-', starting with a letter or digit (default: the "
                           "server's default model)")
            c.add_argument("--version", default=0, metavar="N", help="version, 0..2^53-1; "
                           "0 = the newest loaded (default)")
        c.set_defaults(run=run)
        return c

    e = command("embed", _embed, "embed TEXT (or --ids) and show the (T, C) array")
    e.add_argument("text", nargs="?", metavar="TEXT", help="the text to embed")
    e.add_argument("--ids", help="token ids instead of TEXT: integers separated by commas, "
                   "e.g. 1,2,3 (spaces around them are ignored)")
    e.add_argument("--start-position", default=0, metavar="P",
                   help="position of the first token, 0..2^32-1 (default 0)")
    e.add_argument("--compose", default="token+position",
                   metavar="{" + ",".join(COMPOSE) + "}",
                   help="what to return: the token and position rows summed (default), the "
                        "token rows (what HF inputs_embeds and vLLM prompt_embeds take), or "
                        "the position rows; " + _enum_help("compose"))
    e.add_argument("--dtype", default="float32",
                   metavar="{" + ",".join(DTYPES) + "}",
                   help="the rows' dtype (added in float32, then cast; default float32); "
                        + _enum_help("dtype"))
    e.add_argument("--add-special-tokens", action=argparse.BooleanOptionalAction,
                   default=None, help="add (or omit) the model's BOS/EOS to TEXT; default: "
                   "the model's own default")
    e.add_argument("--truncate", default="none",
                   metavar="{" + ",".join(TRUNCATE) + "}",
                   help="a sequence past the model's max_seq_len: refused (none, the "
                        "default), its first tokens kept (right) or its last (left); "
                        + _enum_help("truncate"))
    e.add_argument("--allow-special-tokens", action="store_true",
                   help="encode special-token strings in TEXT (e.g. '<|endoftext|>') as "
                   "the special tokens, not as plain text")
    e.add_argument("--out", metavar="FILE.npy", help="also save the (T, C) array (bfloat16 "
                   "widened to float32) at exactly this path: a name ending in .npy, in a "
                   "directory that exists")
    e.add_argument("--shm", action="store_true",
                   help="receive the rows through a /dev/shm region (server on this host)")
    e.add_argument("--shm-bytes", default=64 << 20, metavar="BYTES",
                   help="size of that region, bytes >= 1; with --shm (default 64 MiB)")
    t = command("tokenize", _tokenize, "text -> token ids and token strings")
    t.add_argument("text", metavar="TEXT", help="the text to tokenize")
    t.add_argument("--allow-special-tokens", action="store_true",
                   help="encode special-token strings in TEXT (e.g. '<|endoftext|>') as "
                   "the special tokens, not as plain text")
    d = command("detokenize", _detokenize, "comma-separated token ids -> text")
    d.add_argument("ids", metavar="IDS", help="integers separated by commas, e.g. 1,2,3")
    command("info", _info, "one model's tables, tokenizer and limits")
    command("models", _models, "every loaded model version", model=False)
    flags.install(p, RULES)
    return p


def parse_args(argv: Sequence[str] | None = None,
               environ: Mapping[str, str] | None = None) -> argparse.Namespace:
    """The command line, checked: options by RULES, their relations, $EMBED_TARGET and
    $EMBED_TOKEN, and the files named. A mistake exits with status 2 and one line."""
    parser = build_parser()
    args = flags.parse(parser, RULES, argv, RELATIONS, ENVIRONMENT, environ)
    problem = flags.tls_problem(args.tls_cert, args.tls_key, args.tls_ca, "--tls-ca")
    if problem is not None:
        parser.error(problem)
    if args.target is None:
        args.target = DEFAULT_TARGET
    return args


# The server's refusal of an output that does not fit a shared-memory region names the
# bytes the output needs (service/engine/shm.py).
_SHM_NEEDS = re.compile(r"the output needs (\d+) bytes at offset 0 ")


def _failure(err: EmbeddingError, args: argparse.Namespace) -> str:
    """The one line for a failed call: the server's answer, or why there was none."""
    if err.unreachable:
        # grpc's wording does not tell these apart reliably: look at the listener itself.
        where = split_target(args.target)
        if where is None:
            return f"server not reachable at {args.target}: {err.details}"
        client_tls = bool(args.tls or args.tls_ca or args.tls_cert or args.tls_key)
        listener = probe(*where, timeout=min(args.timeout, 3.0))
        return explain(args.target, listener, client_tls, err.details)
    line = f"{err.code.name}: {err.details}"
    if err.code == grpc.StatusCode.UNAUTHENTICATED:
        return line + (": the server refused this token; check --token (or $EMBED_TOKEN)"
                       if args.token else
                       ": the server wants a bearer token; pass it with --token (or "
                       "$EMBED_TOKEN)")
    needs = _SHM_NEEDS.search(err.details) if args.command == "embed" and args.shm else None
    if err.code == grpc.StatusCode.INVALID_ARGUMENT and needs is not None:
        return line + (f": this request needs --shm-bytes {needs.group(1)} or more (it had "
                       f"{args.shm_bytes})")
    if err.code == grpc.StatusCode.DEADLINE_EXCEEDED:
        return line + (f": no answer within {args.timeout:g} s; raise --timeout, or check "
                       f"that --target is the service's gRPC port")
    return line


def main(argv: Sequence[str] | None = None) -> int:
    """Run embedctl; returns the exit status (0 ok, 1 failed, 2 bad usage, 70 a bug)."""
    args = parse_args(argv)
    try:
        with EmbeddingClient(args.target, timeout=args.timeout, token=args.token,
                             tls=args.tls, root_certificates=args.tls_ca,
                             client_certificate=args.tls_cert,
                             client_key=args.tls_key) as client:
            args.run(client, args)
    except EmbeddingError as err:
        print(f"embedctl: {_failure(err, args)}", file=sys.stderr)
        return 1
    except OSError as err:  # a TLS file gone since the check, a shared-memory region refused
        where = f"{err.filename}: " if err.filename else ""
        print(f"embedctl: {where}{err.strerror or err}", file=sys.stderr)
        return 1
    except CommandError as err:
        print(f"embedctl: {err}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 130
    except Exception as err:  # a bug: its traceback goes to a log file, not the terminal
        return flags.internal_error("embedctl", err)
    return 0


if __name__ == "__main__":
    sys.exit(main())

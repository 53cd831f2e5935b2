"""Look inside a checkpoint's tables: nearest tokens, position similarity, lookups, unused rows.

    python -m training.inspect --model-repository models --model NAME [--version N] CMD
      neighbors WORD [--k 10]        nearest tokens by cosine similarity in the token table
      neighbors --id ID [--k 10]     the same for a token id
      positions --out positions.png  cosine-similarity heatmap of the position table
      lookup TEXT --out lookup.png   token rows, position rows and their sum, [T x C] each
      untrained [--limit N]          token ids whose row no training step ever updated

Only rows below vocab_size are real tokens: padding rows (nanoGPT's 50257..50303) are
never inputs, so they are left out of neighbours and counts. A figure is written at
exactly the --out path, in the format its suffix names (.png, .svg or .pdf). A mistake
(an option, a model or version that is not there, a checkpoint that cannot be read) is one
line and exit status 2; a bug one line naming the log of its traceback (exit status 70).
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.nn.functional as F

from client import flags
from client.flags import internal_error
from service.format.checkpoint import Checkpoint, list_versions, read_checkpoint
from service.format.hf_tokenizer import TextTokenizer, load_text_tokenizer
from service.format.positions import sinusoidal_table
from service.format.tensorfile import CheckpointError
from training.plot import PlotsUnavailable, pyplot

__all__ = [
    "FIGURE_SUFFIXES",
    "RELATIONS",
    "RULES",
    "InspectError",
    "LoadedModel",
    "load_model",
    "lookup_figure_size",
    "main",
    "nearest_tokens",
    "parse_args",
    "plot_lookup",
    "plot_positions",
    "position_similarity",
    "token_string",
    "untrained_tokens",
]

PROG = "python -m training.inspect"
_DPI = 100  # figures are saved at a fixed size (no tight bbox), so pixel sizes are exact
# The formats matplotlib's Agg backend writes, by suffix: the file's name says its format.
FIGURE_SUFFIXES = (".png", ".svg", ".pdf")


class InspectError(Exception):
    """A request the checkpoint cannot answer; the message says why."""


@dataclass(frozen=True)
class LoadedModel:
    """One verified checkpoint version and its tokenizer."""

    checkpoint: Checkpoint
    tokenizer: TextTokenizer

    @property
    def position_table(self) -> torch.Tensor | None:
        """(max_seq_len, C): stored when learned, computed when sinusoidal, None for RoPE."""
        m = self.checkpoint.manifest
        if m.position == "sinusoidal":
            return sinusoidal_table(m.max_seq_len, m.dim)
        return self.checkpoint.position_table


def load_model(repository: Path, model: str, version: int | None = None) -> LoadedModel:
    """The pinned version, or the newest one, verified like the server verifies it."""
    model_dir = Path(repository) / model
    versions = list_versions(model_dir)
    if not versions:
        raise InspectError(f"{model_dir}: no versions")
    if version is None:
        version = versions[-1]
    elif version not in versions:
        raise InspectError(f"{model_dir}: no version {version} (have {versions})")
    ckpt = read_checkpoint(model_dir / str(version))
    if ckpt.manifest.tokenizer is None or ckpt.tokenizer_path is None:
        raise InspectError(f"{model_dir / str(version)}: imported without a tokenizer "
                           f"(ids-only); inspect needs one to name tokens")
    try:
        tokenizer = load_text_tokenizer(ckpt.manifest.tokenizer, ckpt.tokenizer_path)
    except (ValueError, TypeError) as e:  # each names the file and what is wrong with it
        raise InspectError(str(e)) from None
    return LoadedModel(ckpt, tokenizer)


def token_string(tokenizer: TextTokenizer, token_id: int) -> str:
    """A token's text, quoted so leading spaces and partial UTF-8 show."""
    return repr(tokenizer.token_bytes([token_id])[0].decode("utf-8", errors="replace"))


def nearest_tokens(token_table: torch.Tensor, vocab_size: int, token_id: int,
                   k: int) -> list[tuple[int, float]]:
    """The k token ids < vocab_size closest to ``token_id`` by cosine, itself excluded."""
    if not 0 <= token_id < vocab_size:
        raise InspectError(f"token id {token_id} not in [0, {vocab_size})")
    rows = F.normalize(token_table[:vocab_size].float(), dim=1)  # (vocab_size, C)
    scores = rows @ rows[token_id]  # (vocab_size,)
    scores[token_id] = -float("inf")
    top = torch.topk(scores, min(k, vocab_size - 1))
    return [(int(i), float(s)) for s, i in zip(top.values, top.indices)]


def untrained_tokens(row_updates: torch.Tensor | None, vocab_size: int) -> torch.Tensor:
    """Ids < vocab_size whose row was never updated (row_updates == 0), ascending."""
    if row_updates is None:
        raise InspectError("the checkpoint has no row_updates.safetensors (only training "
                           "runs record which rows were updated; imported models do not)")
    return torch.nonzero(row_updates[:vocab_size] == 0).flatten()


def position_similarity(position_table: torch.Tensor) -> torch.Tensor:
    """Cosine similarity of every position row with every other, (max_seq_len, max_seq_len)."""
    rows = F.normalize(position_table.float(), dim=1)  # (max_seq_len, C)
    return rows @ rows.T  # (max_seq_len, max_seq_len)


def _format(out: Path) -> str:
    """The figure format ``out``'s suffix names (given explicitly, matplotlib never appends
    a suffix of its own to the path)."""
    suffix = out.suffix.lower()
    if suffix not in FIGURE_SUFFIXES:
        raise InspectError(f"{out}: name a {', '.join(FIGURE_SUFFIXES)} file")
    return suffix[1:]


def plot_positions(similarity: torch.Tensor, out: Path, title: str) -> None:
    """Heatmap of position-row cosine similarity, saved as a 600x500 PNG."""
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(6, 5), dpi=_DPI, layout="constrained")
    image = ax.imshow(similarity.numpy(), cmap="RdBu_r", vmin=-1.0, vmax=1.0,
                      interpolation="nearest")
    ax.set(title=title, xlabel="position", ylabel="position")
    fig.colorbar(image, ax=ax, label="cosine similarity")
    fig.savefig(out, dpi=_DPI, format=_format(out))
    plt.close(fig)


_MAX_LABELS = 64  # more token labels than this are unreadable: label every k-th row


def lookup_figure_size(T: int) -> tuple[int, int]:
    """Pixel (width, height) of the lookup figure: taller for longer texts, up to 1800."""
    return 1200, int(100 * min(18.0, max(3.0, 1.5 + 0.25 * T)))


def plot_lookup(panels: Sequence[tuple[str, torch.Tensor]], labels: Sequence[str],
                out: Path, title: str) -> None:
    """Side-by-side [T x C] heatmaps sharing one colour scale, tokens on the y axis."""
    plt = pyplot()
    width, height = lookup_figure_size(len(labels))
    fig, axes = plt.subplots(1, len(panels), figsize=(width / _DPI, height / _DPI), dpi=_DPI,
                             layout="constrained", sharey=True, squeeze=False)
    limit = max(float(x.abs().max()) for _, x in panels) or 1.0
    images = []
    for ax, (name, x) in zip(axes[0], panels):
        images.append(ax.imshow(x.float().numpy(), cmap="RdBu_r", vmin=-limit, vmax=limit,
                                aspect="auto", interpolation="nearest"))
        ax.set(title=name, xlabel="C")
    every = -(-len(labels) // _MAX_LABELS)  # ceil
    rows = range(0, len(labels), every)
    axes[0][0].set_yticks(rows, [labels[t] for t in rows], fontsize=8)
    fig.suptitle(title)
    fig.colorbar(images[0], ax=axes[0].tolist(), label="value")
    fig.savefig(out, dpi=_DPI, format=_format(out))
    plt.close(fig)


def _cmd_neighbors(model: LoadedModel, args: argparse.Namespace) -> None:
    m, tok = model.checkpoint.manifest, model.tokenizer
    if args.id is not None:
        token_id = args.id
        if token_id >= m.vocab_size:  # the rule checked >= 0; the limit is the model's
            padding = " (a padding row, never a token)" if token_id < m.table_rows else ""
            raise InspectError(f"argument --id: must be a token id below the model's "
                               f"vocab_size {m.vocab_size}, got {token_id}{padding}")
    else:
        ids = tok.encode(args.word)
        if len(ids) != 1:
            raise InspectError(f"{args.word!r} is {len(ids)} tokens {ids}, not one; pass a "
                               f"single token (GPT-2 words usually start with a space) or --id")
        token_id = ids[0]
    print(f"nearest to {token_id} {token_string(tok, token_id)} (cosine, rows < {m.vocab_size}):")
    for rank, (i, score) in enumerate(
            nearest_tokens(model.checkpoint.token_table, m.vocab_size, token_id, args.k), 1):
        print(f"{rank:>3} {i:>7} {score:.4f} {token_string(tok, i)}")


def _cmd_positions(model: LoadedModel, args: argparse.Namespace) -> None:
    m = model.checkpoint.manifest
    table = model.position_table
    if table is None:
        raise InspectError(f"position is {m.position!r} (RoPE): the model has no position table")
    plot_positions(position_similarity(table), args.out,
                   f"position table cosine similarity ({m.position}, {m.max_seq_len} x {m.dim})")
    print(f"wrote {args.out}")


def _cmd_lookup(model: LoadedModel, args: argparse.Namespace) -> None:
    m, tok = model.checkpoint.manifest, model.tokenizer
    ids = tok.encode(args.text)
    T, start = len(ids), args.start_position
    if T == 0 or start + T > m.max_seq_len:
        raise InspectError(f"text is {T} tokens from position {start}; need 1 <= "
                           f"start_position + T <= max_seq_len {m.max_seq_len}")
    token_rows = model.checkpoint.token_table[ids].float()  # (T, C)
    panels = [("token rows", token_rows)]
    table = model.position_table
    if table is not None:
        position_rows = table[start:start + T].float()  # (T, C)
        panels += [("position rows", position_rows), ("sum", token_rows + position_rows)]
    labels = [f"{start + t}: {token_string(tok, i)}" for t, i in enumerate(ids)]
    plot_lookup(panels, labels, args.out, f"lookup of {T} tokens ({m.position} positions)")
    print(f"wrote {args.out} (T={T}, C={m.dim})")


def _cmd_untrained(model: LoadedModel, args: argparse.Namespace) -> None:
    m = model.checkpoint.manifest
    ids = untrained_tokens(model.checkpoint.row_updates, m.vocab_size)
    print(f"{len(ids)} of {m.vocab_size} token rows were never updated in training")
    for i in ids[: args.limit].tolist():
        print(f"{i:>7} {token_string(model.tokenizer, i)}")
    if len(ids) > args.limit:
        print(f"... {len(ids) - args.limit} more (--limit)")


_COMMANDS = {"neighbors": _cmd_neighbors, "positions": _cmd_positions, "lookup": _cmd_lookup,
             "untrained": _cmd_untrained}


_OUT = flags.output_file(FIGURE_SUFFIXES)
RULES: dict[str, flags.Rule] = {
    "model_repository": flags.input_dir(convert=Path),
    "model": flags.model_name(),
    "version": flags.integer(1, what="a version", note="default: the newest"),
    "word": flags.text("text that is exactly one token"),
    "id": flags.integer(0, what="a token id"),
    "k": flags.integer(1, what="a number of tokens"),
    "out": _OUT,
    "text": flags.text(),
    "start_position": flags.integer(0, what="a position"),
    "limit": flags.integer(0, what="a number of ids to list"),
}
RELATIONS = (flags.one_of("word", "id", names=("WORD", "--id")),)


def _parser() -> argparse.ArgumentParser:
    p = flags.OneLineParser(prog=PROG, description=__doc__,
                            formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model-repository", type=Path, default=Path("models"), metavar="DIR",
                   help="the repository holding <model>/<version>/ (default models)")
    p.add_argument("--model", required=True, metavar="NAME",
                   help="the model to inspect: a folder name under --model-repository")
    p.add_argument("--version", metavar="N",
                   help="a version of it, an integer >= 1 (default: the newest)")
    sub = p.add_subparsers(dest="command", required=True, metavar="COMMAND")
    s = sub.add_parser("neighbors", help="nearest tokens by cosine similarity")
    s.add_argument("word", nargs="?", metavar="WORD", help="text that is exactly one token")
    s.add_argument("--id", metavar="ID", help="a token id instead of WORD, below the "
                   "model's vocab_size")
    s.add_argument("--k", default=10, metavar="K", help="how many neighbours, >= 1 (default 10)")
    figure = f"the figure to write, at exactly this path ({', '.join(FIGURE_SUFFIXES)})"
    s = sub.add_parser("positions", help="position-table cosine-similarity heatmap")
    s.add_argument("--out", type=Path, default=Path("positions.png"), metavar="FILE",
                   help=f"{figure}; default positions.png")
    s = sub.add_parser("lookup", help="token, position and summed rows for a text")
    s.add_argument("text", metavar="TEXT", help="the text to look up")
    s.add_argument("--start-position", default=0, metavar="P",
                   help="position of its first token, >= 0 (default 0)")
    s.add_argument("--out", type=Path, default=Path("lookup.png"), metavar="FILE",
                   help=f"{figure}; default lookup.png")
    s = sub.add_parser("untrained", help="token rows never updated in training")
    s.add_argument("--limit", default=20, metavar="N", help="how many ids to list, >= 0 "
                   "(default 20)")
    flags.install(p, RULES)
    return p


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    """The command line, checked: each option by its rule, WORD or --id, the repository
    and --out's directory. A mistake exits with status 2 and one line."""
    return flags.parse(_parser(), RULES, argv, RELATIONS)


def main(argv: Sequence[str] | None = None) -> int:
    """CLI entry point; returns the exit status (2 with a message when it cannot answer)."""
    args = parse_args(argv)
    try:
        model = load_model(args.model_repository, args.model, args.version)
        _COMMANDS[args.command](model, args)
    except (InspectError, CheckpointError, PlotsUnavailable) as e:
        print(f"{PROG}: error: {e}", file=sys.stderr)
        return 2
    except OSError as e:  # e.g. --out's directory became read-only after the check
        where = f"{e.filename}: " if e.filename else ""
        print(f"{PROG}: error: {where}{e.strerror or e}", file=sys.stderr)
        return 2
    except Exception as e:  # a bug: its traceback to a file, one line here
        return internal_error(PROG, e)
    return 0


if __name__ == "__main__":
    sys.exit(main())

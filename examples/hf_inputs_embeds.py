"""Feed this service's embeddings to Hugging Face GPT-2 as ``inputs_embeds``.

HF ``GPT2Model.forward`` computes ``hidden = inputs_embeds + wpe(position_ids)``: it adds
the position rows itself. So the request is ``compose="token"`` (token rows only), and
when the sequence does not start at position 0 the same offset goes to both sides:
``start_position=s`` to this service, ``position_ids = s .. s+T-1`` to HF. With that, the
logits equal those HF computes from ``input_ids`` bit for bit in float32.

Without ``--target`` the script builds everything itself, offline: a small random
``GPT2LMHeadModel`` saved with ``save_pretrained``, imported with
``python -m training.importers hf-gpt2``, and served on a free port in this process.

    python examples/hf_inputs_embeds.py --text "hello world" --start-position 5
    python examples/hf_inputs_embeds.py --target 127.0.0.1:50051 --hf-dir ./gpt2 --model gpt2
"""

from __future__ import annotations

import argparse
import contextlib
import sys
import tempfile
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from client import EmbeddingClient, EmbeddingError, flags
from client.grammar import TARGET, UINT32_MAX
from service.local import start_local

if __name__ == "__main__":  # run as a script: its package importable, as with -m
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from examples.command import Command, Option

__all__ = [
    "COMMAND",
    "TEXT_OPTION",
    "HFInputs",
    "Report",
    "build_hf_gpt2",
    "build_parser",
    "compare",
    "fetch_inputs",
    "import_hf_gpt2",
    "lacks_transformers",
    "load_hf_gpt2",
    "logits_both_ways",
    "main",
    "parse_args",
    "random_gpt2",
    "run_example",
]


@dataclass(frozen=True)
class HFInputs:
    """What HF's forward takes, built from one Embed response."""

    input_ids: torch.Tensor  # (1, T) int64: the ids the service tokenized
    inputs_embeds: torch.Tensor  # (1, T, C) float32: token rows only
    position_ids: torch.Tensor  # (1, T) int64: start_position .. start_position+T-1


def build_hf_gpt2(out_dir: Path, seed: int = 0, n_embd: int = 32, n_layer: int = 2,
                  n_head: int = 4, n_positions: int = 64) -> Any:
    """A random-init ``GPT2LMHeadModel`` with GPT-2's vocabulary, saved as safetensors."""
    import transformers  # here, not at import: the module docstring and --help stay cheap

    torch.manual_seed(seed)
    config = transformers.GPT2Config(vocab_size=50257, n_positions=n_positions,
                                     n_embd=n_embd, n_layer=n_layer, n_head=n_head)
    model = transformers.GPT2LMHeadModel(config).eval()
    model.save_pretrained(out_dir, safe_serialization=True)
    return model


def import_hf_gpt2(hf_dir: Path, repository: Path, name: str) -> Path:
    """Import the saved model's wte/wpe as version 1 of ``name`` (the CLI importer's code)."""
    from training.importers import main as import_main

    out = repository / name / "1"
    if import_main(["hf-gpt2", str(hf_dir), "--out", str(out)]) != 0:
        raise RuntimeError(f"import of {hf_dir} failed (see stderr)")
    return out


@contextlib.contextmanager
def random_gpt2(name: str, seed: int = 0, **sizes: int) -> Iterator[tuple[Any, Path]]:
    """A random GPT-2 (``build_hf_gpt2``'s, of ``sizes``) saved in a temporary directory, its
    tables imported as version 1 of ``name`` into a repository beside it: (the model, the
    repository), both removed on exit."""
    with tempfile.TemporaryDirectory(prefix=f"{name}-") as tmp:
        hf_dir, repository = Path(tmp) / "hf", Path(tmp) / "models"
        model = build_hf_gpt2(hf_dir, seed=seed, **sizes)
        import_hf_gpt2(hf_dir, repository, name)
        yield model, repository


def fetch_inputs(client: EmbeddingClient, text: str, *, model: str = "",
                 start_position: int = 0) -> HFInputs:
    """Ask the service for token rows and build HF's three tensors from the answer."""
    e = client.embed(text, model=model, compose="token", dtype="float32",
                     start_position=start_position)
    T = len(e.token_ids)
    # The array is a read-only view of the response bytes; torch wants writable memory.
    inputs_embeds = torch.from_numpy(e.array.copy()).unsqueeze(0)  # (1, T, C)
    position_ids = torch.arange(e.start_position, e.start_position + T).unsqueeze(0)  # (1, T)
    return HFInputs(torch.tensor([e.token_ids]), inputs_embeds, position_ids)


@torch.inference_mode()
def logits_both_ways(model: Any, inputs: HFInputs) -> tuple[torch.Tensor, torch.Tensor]:
    """(logits from input_ids, logits from inputs_embeds), each (1, T, vocab_size)."""
    from_ids = model(input_ids=inputs.input_ids, position_ids=inputs.position_ids).logits
    from_embeds = model(inputs_embeds=inputs.inputs_embeds,
                        position_ids=inputs.position_ids).logits
    return from_ids, from_embeds


def load_hf_gpt2(hf_dir: Path) -> Any:
    """A saved ``GPT2LMHeadModel`` from ``hf_dir``, offline, in eval mode."""
    import transformers

    return transformers.GPT2LMHeadModel.from_pretrained(hf_dir, local_files_only=True).eval()


def _report(model: Any, client: EmbeddingClient, text: str, name: str, start: int) -> bool:
    inputs = fetch_inputs(client, text, model=name, start_position=start)
    from_ids, from_embeds = logits_both_ways(model, inputs)
    same = torch.equal(from_ids, from_embeds)
    T, C = inputs.inputs_embeds.shape[1:]
    print(f"token_ids {inputs.input_ids[0].tolist()}  inputs_embeds ({T}, {C}) float32  "
          f"position_ids {start}..{start + T - 1}")
    print(f"logits from input_ids vs inputs_embeds: "
          f"{'bit-identical' if same else 'DIFFERENT'} {tuple(from_ids.shape)}")
    # The mistake this example exists to prevent: the default compose already holds wpe.
    wrong = client.embed(text, model=name, start_position=start).array.copy()
    bad = dict(vars(inputs), inputs_embeds=torch.from_numpy(wrong).unsqueeze(0))
    twice = logits_both_ways(model, HFInputs(**bad))[1]
    print(f"with compose=token+position (positions added twice): max |diff| "
          f"{(twice - from_ids).abs().max().item():.3g}")
    return same


PROG = "python examples/hf_inputs_embeds.py"


def _hf_dir(path: Path) -> str | None:
    if not path.is_dir():
        return "no such directory" if not path.exists() else "is not a directory"
    if not (path / "config.json").is_file():
        return "holds no config.json: give the directory save_pretrained wrote"
    return None


# The text the examples embed by default, and its option (vllm_prompt_embeds.py's too).
TEXT_OPTION = Option(flags.text(), "the text to embed",
                     default="Input embeddings are what the first block reads.")
COMMAND = Command(
    PROG, "Embedding-service output as HF GPT-2 inputs_embeds: same logits as input_ids, bit "
          "for bit (float32). Without --target: a random GPT-2 built, imported and served "
          "here, offline.", {
        "text": TEXT_OPTION,
        "start_position": Option(flags.integer(0, UINT32_MAX, what="a position"),
                                 "position of the first token (sent as start_position and as "
                                 "HF position_ids; default 7)", default=7, metavar="P"),
        "target": Option(TARGET, "a running service; default: build a random model and serve "
                         "it here", metavar="HOST:PORT"),
        "hf_dir": Option(flags.Rule("a Hugging Face GPT-2 directory", Path,
                                    lambda v: bool(str(v)), _hf_dir),
                         "with --target: the saved HF GPT-2 whose tables it serves",
                         metavar="DIR"),
        "model": Option(flags.model_name(), "model name in the repository (default hf-gpt2)",
                        default="hf-gpt2"),
        "seed": Option(flags.integer(0, 2**32 - 1),
                       "random init of the local model (default 0)", default=0),
    }, (
        flags.needs("target", "hf_dir", "the saved HF GPT-2 whose tables that service serves"),
        flags.needs("hf_dir", "target", "the running service serving its tables"),
        flags.conflicts("seed", "target", "--seed initialises the local random model; with "
                        "--target the model is --hf-dir's"),
    ))
build_parser, parse_args = COMMAND.build_parser, COMMAND.parse_args


def lacks_transformers(prog: str) -> bool:
    """True, said in one line on stderr, where transformers is not installed (the `make run`
    environment has none): the examples that run a HF model need it."""
    try:
        import transformers  # noqa: F401  (the HF side of the comparison)
    except ImportError:
        print(f"{prog}: needs transformers, which `make setup` installs; in the `make run` "
              f"environment: .venv/bin/pip install transformers==5.24.0", file=sys.stderr)
        return True
    return False


def run_example(prog: str, args: argparse.Namespace,
                body: Callable[[argparse.Namespace], int]) -> int:
    """An example that runs a HF model beside the service: without transformers, one line
    and status 2; else ``body(args)``, whose service refusal (or why there was none) is one
    line and status 1, and a bug one line naming its log."""
    if lacks_transformers(prog):
        return 2
    try:
        return body(args)
    except EmbeddingError as e:  # the service's answer, or why there was none
        print(f"{prog}: {args.target or 'the local server'}: {e}", file=sys.stderr)
        return 1
    except Exception as e:  # a bug: its traceback to a file, one line here
        return flags.internal_error(prog, e)


def main(argv: Sequence[str] | None = None) -> int:
    """Run the comparison; exit status 0 when the logits are bit-identical."""
    return run_example(PROG, parse_args(argv), _main)


Report = Callable[[Any, EmbeddingClient, str, str, int], bool]


def compare(prog: str, args: argparse.Namespace, report: Report,
            serve: Callable[[Path, str], contextlib.AbstractContextManager[str]]) -> int:
    """``report(model, client, text, model name, start position)``'s verdict as the exit
    status (0: the same logits both ways): with --target, of --hf-dir's model against that
    service; else of a random GPT-2 whose tables ``serve(repository, name)`` serves, at the
    target it yields. An --hf-dir transformers cannot load is one line and status 2."""
    with contextlib.ExitStack() as stack:
        if args.target is not None:
            try:
                model = load_hf_gpt2(args.hf_dir)
            except (OSError, ValueError) as e:  # its own words, first line only
                print(f"{prog}: error: --hf-dir {args.hf_dir}: not a GPT-2 transformers "
                      f"loads ({str(e).strip().splitlines()[0]})", file=sys.stderr)
                return 2
            target = args.target
        else:
            model, repository = stack.enter_context(random_gpt2(args.model, seed=args.seed))
            target = stack.enter_context(serve(repository, args.model))
        client = stack.enter_context(EmbeddingClient(target, timeout=30))
        same = report(model, client, args.text, args.model, args.start_position)
    return 0 if same else 1


@contextlib.contextmanager
def _served_here(repository: Path, name: str) -> Iterator[str]:
    with start_local(repository, name) as server:
        yield server.target


def _main(args: argparse.Namespace) -> int:
    return compare(PROG, args, _report, _served_here)


if __name__ == "__main__":
    sys.exit(main())

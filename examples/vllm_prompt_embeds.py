"""Build the exact ``prompt_embeds`` object vLLM takes, from this service's output.

vLLM (``vllm.inputs.EmbedsPrompt``, https://docs.vllm.ai/en/stable/features/prompt_embeds/)
takes ``{"prompt_embeds": tensor}`` with ``tensor`` a torch tensor of shape
``(sequence_length, hidden_size)``; the engine must be started with
``LLM(model=..., enable_prompt_embeds=True)`` (``vllm serve --enable-prompt-embeds`` for
the OpenAI server, whose Completions API takes the tensor ``torch.save``-d and base64
encoded in a ``"prompt_embeds"`` field). What to ask this service for:

- ``compose="token"``: vLLM's GPT-2 computes ``inputs_embeds + wpe(positions)`` itself
  (``vllm/model_executor/models/gpt2.py``), and vLLM numbers the prompt's positions from
  0, so ``start_position`` stays 0. For RoPE models (Llama) the token rows are all there
  is: any compose but ``"position"`` gives the same rows.
- ``dtype`` = the dtype vLLM runs the model in (``LLM(..., dtype="bfloat16")``): the rows
  are then exactly what vLLM's own embedding lookup would produce, with nothing to cast.

vLLM itself is not run here (it needs a GPU and is not installed); this script builds the
request objects and checks them against the served table. Without ``--target`` it builds
a small random HF GPT-2, imports its tables and serves them in this process, offline.

    python examples/vllm_prompt_embeds.py --text "hello world" --dtype bfloat16
"""

from __future__ import annotations

import argparse
import base64
import io
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch

from client import EmbeddingClient, flags
from client.codec import Embedding
from client.grammar import TARGET
from service.local import start_local

if __name__ == "__main__":  # run as a script: its package importable, as with -m
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from examples.command import Command, Option
from examples.hf_inputs_embeds import TEXT_OPTION, random_gpt2, run_example

__all__ = ["COMMAND", "TORCH_DTYPES", "build_parser", "completions_body",
           "embeds_prompt", "main", "parse_args", "to_torch"]

TORCH_DTYPES = {"float32": torch.float32, "float16": torch.float16,
                "bfloat16": torch.bfloat16}


def to_torch(e: Embedding) -> torch.Tensor:
    """The response as a (T, C) torch tensor in the wire dtype, bits unchanged.

    bfloat16 needs a client made with ``raw_bfloat16=True``: the array is then the raw
    uint16 bits, viewed (not converted) as torch.bfloat16.
    """
    if e.wire_dtype == "bfloat16":
        if e.array.dtype != np.uint16:
            raise ValueError("bfloat16 response was widened to float32: use raw_bfloat16=True")
        bits = torch.from_numpy(e.array.view(np.int16).copy())  # (T, C); copy: read-only view
        return bits.view(torch.bfloat16)  # same bits, now typed as bfloat16
    return torch.from_numpy(e.array.copy())  # (T, C) float32 or float16


def embeds_prompt(client: EmbeddingClient, text: str, *, model: str = "",
                  dtype: str = "bfloat16") -> dict[str, Any]:
    """``vllm.inputs.EmbedsPrompt`` for ``text``: ``{"prompt_embeds": (T, hidden_size)}``."""
    e = client.embed(text, model=model, compose="token", dtype=dtype, start_position=0)
    tensor = to_torch(e)
    if tensor.dtype != TORCH_DTYPES[dtype] or tensor.shape != (len(e.token_ids),
                                                               e.array.shape[1]):
        raise AssertionError(f"got {tensor.dtype} {tuple(tensor.shape)}")
    return {"prompt_embeds": tensor}


def completions_body(prompt: dict[str, Any], model: str, max_tokens: int = 16
                     ) -> dict[str, Any]:
    """The JSON body for vLLM's OpenAI ``/v1/completions`` with ``--enable-prompt-embeds``.

    vLLM reads the field with ``torch.load(BytesIO(b64decode(...)), weights_only=True)``.
    """
    buffer = io.BytesIO()
    torch.save(prompt["prompt_embeds"], buffer)
    return {"model": model, "prompt_embeds": base64.b64encode(buffer.getvalue()).decode(),
            "max_tokens": max_tokens}


def _show(client: EmbeddingClient, text: str, model: str, dtype: str) -> None:
    prompt = embeds_prompt(client, text, model=model, dtype=dtype)
    t = prompt["prompt_embeds"]
    body = completions_body(prompt, model=model or "<served model name>")
    print(f"prompt_embeds {tuple(t.shape)} {t.dtype} (T, hidden_size)")
    print(f'offline: LLM(model=DIR, dtype="{dtype}", enable_prompt_embeds=True)'
          f".generate({{'prompt_embeds': tensor}})")
    print(f"online:  POST /v1/completions {{'model': ..., 'prompt_embeds': "
          f"<{len(body['prompt_embeds'])} base64 chars>, 'max_tokens': 16}}")


PROG = "python examples/vllm_prompt_embeds.py"
COMMAND = Command(
    PROG, "Build vLLM's prompt_embeds from the embedding service (token rows, the model's "
          "dtype). vLLM itself is not run. Without --target: a random GPT-2's tables served "
          "here, offline.", {
        "text": TEXT_OPTION,
        "dtype": Option(flags.choice(*sorted(TORCH_DTYPES)),
                        "the dtype vLLM runs the model in (default bfloat16)",
                        default="bfloat16",
                        metavar="{" + ",".join(sorted(TORCH_DTYPES)) + "}"),
        "target": Option(TARGET, "a running service; default: serve a random GPT-2's tables "
                         "here", metavar="HOST:PORT"),
        "model": Option(flags.model_name(empty="the server's default model"),
                        "with --target: the model name (default: the server's default "
                        "model)"),
    }, (flags.needs("model", "target", "the local demo serves one model, gpt2"),))
build_parser, parse_args = COMMAND.build_parser, COMMAND.parse_args


def main(argv: Sequence[str] | None = None) -> int:
    """Build and print the request objects (vLLM is not called)."""
    return run_example(PROG, parse_args(argv), _main)


def _main(args: argparse.Namespace) -> int:
    if args.target is not None:
        with EmbeddingClient(args.target, timeout=30, raw_bfloat16=True) as client:
            _show(client, args.text, args.model or "", args.dtype)
        return 0
    # A small random GPT-2, the directory vLLM would load, its tables served here.
    with random_gpt2("gpt2", n_embd=64, n_layer=1) as (_, repository), \
            start_local(repository, "gpt2") as server, \
            EmbeddingClient(server.target, timeout=30, raw_bfloat16=True) as client:
        _show(client, args.text, "gpt2", args.dtype)
    return 0


if __name__ == "__main__":
    sys.exit(main())

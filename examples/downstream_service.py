"""A downstream transformer service that gets its input embeddings from this service.

The split: the embedding service holds the two tables (``wte``, ``wpe``) and serves
``token_table[ids] + position_table[0..T-1]`` (the default ``compose="token+position"``,
exactly what a nanoGPT-style first block reads). This downstream service holds the rest
of the same trained LM (``model.safetensors`` of the same checkpoint version: blocks,
``ln_f``, head) and returns next-token logits, as if it ran the whole model itself.

It is a ``grpc.aio`` server with one generic method, ``/downstream.v1.NextToken/Predict``,
whose messages are JSON (no .proto to compile): ``{"text": "..."}`` in, and out
``{"token_ids", "next_token_id", "logits_b64" (little-endian float32 [vocab_size]),
"model", "version", "checkpoint_id"}``. Two rules it shows:

- **Pin the version.** It asks for the exact ``model``/``version`` whose blocks it holds
  and checks the response's ``checkpoint_id`` (sha256 of that version's manifest): a hot
  reload of a newer version on the embedding side must not feed old blocks new tables.
- **Keep torch off the event loop.** The forward runs in a worker thread
  (``asyncio.to_thread``) so other requests keep flowing while one computes.

Without arguments it trains a tiny model for a few steps (offline, on a few sentences),
exports it with ``training/export.py``, serves the tables here, starts the downstream
service and asks it for the next token. ``--checkpoint DIR --target HOST:PORT --port N``
serves a real checkpoint against a running embedding service instead.

    python examples/downstream_service.py --text "The cat walks to the"
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import contextlib
import json
import sys
import tempfile
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc
import grpc.aio
import numpy as np
import torch
from torch import nn

from client import AsyncEmbeddingClient, EmbeddingError, flags
from client.grammar import TARGET
from service.format.checkpoint import verify_checkpoint
from service.format.manifest import EMBEDDINGS_FILE, MODEL_FILE
from service.format.tensorfile import CheckpointError, read_safetensors
from service.local import start_local
from service.preflight import bind_refusal
from training.model import GPT, ModelConfig

if __name__ == "__main__":  # run as a script: its package importable, as with -m
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from examples.command import Command, Option

__all__ = ["COMMAND", "METHOD", "Prediction", "RestOfGPT", "build_parser",
           "downstream_server", "main", "parse_args", "predict", "train_demo_checkpoint"]

SERVICE = "downstream.v1.NextToken"
METHOD = f"/{SERVICE}/Predict"


class RestOfGPT(nn.Module):
    """Everything of a training.model.GPT after its input tables: blocks, ln_f, head."""

    def __init__(self, version_dir: Path) -> None:
        super().__init__()
        manifest, self.checkpoint_id = verify_checkpoint(version_dir)  # every sha256
        self.model, self.version = version_dir.parent.name, int(version_dir.name)
        self.vocab_size = manifest.vocab_size
        c = manifest.provenance.get("config")  # the TrainConfig that export recorded
        if not isinstance(c, dict) or not (version_dir / MODEL_FILE).is_file():
            raise ValueError(f"{version_dir}: not a version exported by python -m training "
                             f"(no {MODEL_FILE} and training config): the downstream "
                             f"service runs the rest of that trained LM")
        cfg = ModelConfig(vocab_size=manifest.vocab_size, table_rows=manifest.table_rows,
                          block_size=manifest.max_seq_len, n_layer=c["n_layer"],
                          n_head=c["n_head"], n_embd=manifest.dim, position=manifest.position,
                          tie_weights=c["tie_weights"])
        gpt = GPT(cfg)
        rest = read_safetensors(version_dir / MODEL_FILE)
        if cfg.tie_weights:
            # A tied head IS the token table, which export stores once, with the tables.
            rest["lm_head.weight"] = read_safetensors(version_dir / EMBEDDINGS_FILE)[
                "token_embedding"]
        missing, unexpected = gpt.load_state_dict(rest, strict=False)
        if unexpected or not set(missing) <= {"wte.weight", "wpe.weight"}:
            raise ValueError(f"{version_dir / MODEL_FILE}: missing {missing}, "
                             f"unexpected {unexpected}")
        # Keep only what runs after the first block's input; the tables are not held here.
        self.drop, self.blocks, self.ln_f, self.lm_head = gpt.drop, gpt.blocks, gpt.ln_f, \
            gpt.lm_head
        self.rope = ((gpt.rope_cos, gpt.rope_sin) if isinstance(gpt.rope_cos, torch.Tensor)
                     and isinstance(gpt.rope_sin, torch.Tensor) else None)
        self.eval()

    @torch.inference_mode()
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """First-block input (B, T, C) -> logits (B, T, table_rows); GPT.forward's steps."""
        x = self.drop(x)  # (B, T, C)
        for block in self.blocks:
            x = block(x, self.rope)  # (B, T, C)
        return self.lm_head(self.ln_f(x))  # (B, T, table_rows)

    def next_token_logits(self, x: torch.Tensor) -> torch.Tensor:
        """(T, C) -> (vocab_size,): the last position; padding rows are never tokens."""
        return self.forward(x.unsqueeze(0))[0, -1, :self.vocab_size]


class _Handler:
    """The Predict method: text -> embedding service -> the rest of the LM -> logits."""

    def __init__(self, rest: RestOfGPT, embeddings: AsyncEmbeddingClient) -> None:
        self.rest, self.embeddings = rest, embeddings

    async def predict(self, request: dict[str, Any], context: grpc.aio.ServicerContext
                      ) -> dict[str, Any]:
        text = request.get("text")
        if not isinstance(text, str) or not text:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, "text: a non-empty string")
        try:
            e = await self.embeddings.embed(text, model=self.rest.model,
                                            version=self.rest.version,
                                            compose="token+position", dtype="float32")
        except EmbeddingError as err:  # pass the embedding service's verdict on
            await context.abort(err.code, f"embedding service: {err.details}")
        if e.checkpoint_id != self.rest.checkpoint_id:
            await context.abort(grpc.StatusCode.FAILED_PRECONDITION,
                                f"embedding service serves checkpoint {e.checkpoint_id[:12]}, "
                                f"blocks are from {self.rest.checkpoint_id[:12]}")
        x = torch.from_numpy(e.array.copy())  # (T, C); copy: the array is read-only
        logits = await asyncio.to_thread(self.rest.next_token_logits, x)  # (vocab_size,)
        return {"token_ids": e.token_ids, "next_token_id": int(logits.argmax()),
                "logits_b64": base64.b64encode(logits.numpy().astype("<f4").tobytes()).decode(),
                "model": e.model, "version": e.version, "checkpoint_id": e.checkpoint_id}


def _json_bytes(message: dict[str, Any]) -> bytes:
    return json.dumps(message).encode()


@contextlib.asynccontextmanager
async def downstream_server(rest: RestOfGPT, embedding_target: str, port: int = 0,
                            host: str = "127.0.0.1") -> AsyncIterator[str]:
    """Run the downstream service on this event loop; yields its ``host:port``."""
    async with AsyncEmbeddingClient(embedding_target, timeout=30) as embeddings:
        handler = _Handler(rest, embeddings)
        method = grpc.unary_unary_rpc_method_handler(
            handler.predict, request_deserializer=json.loads,
            response_serializer=_json_bytes)
        server = grpc.aio.server()
        server.add_generic_rpc_handlers(
            (grpc.method_handlers_generic_handler(SERVICE, {"Predict": method}),))
        bound = server.add_insecure_port(f"{host}:{port}")
        await server.start()
        try:
            yield f"{host}:{bound}"
        finally:
            await server.stop(grace=1.0)


@dataclass(frozen=True)
class Prediction:
    """A decoded Predict response."""

    token_ids: list[int]
    next_token_id: int
    logits: np.ndarray  # (vocab_size,) float32
    model: str
    version: int
    checkpoint_id: str


async def predict(channel: grpc.aio.Channel, text: str, timeout: float = 30) -> Prediction:
    """Call Predict over ``channel`` (any grpc.aio channel to the downstream service)."""
    call = channel.unary_unary(METHOD, request_serializer=_json_bytes,
                               response_deserializer=json.loads)
    r = await call({"text": text}, timeout=timeout)
    logits = np.frombuffer(base64.b64decode(r["logits_b64"]), dtype="<f4")
    return Prediction(r["token_ids"], r["next_token_id"], logits, r["model"], r["version"],
                      r["checkpoint_id"])


_SENTENCES = [f"The {a} walks to the {p}. The {a} sleeps in the {p}."
              for a in ("cat", "dog", "bird", "horse") for p in ("garden", "river", "barn")]


def train_demo_checkpoint(repository: Path, name: str = "nano", steps: int = 40,
                          tie_weights: bool = True, seed: int = 7) -> tuple[Path, GPT]:
    """Train a tiny GPT for a few steps, export it with training.export.

    Returns the version directory and the trained model (the whole-model reference).
    """
    from service.format.tokenizer import default_ranks_path, gpt2_spec, load_tokenizer
    from training.config import TrainConfig
    from training.data import load_tokens
    from training.export import export_model
    from training.train import train

    work = repository.parent / f".{name}-training"
    corpus = work / "corpus.txt"
    corpus.parent.mkdir(parents=True, exist_ok=True)
    corpus.write_text("\n".join(_SENTENCES * 20) + "\n")
    cfg = TrainConfig(data=(str(corpus),), n_layer=2, n_head=2, n_embd=32, block_size=32,
                      batch_size=4, max_steps=steps, warmup_steps=2, lr=1e-2,
                      eval_every=steps, eval_tokens=256, seed=seed, device="cpu", threads=1,
                      tie_weights=tie_weights, cache_dir=str(work / "cache"),
                      out_repository=str(repository), name=name,
                      runs_dir=str(work / "runs"), progress=False)
    spec, ranks = gpt2_spec(), default_ranks_path()
    tokenizer = load_tokenizer(spec, ranks)
    data = load_tokens(cfg.data, tokenizer, Path(cfg.cache_dir), cfg.val_fraction,
                       progress=False)
    result = train(cfg, tokenizer, data)
    version_dir, _ = export_model(result, cfg, spec, ranks, tokenizer.n_vocab)
    return version_dir, result.model.eval()


async def _ask(rest: RestOfGPT, embedding_target: str, text: str) -> Prediction:
    async with downstream_server(rest, embedding_target) as target, \
            grpc.aio.insecure_channel(target) as channel:
        return await predict(channel, text)


async def _serve(rest: RestOfGPT, embedding_target: str, port: int) -> None:
    async with downstream_server(rest, embedding_target, port=port) as target:
        print(f"downstream service on {target} ({METHOD}); Ctrl-C stops it", flush=True)
        await asyncio.Event().wait()


PROG = "python examples/downstream_service.py"


def _version_dir(path: Path) -> str | None:
    if not path.is_dir():
        return "no such directory" if not path.exists() else "is not a directory"
    if not (path / MODEL_FILE).is_file():
        return (f"holds no {MODEL_FILE}: give a version directory models/<model>/<N> "
                f"exported by python -m training")
    return None


COMMAND = Command(
    PROG, "A downstream gRPC service: input embeddings from the embedding service, the rest "
          "of the LM here, next-token logits out. Without --checkpoint: a demo that trains a "
          "tiny model and asks it once.", {
        "text": Option(flags.text(), "the text to continue (demo)",
                       default="The cat walks to the"),
        "checkpoint": Option(flags.Rule("a version directory models/<model>/<N>", Path,
                                        lambda v: bool(str(v)), _version_dir),
                             "serve: a version dir models/<model>/<N> with model.safetensors",
                             metavar="DIR"),
        "target": Option(TARGET, "serve: the embedding service serving that version",
                         metavar="HOST:PORT"),
        "port": Option(flags.port(zero="picks a free port"),
                       "serve: downstream port (default 50061; 0 picks a free one)",
                       default=50061),
    }, (
        flags.needs("checkpoint", "target", "the embedding service serving that version"),
        flags.needs("target", "checkpoint", "the version whose blocks run here"),
        flags.needs("port", "checkpoint", "the port is the served downstream service's; the "
                    "demo picks a free one"),
    ))
build_parser, parse_args = COMMAND.build_parser, COMMAND.parse_args


def main(argv: Sequence[str] | None = None) -> int:
    """Demo (default) or serve (--checkpoint/--target/--port)."""
    args = parse_args(argv)
    try:
        return _main(args)
    except (CheckpointError, ValueError) as e:  # a checkpoint that cannot be served
        print(f"{PROG}: error: {e}", file=sys.stderr)
        return 2
    except Exception as e:  # a bug: its traceback to a file, one line here
        return flags.internal_error(PROG, e)


def _main(args: argparse.Namespace) -> int:
    if args.checkpoint is not None:
        rest = RestOfGPT(args.checkpoint)
        try:
            with contextlib.suppress(KeyboardInterrupt):
                asyncio.run(_serve(rest, args.target, args.port))
        except RuntimeError as e:  # grpc's "Failed to bind": the port is taken
            if "bind" not in str(e).lower():
                raise
            print(f"{PROG}: error: {bind_refusal('--port', '127.0.0.1', args.port, e)}",
                  file=sys.stderr)
            return 2
        return 0

    from service.format.tokenizer import default_ranks_path, gpt2_spec, load_tokenizer

    with tempfile.TemporaryDirectory(prefix="downstream-") as tmp:
        version_dir, _ = train_demo_checkpoint(Path(tmp) / "models")
        rest = RestOfGPT(version_dir)
        with start_local(version_dir.parents[1], rest.model) as server:
            p = asyncio.run(_ask(rest, server.target, args.text))
    tokenizer = load_tokenizer(gpt2_spec(), default_ranks_path())
    print(f"{args.text!r} -> ids {p.token_ids} (model {p.model} v{p.version}, checkpoint "
          f"{p.checkpoint_id[:12]})")
    top = np.argsort(p.logits)[::-1][:3]
    print(f"logits ({p.logits.shape[0]},) float32; top 3: " + ", ".join(
        f"{tokenizer.decode([int(i)])!r} {p.logits[i]:.2f}" for i in top))
    return 0


if __name__ == "__main__":
    sys.exit(main())

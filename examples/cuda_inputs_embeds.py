"""Feed a Hugging Face model on the GPU with this service's rows, straight from GPU memory.

A consumer on the server's node allocates device memory (``client.cuda_shm``), registers it,
and asks for token rows (``compose="token"``: HF GPT-2 adds ``wpe`` itself, see
hf_inputs_embeds.py) into it. The server's GPU gathers them into that memory and answers
once they are there; ``torch.from_dlpack`` makes them a tensor on the device, over the same
memory, which the model takes as ``inputs_embeds``. The rows never pass through host memory,
on either side. The logits equal those the model computes from ``input_ids``, bit for bit.

Without ``--target`` the script builds everything itself, offline: a small random
``GPT2LMHeadModel`` saved with ``save_pretrained``, imported with
``python -m training.importers hf-gpt2``, and served by ``python -m service --device cuda``
in a child process (a CUDA IPC handle cannot be opened by the process that exported it: the
server is another process, as it is in production). Needs a GPU and transformers.

    python examples/cuda_inputs_embeds.py --text "hello world" --start-position 5
    python examples/cuda_inputs_embeds.py --target 127.0.0.1:50051 --hf-dir ./gpt2 --model gpt2
"""

from __future__ import annotations

import argparse
import contextlib
import os
import socket
import subprocess
import sys
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import torch

from client import EmbeddingClient, EmbeddingError
from client.cuda_shm import CudaSharedMemoryRegion

if __name__ == "__main__":  # run as a script: its package importable, as with -m
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from examples import hf_inputs_embeds

__all__ = ["COMMAND", "ServerDidNotStart", "build_parser", "fetch_inputs_on_gpu", "main",
           "parse_args", "serve_on_gpu"]

PROG = "python examples/cuda_inputs_embeds.py"

ROOT = Path(__file__).resolve().parents[1]


def fetch_inputs_on_gpu(client: EmbeddingClient, region: CudaSharedMemoryRegion, text: str,
                        *, model: str = "", start_position: int = 0
                        ) -> hf_inputs_embeds.HFInputs:
    """Token rows for ``text`` written into ``region`` by the server's GPU, and HF's three
    tensors on that GPU: ``inputs_embeds`` is a view of the region, not a copy."""
    e = client.embed(text, model=model, compose="token", dtype="float32",
                     start_position=start_position, cuda_region=region)
    inputs_embeds = torch.from_dlpack(e.rows).unsqueeze(0)  # (1, T, C), in the region
    device = inputs_embeds.device
    T = len(e.token_ids)
    position_ids = torch.arange(e.start_position, e.start_position + T,
                                device=device).unsqueeze(0)  # (1, T)
    return hf_inputs_embeds.HFInputs(torch.tensor([e.token_ids], device=device),
                                     inputs_embeds, position_ids)


class ServerDidNotStart(Exception):
    """The child ``python -m service --device cuda`` exited or did not answer in time."""


@contextlib.contextmanager
def serve_on_gpu(repository: Path, model: str, timeout_s: float = 120.0) -> Iterator[str]:
    """``python -m service --device cuda`` over ``repository`` in a child process, on a
    free loopback port; yields its target once it answers."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = int(s.getsockname()[1])
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(
        p for p in (str(ROOT), os.environ.get("PYTHONPATH")) if p)}
    proc = subprocess.Popen(
        [sys.executable, "-m", "service", "--model-repository", str(repository),
         "--default-model", model, "--host", "127.0.0.1", "--grpc-port", str(port),
         "--http-port", "-1", "--metrics-port", "-1", "--poll-seconds", "0",
         "--device", "cuda"], cwd=ROOT, env=env, stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL)
    target = f"127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + timeout_s
        with EmbeddingClient(target, timeout=5) as probe:
            while True:
                try:
                    probe.list_models()
                    break
                except EmbeddingError:
                    if proc.poll() is not None or time.monotonic() > deadline:
                        raise ServerDidNotStart(
                            f"the local GPU server did not start (exit code {proc.poll()}): "
                            f"python -m service --device cuda on this machine says why") from None
                    time.sleep(0.2)
        yield target
    finally:
        proc.terminate()
        try:
            proc.wait(20)
        except subprocess.TimeoutExpired:
            proc.kill()


@torch.inference_mode()
def _report(model: Any, client: EmbeddingClient, text: str, name: str, start: int) -> bool:
    model = model.to("cuda").eval()
    # room for the longest sequence the model takes, in fp32 rows
    size = model.config.n_positions * model.config.n_embd * 4
    with CudaSharedMemoryRegion("inputs-embeds", size, device_id=0) as region:
        client.register_cuda_shared_memory(region)
        try:
            inputs = fetch_inputs_on_gpu(client, region, text, model=name,
                                         start_position=start)
            embeds = inputs.inputs_embeds
            in_place = embeds.data_ptr() == region.address
            rows = model.transformer.wte.weight[inputs.input_ids[0]]  # (T, C) on the GPU
            exact_rows = torch.equal(embeds[0], rows)
            from_ids = model(input_ids=inputs.input_ids, position_ids=inputs.position_ids).logits
            from_embeds = model(inputs_embeds=embeds, position_ids=inputs.position_ids).logits
            same = torch.equal(from_ids, from_embeds)
        finally:
            client.unregister_cuda_shared_memory(region.name)
    T, C = embeds.shape[1:]
    print(f"token_ids {inputs.input_ids[0].tolist()}  inputs_embeds ({T}, {C}) float32 on "
          f"{embeds.device}, {'in the CUDA region (no copy)' if in_place else 'a COPY'}")
    print(f"rows equal wte[input_ids]: {'bit-identical' if exact_rows else 'DIFFERENT'}")
    print(f"logits from input_ids vs inputs_embeds: {'bit-identical' if same else 'DIFFERENT'}"
          f" {tuple(from_ids.shape)}")
    return in_place and exact_rows and same


# The same options, rules and relations as examples/hf_inputs_embeds.py: all checked before
# the CUDA device is looked for.
COMMAND = hf_inputs_embeds.COMMAND.reworded(
    PROG, "Embedding-service rows written into this process's GPU memory as HF GPT-2 "
          "inputs_embeds: same logits as input_ids, bit for bit (float32). Without --target: "
          "a random GPT-2 built, imported and served by a GPU server started here, offline.",
    text="the text to embed (default: a sentence of its own)",
    start_position="position of the first token, 0..2^32-1 (sent as start_position and as "
                   "HF position_ids; default 7)",
    target="a running service on this node with its tables on a GPU; default: build a "
           "random model and serve it here",
    seed="random init of the local model, 0..2^32-1 (default 0); not with --target")
build_parser, parse_args = COMMAND.build_parser, COMMAND.parse_args


def main(argv: Sequence[str] | None = None) -> int:
    """Run the comparison on the GPU; exit status 0 when rows and logits are bit-identical."""
    return hf_inputs_embeds.run_example(PROG, parse_args(argv), _main)


def _main(args: argparse.Namespace) -> int:
    if not torch.cuda.is_available():
        print(f"{PROG}: needs a CUDA device (torch sees none here): the rows go to GPU "
              f"memory; examples/hf_inputs_embeds.py is the same on CPU", file=sys.stderr)
        return 2
    try:
        return hf_inputs_embeds.compare(PROG, args, _report, serve_on_gpu)
    except ServerDidNotStart as e:
        print(f"{PROG}: {e}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())

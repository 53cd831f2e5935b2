"""What a shared-memory Embed costs end to end: T tokens of fp32 into a registered region,
one client, sequential, against an in-process server on a GPT-2-size random table.

    .venv/bin/python -m bench.shm_cost [--tokens 1024] [--requests 300] [--dim 768]

Prints median and p90 latency and the process's CPU time per request (client and server
share the process) of the shared-memory path and of the same request answered in the
response, so the two (and two builds of the server) can be compared on one machine.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path

import torch

from client import EmbeddingClient
from client.shm import SharedMemoryRegion
from service.config import ServerConfig
from service.format.checkpoint import write_checkpoint
from service.format.tokenizer import default_ranks_path, gpt2_spec
from service.server import start_in_thread

VOCAB = 50257


def _latencies(call: object, n: int) -> list[float]:
    out = []
    for _ in range(n):
        t0 = time.perf_counter()
        call()  # type: ignore[operator]
        out.append(time.perf_counter() - t0)
    return out


def main() -> None:
    """Run the benchmark and print one line per path."""
    p = argparse.ArgumentParser()
    p.add_argument("--tokens", type=int, default=1024)
    p.add_argument("--requests", type=int, default=300)
    p.add_argument("--dim", type=int, default=768)
    args = p.parse_args()
    T, C = args.tokens, args.dim
    with tempfile.TemporaryDirectory() as tmp:
        repo = Path(tmp)
        g = torch.Generator().manual_seed(0)
        write_checkpoint(repo / "gpt2" / "1", token_table=torch.randn(VOCAB, C, generator=g),
                         position_table=torch.randn(T, C, generator=g), position="learned",
                         max_seq_len=T, vocab_size=VOCAB, tokenizer_spec=gpt2_spec(),
                         tokenizer_ranks=default_ranks_path())
        handle = start_in_thread(ServerConfig(model_repository=repo, grpc_port=0, http_port=-1,
                                              metrics_port=-1, poll_seconds=0, device="cpu"))
        ids = torch.randint(0, VOCAB, (T,), generator=g).tolist()
        try:
            with SharedMemoryRegion("bench", T * C * 4) as region, \
                    EmbeddingClient(handle.target) as client:
                client.register_shared_memory(region)
                shm = lambda: client.embed(ids=ids, shm=region)  # noqa: E731
                wire = lambda: client.embed(ids=ids)  # noqa: E731
                for call in (shm, wire):
                    _latencies(call, 30)  # warm-up
                for name, call in (("shm", shm), ("response", wire)):
                    cpu = time.process_time()
                    lat = sorted(_latencies(call, args.requests))
                    cpu = (time.process_time() - cpu) / args.requests
                    print(f"{name:9s} T={T} C={C} fp32: median {statistics.median(lat) * 1e3:.3f} "
                          f"ms, p90 {lat[int(0.9 * len(lat))] * 1e3:.3f} ms, CPU (client + "
                          f"server) {cpu * 1e3:.3f} ms per request ({args.requests} requests)")
                client.unregister_shared_memory("bench")
        finally:
            handle.stop()


if __name__ == "__main__":
    main()

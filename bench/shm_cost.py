"""What a shared-memory Embed costs end to end: T tokens of fp32 into a registered region,
one client, sequential, against an in-process server on a GPT-2-size random table.

    .venv/bin/python -m bench.shm_cost [--tokens 1024] [--requests 300] [--dim 768]

First the write path alone, in a hot loop (p10 and median of 500): the lookup (gather +
fp32 add) stored straight into a MAP_SHARED mapping of a /dev/shm object (the old design,
unsafe: a shrunk object is SIGBUS), against the lookup into a private buffer plus one
``pwrite`` (the design served). Then end to end: median and p90 latency and the process's
CPU time per request (client and server share the process) of the shared-memory path and
of the same request answered in the response.
"""

from __future__ import annotations

import argparse
import mmap
import os
import statistics
import tempfile
import time
from pathlib import Path

import torch

from client import EmbeddingClient
from client.shm import SharedMemoryRegion
from service.config import ServerConfig
from service.format.writer import write_checkpoint
from service.format.tokenizer import default_ranks_path, gpt2_spec
from service.local import start_in_thread

VOCAB = 50257


def _latencies(call: object, n: int) -> list[float]:
    out = []
    for _ in range(n):
        t0 = time.perf_counter()
        call()  # type: ignore[operator]
        out.append(time.perf_counter() - t0)
    return out


def write_path(T: int, C: int, runs: int = 500) -> None:
    """The lookup into a shared mapping vs into private memory + pwrite, in-process."""
    g = torch.Generator().manual_seed(1)
    table, positions = torch.randn(VOCAB, C, generator=g), torch.randn(T, C, generator=g)
    ids = torch.randint(0, VOCAB, (T,), generator=g)
    n = T * C * 4
    path = f"/dev/shm/embed-bench-{os.getpid()}"
    fd = os.open(path, os.O_CREAT | os.O_EXCL | os.O_RDWR, 0o600)
    try:
        os.ftruncate(fd, n)
        mapping = mmap.mmap(fd, n, mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE)
        mapped = torch.frombuffer(mapping, dtype=torch.float32).view(T, C)

        def store() -> None:
            torch.index_select(table, 0, ids, out=mapped)
            mapped.add_(positions)

        rows = torch.empty(T, C)  # reused, as the server reuses its row buffers

        def pwrite() -> None:
            torch.index_select(table, 0, ids, out=rows)
            rows.add_(positions)
            os.fstat(fd)  # the size check the server makes before each write
            os.pwrite(fd, rows.view(-1).view(torch.uint8).numpy().data, 0)

        for name, fn in (("mmap store", store), ("private+pwrite", pwrite)):
            lat = sorted(_latencies(fn, runs))
            print(f"write path {name:15s} T={T} C={C} fp32: p10 {lat[runs // 10] * 1e6:.0f} us, "
                  f"median {statistics.median(lat) * 1e6:.0f} us ({runs} runs)")
    finally:
        os.close(fd)
        os.unlink(path)


def main() -> None:
    """Run the benchmark and print one line per path."""
    p = argparse.ArgumentParser()
    p.add_argument("--tokens", type=int, default=1024)
    p.add_argument("--requests", type=int, default=300)
    p.add_argument("--dim", type=int, default=768)
    args = p.parse_args()
    T, C = args.tokens, args.dim
    torch.set_num_threads(1)  # as the server runs its lookups (--torch-threads 1)
    write_path(T, C)
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

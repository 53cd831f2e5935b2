"""CUDA shared-memory output against host output and against the device's copy ceiling.

    python -m bench.suites.cuda_shm [--seconds 3] [--concurrency 16] [--tokens 1024] [--batch 16]
                             [--out cuda_shm.json]

Issue 39's two targets, on the service with its tables on the GPU (a child process, GPT-2
sized fp32 tables, C=768): one Embed of T tokens per request from ``--concurrency``
clients at once for ``--seconds``,

- **host**: the rows in the response (the device's rows copied to pinned memory, into the
  response bytes, over gRPC);
- **cuda**: the rows into a CUDA region of this process (each client its own slice of one
  region), written by the server's device; the answer carries shape and place only;

their requests/s (target: cuda >= 5x host); then one ``--batch`` x T EmbedBatch into the
region, its device time against a device-to-device copy of the answer's bytes (the copy
ceiling, CUDA events in this process; target >= 0.5): the service's own ``compute_ns``
(the H2D of the ids, the gather+add into the region, the synchronisation) and the device
write alone (``cuda_plan.write_rows`` on the same shape, CUDA events). GB/s count the
bytes the device moves, as bench.gpu_gather does: two row reads and one write for the
lookup, a read and a write for the copy. The cuda rows are checked bit for bit against
the host rows first (exit 1 if they differ).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import grpc
import grpc.aio
import numpy as np
import torch

from bench.harness.checkpoint import MODEL_NAME, VOCAB_SIZE, Shape, ensure_model
from bench.harness.launch import launch_service, stop, wait_serving
from bench.suites.gpu_gather import median_seconds
from client.cuda_shm import CudaSharedMemoryRegion
from genproto.embedding.v1 import embedding_pb2 as pb
from genproto.embedding.v1 import embedding_pb2_grpc as pb_grpc
from service.engine.cuda_plan import write_rows
from service.engine.tables import EmbeddingTables

__all__ = ["main"]

DIM = 768
EMBED = "/embedding.v1.EmbeddingService/Embed"


async def _rate(target: str, requests: list[bytes], seconds: float, channels: int = 4
                ) -> dict[str, float]:
    """Requests/s and p50 of ``len(requests)`` clients, each sending its own request in a
    loop for ``seconds`` (pre-serialised bytes: the clients' own cost stays small)."""
    options = [("grpc.max_receive_message_length", -1), ("grpc.use_local_subchannel_pool", 1)]
    chans = [grpc.aio.insecure_channel(target, options) for _ in range(channels)]
    calls = [c.unary_unary(EMBED) for c in chans]
    latencies: list[float] = []
    stop = time.perf_counter() + seconds

    async def worker(i: int) -> None:
        call, body = calls[i % channels], requests[i]
        await call(body, timeout=60)  # warm
        while time.perf_counter() < stop:
            t0 = time.perf_counter()
            await call(body, timeout=60)
            latencies.append(time.perf_counter() - t0)

    t0 = time.perf_counter()
    await asyncio.gather(*(worker(i) for i in range(len(requests))))
    elapsed = time.perf_counter() - t0
    for c in chans:
        await c.close()
    return {"req_per_s": round(len(latencies) / elapsed, 1),
            "p50_ms": round(statistics.median(latencies) * 1e3, 3)}


def _embed(ids: list[int], region: str | None = None, offset: int = 0) -> pb.EmbedRequest:
    out = None if region is None else pb.SharedMemoryOutput(region=region, offset=offset,
                                                            cuda=True)
    return pb.EmbedRequest(token_ids=pb.TokenIds(ids=ids), model=MODEL_NAME, output=out)


def run(args: argparse.Namespace, target: str) -> dict[str, Any]:
    """Every measurement against the service at ``target``; the figures as a dict."""
    T, B, c = args.tokens, args.batch, args.concurrency
    answer = T * DIM * 4  # bytes of one request's rows, fp32
    gen = torch.Generator().manual_seed(0)
    seqs = [torch.randint(0, VOCAB_SIZE, (T,), generator=gen).tolist()
            for _ in range(max(B, c))]
    result: dict[str, Any] = {"device": torch.cuda.get_device_name(0), "T": T, "C": DIM,
                              "concurrency": c, "batch": B}
    with CudaSharedMemoryRegion("bench", max(B, c) * answer) as region, \
            grpc.insecure_channel(target, [("grpc.max_receive_message_length", -1)]) as ch:
        stub = pb_grpc.EmbeddingServiceStub(ch)
        stub.RegisterCudaSharedMemory(pb.RegisterCudaSharedMemoryRequest(
            region=region.region_message()), timeout=60)
        host = stub.Embed(_embed(seqs[0]), timeout=60).embeddings.data
        stub.Embed(_embed(seqs[0], "bench"), timeout=60)
        rows = torch.from_dlpack(region.rows("float32", [T, DIM]))
        result["exact"] = rows.cpu().numpy().tobytes() == host
        for mode in ("host", "cuda"):
            bodies = [_embed(seqs[i], None if mode == "host" else "bench",
                             i * answer).SerializeToString() for i in range(c)]
            result[mode] = asyncio.run(_rate(target, bodies, args.seconds))
        result["cuda_vs_host"] = round(result["cuda"]["req_per_s"]
                                       / result["host"]["req_per_s"], 2)

        # One B x T batch: the service's compute_ns, the device write alone, the ceiling.
        moved = 3 * B * answer  # two row reads, one write
        batch = pb.EmbedBatchRequest(model=MODEL_NAME, inputs=[
            pb.EmbedInput(token_ids=pb.TokenIds(ids=s)) for s in seqs[:B]])
        placed = pb.EmbedBatchRequest()
        placed.CopyFrom(batch)
        placed.output.CopyFrom(pb.SharedMemoryOutput(region="bench", cuda=True))
        for name, request in (("batch_host", batch), ("batch_cuda", placed)):
            ns = [stub.EmbedBatch(request, timeout=60).timing.compute_ns
                  for _ in range(args.reps + 2)][2:]
            s = statistics.median(ns) / 1e9
            result[name] = {"compute_us": round(s * 1e6, 1), "GB_per_s": round(moved / s / 1e9, 1)}
        src = torch.empty(B * answer, dtype=torch.uint8, device="cuda")
        dst = torch.empty_like(src)
        cuda = torch.device("cuda")
        ceiling = 2 * B * answer / median_seconds(lambda: dst.copy_(src), cuda, args.reps) / 1e9
        tables = EmbeddingTables(torch.randn(VOCAB_SIZE, DIM, generator=gen),
                                 torch.randn(T, DIM, generator=gen), cuda)
        ids = np.array([i for s in seqs[:B] for i in s], dtype=np.int64)  # (B*T,), as admitted
        out = torch.empty(B * T, DIM, device="cuda")  # (B*T, C)
        write = median_seconds(lambda: write_rows(tables, ids, [(0, T)] * B, 0, out), cuda,
                               args.reps)
        result["copy_GB_per_s"] = round(ceiling, 1)
        result["write_rows"] = {"us": round(write * 1e6, 1),
                                "GB_per_s": round(moved / write / 1e9, 1)}
        for key in ("batch_host", "batch_cuda", "write_rows"):
            result[key]["vs_copy"] = round(result[key]["GB_per_s"] / ceiling, 3)
        del rows
        stub.UnregisterCudaSharedMemory(pb.UnregisterCudaSharedMemoryRequest(), timeout=60)
    return result


def _report(r: dict[str, Any]) -> None:
    print(f"CUDA shared-memory output on {r['device']}: T={r['T']} fp32 C={r['C']}, "
          f"c={r['concurrency']}; rows equal the host output's: {r['exact']}")
    for mode in ("host", "cuda"):
        print(f"  {mode:5} output  {r[mode]['req_per_s']:>9.1f} req/s  "
              f"p50 {r[mode]['p50_ms']:.2f} ms")
    print(f"  cuda / host: {r['cuda_vs_host']:.2f} (target >= 5)")
    print(f"{r['batch']} x {r['T']} batch: copy ceiling {r['copy_GB_per_s']:.0f} GB/s")
    for key, what in (("batch_cuda", "service compute_ns, into the region"),
                      ("batch_host", "service compute_ns, host output"),
                      ("write_rows", "device write alone (CUDA events)")):
        print(f"  {what:38} {r[key]['GB_per_s']:>8.1f} GB/s ({r[key]['vs_copy']:.2f} of "
              f"copy)")
    print("  target: into the region >= 0.5 of copy")


def main(argv: list[str] | None = None) -> int:
    """Start the service on the GPU, measure, print, write JSON; exit 1 if the rows differ."""
    p = argparse.ArgumentParser(prog="python -m bench.suites.cuda_shm", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--seconds", type=float, default=3.0, help="per output mode")
    p.add_argument("--concurrency", type=int, default=16)
    p.add_argument("--tokens", type=int, default=1024, help="T of each sequence")
    p.add_argument("--batch", type=int, default=16, help="sequences in the batch case")
    p.add_argument("--reps", type=int, default=20, help="timed runs of each batch figure")
    p.add_argument("--model-cache", type=Path, help="keep the benchmark checkpoint here")
    p.add_argument("--out", type=Path, help="write the figures as JSON here")
    args = p.parse_args(argv)
    if not torch.cuda.is_available():
        p.exit(2, f"{p.prog}: needs a CUDA device (torch sees none here)\n")
    with tempfile.TemporaryDirectory(prefix="bench-cuda-shm-") as tmp:
        repo = ensure_model(args.model_cache or Path(tmp) / "model",
                            Shape(VOCAB_SIZE, DIM, max(1024, args.tokens)))
        server = launch_service("service", repo, Path(tmp) / "logs", "--max-message-bytes",
                                str(1 << 30), "--max-tokens-per-request",
                                str(args.batch * args.tokens), device="cuda")
        try:
            wait_serving(server, 180)
            result = run(args, server.target)
        finally:
            stop([server])
    _report(result)
    if args.out:
        args.out.write_text(json.dumps(result, indent=1))
    return 0 if result["exact"] else 1


if __name__ == "__main__":
    sys.exit(main())

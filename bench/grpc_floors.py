"""What the gRPC front's latency floor leaves the service at small T: one run, four servers.

    .venv/bin/python -m bench.grpc_floors [--T 16] [--requests 2000] [--rounds 5]

The bench's target "service p50 ≤ 1.3 × ceiling p50 at T=16, c=1" leaves the service about
a third of a round trip for everything it does. This measures how much of that a server
built like the service must spend before its own logic, in the same run. Each server is
its own process; the client sends the same sequential ``Embed`` requests (T uniform ids,
FP32, one in flight, a blocking stub) to each in turn:

- ``ceiling``: ``bench.ceiling_server``, pre-built reply bytes (grpc.aio alone);
- ``frame``: the service itself (``python -m service``, ``scripts/serve.sh``'s malloc
  tunables), with ``Embed`` replaced by the least a reply of this design costs: the
  frame (auth, draining, deadline, metrics), the model looked up, the reply for the shape
  planned once, its bytes allocated (``codec.ResponseWriter``) and its timing written;
- ``lookup``: ``frame`` plus the one piece of work no embedding service can skip: the ids
  read from the request and ``EmbeddingTables.embed_into`` writing the rows into the reply
  (checked against the service's answer, bit for bit, before anything is measured);
- ``service``: unchanged.

Per round each server answers ``--requests`` round trips (after a warm-up); a round's
figure is its p50. The table gives each server's median p50 over rounds and the median
of its per-round ratio to the ceiling's p50. Writes ``<out>/grpc_floors.json`` and
``grpc_floors.png``.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import grpc

from bench.backend_host import MAX_MESSAGE_BYTES
from bench.model import MODEL_NAME, VOCAB_SIZE, ensure_model
from bench.plot import plot_floors
from bench.report import P50_TARGET
from bench.servers import ROOT, free_port, launch, service_argv, stop_servers, wait_serving
from genproto.embedding.v1 import embedding_pb2 as pb
from genproto.embedding.v1 import embedding_pb2_grpc as pb_grpc
from training.plot import PlotsUnavailable

__all__ = ["SERVERS", "main", "serve"]

SERVERS = ("ceiling", "frame", "lookup", "service")
DIM = 768
MAX_SEQ_LEN = 1024
_DISTINCT = 64  # requests rotated, so their rows are not all in cache


def serve(variant: str, service_args: list[str]) -> None:
    """Run the service with ``Embed`` replaced by the ``variant`` floor (frame, lookup)."""
    import numpy as np
    import torch

    from service.__main__ import main as service_main
    from service.engine.batcher import Timing
    from service.engine.tables import COMPOSE_TOKEN_PLUS_POSITION
    from service.rpc import codec
    from service.rpc.frame import Call
    from service.rpc.native import NativeFront

    replies: dict[tuple[str, int, int], codec.Reply] = {}

    async def embed(self: NativeFront, request: pb.EmbedRequest, call: Call) -> bytes:
        model = self.engine.model(request.model, request.version)
        ids = request.token_ids.ids
        key = (model.checkpoint_id, len(ids), request.dtype)
        reply = replies.get(key)
        if reply is None:  # the fields of the service's reply, planned once per shape
            fields = pb.EmbedResponse(token_ids=ids, model=model.name, version=model.version,
                                      checkpoint_id=model.checkpoint_id)
            reply = replies[key] = codec.Reply(fields, (len(ids), model.tables.dim),
                                               request.dtype)
        writer = reply.allocate()
        if variant == "lookup":
            rows = torch.from_numpy(np.array(ids, dtype=np.int64))  # (T,)
            model.tables.embed_into([(rows, [(0, len(ids))], writer.rows)],
                                    COMPOSE_TOKEN_PLUS_POSITION)
        return writer.finish(Timing(0, 0, 0, 0))

    NativeFront.Embed = embed  # type: ignore[method-assign]
    service_main(service_args)


def _argv(name: str, repo: Path, port: int, T: int) -> list[str]:
    if name == "ceiling":
        return [sys.executable, "-m", "bench.ceiling_server", "--port", str(port), "--dim",
                str(DIM), "--ts", str(T), "--dtypes", "float32"]
    argv = service_argv(repo, port)
    if name == "service":
        return argv
    # The floors run in this module (its serve), with serve.sh's flags and tunables.
    return [sys.executable, "-m", "bench.grpc_floors", "--serve", name, "--", *argv[1:]]


def _p50_us(target: str, requests: list[pb.EmbedRequest], n: int, warmup: int) -> float:
    """The median round trip of ``n`` sequential Embed calls, in µs."""
    options = [("grpc.max_receive_message_length", MAX_MESSAGE_BYTES)]
    with grpc.insecure_channel(target, options=options) as channel:
        stub = pb_grpc.EmbeddingServiceStub(channel)
        for i in range(warmup):
            stub.Embed(requests[i % len(requests)])
        times = []
        for i in range(n):
            t0 = time.perf_counter_ns()
            stub.Embed(requests[i % len(requests)])
            times.append(time.perf_counter_ns() - t0)
    return statistics.median(times) / 1e3


def _check_lookup(floor: str, service: str, request: pb.EmbedRequest) -> None:
    """The lookup floor must answer the service's rows, bit for bit, or it measures
    something else."""
    answers = []
    for target in (floor, service):
        with grpc.insecure_channel(target) as channel:
            answers.append(pb_grpc.EmbeddingServiceStub(channel).Embed(request).embeddings)
    if answers[0] != answers[1]:
        raise SystemExit("grpc_floors: the lookup floor's rows differ from the service's")


def run(T: int, n: int, rounds: int, model_cache: Path) -> dict[str, Any]:
    """Every server's p50 per round, their medians and paired ratios to the ceiling."""
    repo = ensure_model(model_cache, DIM, MAX_SEQ_LEN)
    rng = random.Random(0)
    requests = [pb.EmbedRequest(model=MODEL_NAME, dtype=pb.DTYPE_FLOAT32, token_ids=pb.TokenIds(
        ids=[rng.randrange(VOCAB_SIZE) for _ in range(T)])) for _ in range(_DISTINCT)]
    log_dir = Path(tempfile.gettempdir()) / "grpc_floors_logs"
    servers = {}
    for name in SERVERS:
        port = free_port()
        servers[name] = launch(name, _argv(name, repo, port, T), port, log_dir)
    load = os.getloadavg()[0]
    try:
        for server in servers.values():
            wait_serving(server, 120)
        _check_lookup(servers["lookup"].target, servers["service"].target, requests[0])
        p50s: dict[str, list[float]] = {name: [] for name in SERVERS}
        for r in range(rounds):
            for name, server in servers.items():
                p50s[name].append(_p50_us(server.target, requests, n, min(n, 300)))
            print(f"grpc_floors: round {r + 1}/{rounds}: " + "  ".join(
                f"{k} {v[-1]:.0f} µs" for k, v in p50s.items()), file=sys.stderr, flush=True)
    finally:
        stop_servers(servers)
    rows = [{"server": name, "p50_us": statistics.median(p50s[name]),
             "ratio": statistics.median(a / c for a, c in zip(p50s[name], p50s["ceiling"])),
             "rounds_p50_us": p50s[name]} for name in SERVERS]
    return {"T": T, "C": DIM, "requests": n, "rounds": rounds, "rows": rows,
            "loadavg": [load, os.getloadavg()[0]]}


def main(argv: list[str] | None = None) -> None:
    """Measure (or, with ``--serve``, be one of the floor servers)."""
    p = argparse.ArgumentParser(prog="python -m bench.grpc_floors",
                                description=__doc__.split("\n")[0])
    p.add_argument("--serve", choices=("frame", "lookup"), help=argparse.SUPPRESS)
    p.add_argument("--T", type=int, default=16)
    p.add_argument("--requests", type=int, default=2000, help="round trips per server, round")
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--model-cache", type=Path, default=ROOT / "bench" / "results" / ".model")
    p.add_argument("--out", type=Path, default=ROOT / "bench" / "results")
    args, rest = p.parse_known_args(argv)
    if args.serve:
        serve(args.serve, [a for a in rest if a != "--"])
        return
    report = run(args.T, args.requests, args.rounds, args.model_cache)
    print(f"T={report['T']} C={DIM} c=1, {args.rounds} rounds of {args.requests} round trips "
          f"(load {report['loadavg'][0]:.2f} → {report['loadavg'][1]:.2f})")
    print(f"{'server':9s} {'p50 µs':>8s} {'/ceiling':>9s}")
    for row in report["rows"]:
        print(f"{row['server']:9s} {row['p50_us']:8.0f} {row['ratio']:9.2f}")
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "grpc_floors.json").write_text(json.dumps(report, indent=1))
    print(f"wrote {args.out / 'grpc_floors.json'}", file=sys.stderr)
    try:
        png = plot_floors(report, args.out / "grpc_floors.png", P50_TARGET)
        print(f"wrote {png}", file=sys.stderr)
    except PlotsUnavailable as e:  # the JSON and the printed table are the result
        print(f"bench.grpc_floors: no grpc_floors.png: {e}", file=sys.stderr)


if __name__ == "__main__":
    main()

"""Naive baseline: a per-request torch lookup returned as ``repeated float`` via ``tolist()``.

This is the server one writes first: no batching, no raw bytes, the tensor turned into a
Python list of floats and packed by protobuf. The service is measured against it.

Run as ``python -m bench.naive_server --port N --checkpoint MODELS/bench/1``.
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from pathlib import Path

import grpc
import torch

from bench.backend_host import reply_handler, serve_forever
from bench.naive_proto import SERVICE_NAME, NaiveResponse
from genproto.embedding.v1 import embedding_pb2 as pb
from service.format.checkpoint import read_checkpoint

__all__ = ["NaiveEmbedder", "main"]


class NaiveEmbedder:
    """token_table[ids] + position_table[positions], one request at a time."""

    def __init__(self, token_table: torch.Tensor, position_table: torch.Tensor) -> None:
        self.token_table = token_table  # (table_rows, C)
        self.position_table = position_table  # (max_seq_len, C)

    @torch.inference_mode()
    def reply(self, request: pb.EmbedRequest) -> bytes:
        """The embedding of ``request`` as a serialized NaiveResponse."""
        ids = torch.tensor(list(request.token_ids.ids), dtype=torch.int64)  # (T,)
        start = request.start_position
        x = self.token_table[ids] + self.position_table[start:start + len(ids)]  # (T, C)
        resp = NaiveResponse(values=x.flatten().tolist(), shape=list(x.shape))
        return resp.SerializeToString()


def handler(embedder: NaiveEmbedder) -> grpc.GenericRpcHandler:
    """Unary Embed and bidi EmbedStream of the naive service."""
    return reply_handler(SERVICE_NAME, embedder.reply)


def main(argv: Sequence[str] | None = None) -> None:
    """Load the checkpoint's tables, then serve until SIGTERM."""
    p = argparse.ArgumentParser(prog="python -m bench.naive_server")
    p.add_argument("--port", type=int, required=True)
    p.add_argument("--checkpoint", type=Path, required=True, help="a models/<m>/<v> folder")
    ns = p.parse_args(argv)
    ckpt = read_checkpoint(ns.checkpoint)
    if ckpt.position_table is None:
        raise SystemExit("naive baseline needs a learned position table")
    embedder = NaiveEmbedder(ckpt.token_table.float(), ckpt.position_table.float())
    serve_forever(ns.port, [handler(embedder)], "naive")


if __name__ == "__main__":
    main()

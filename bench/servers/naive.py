"""The naive baseline: the server one writes first. A torch lookup per request, the tensor
turned into a Python list by ``tolist()`` and packed by protobuf as ``repeated float``.
The contract has no such field (by design), so its reply is declared here from a
descriptor: ``message NaiveResponse { repeated float values = 1; repeated int64 shape = 2; }``.

    python -m bench.servers.naive --port N --checkpoint MODELS/bench/1
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
from google.protobuf import descriptor_pb2, descriptor_pool, message_factory
from google.protobuf.message import Message

from bench.servers.host import reference_args, reply_handler, serve_forever
from genproto.embedding.v1 import embedding_pb2 as pb

__all__ = ["SERVICE_NAME", "NaiveEmbedder", "NaiveResponse", "decode_naive", "main"]

_PACKAGE = "bench.naive.v1"
SERVICE_NAME = f"{_PACKAGE}.NaiveEmbedding"


def _message() -> type[Message]:
    fdp = descriptor_pb2.FileDescriptorProto(name="bench/naive.proto", package=_PACKAGE,
                                             syntax="proto3")
    msg = fdp.message_type.add(name="NaiveResponse")
    f = descriptor_pb2.FieldDescriptorProto
    msg.field.add(name="values", number=1, type=f.TYPE_FLOAT, label=f.LABEL_REPEATED)
    msg.field.add(name="shape", number=2, type=f.TYPE_INT64, label=f.LABEL_REPEATED)
    pool = descriptor_pool.DescriptorPool()  # private: never collides with the default pool
    pool.Add(fdp)
    return message_factory.GetMessageClass(
        pool.FindMessageTypeByName(f"{_PACKAGE}.NaiveResponse"))


NaiveResponse = _message()


def decode_naive(resp: Any) -> np.ndarray:
    """What a client of ``repeated float`` does: one Python float per element into numpy."""
    return np.array(resp.values, dtype=np.float32).reshape(tuple(resp.shape))


class NaiveEmbedder:
    """token_table[ids] + position_table[positions], one request at a time."""

    def __init__(self, token_table: Any, position_table: Any) -> None:
        import torch

        self.torch = torch
        self.token_table = token_table  # (table_rows, C)
        self.position_table = position_table  # (max_seq_len, C)

    def reply(self, request: pb.EmbedRequest) -> bytes:
        torch = self.torch
        with torch.inference_mode():
            ids = torch.tensor(list(request.token_ids.ids), dtype=torch.int64)  # (T,)
            start = request.start_position
            x = self.token_table[ids] + self.position_table[start:start + len(ids)]  # (T, C)
            return NaiveResponse(values=x.flatten().tolist(),
                                 shape=list(x.shape)).SerializeToString()


def main(argv: Sequence[str] | None = None) -> None:
    from service.format.checkpoint import read_checkpoint

    args = reference_args("python -m bench.servers.naive", argv)
    ckpt = read_checkpoint(args.checkpoint)
    if ckpt.position_table is None:
        raise SystemExit("naive baseline needs a learned position table")
    embedder = NaiveEmbedder(ckpt.token_table.float(), ckpt.position_table.float())
    serve_forever("naive", args.port, [reply_handler(SERVICE_NAME, embedder.reply)])


if __name__ == "__main__":
    main()

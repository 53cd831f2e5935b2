"""The naive baseline's reply: the embedding as ``repeated float``, built without protoc.

The public contract has no ``repeated float`` field (by design), so the baseline gets its
own tiny message, declared here from a descriptor so the benchmark needs no generated code:
``message NaiveResponse { repeated float values = 1; repeated int64 shape = 2; }``.
Requests are the real ``embedding.v1.EmbedRequest``.
"""

from __future__ import annotations

from google.protobuf import descriptor_pb2, descriptor_pool, message_factory
from google.protobuf.message import Message

__all__ = ["EMBED_METHOD", "SERVICE_NAME", "STREAM_METHOD", "NaiveResponse"]

SERVICE_NAME = "bench.naive.v1.NaiveEmbedding"
EMBED_METHOD = f"/{SERVICE_NAME}/Embed"
STREAM_METHOD = f"/{SERVICE_NAME}/EmbedStream"


def _build() -> type[Message]:
    fdp = descriptor_pb2.FileDescriptorProto(name="bench/naive.proto", package="bench.naive.v1",
                                             syntax="proto3")
    msg = fdp.message_type.add(name="NaiveResponse")
    f = descriptor_pb2.FieldDescriptorProto
    msg.field.add(name="values", number=1, type=f.TYPE_FLOAT, label=f.LABEL_REPEATED)
    msg.field.add(name="shape", number=2, type=f.TYPE_INT64, label=f.LABEL_REPEATED)
    # A private pool: never collides with anything registered in the default one.
    pool = descriptor_pool.DescriptorPool()
    pool.Add(fdp)
    descriptor = pool.FindMessageTypeByName("bench.naive.v1.NaiveResponse")
    return message_factory.GetMessageClass(descriptor)


NaiveResponse = _build()

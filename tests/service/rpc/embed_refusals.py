"""The native Embed requests refused with INVALID_ARGUMENT, each with its whole message:
one list that the Python client (test_status_codes.py) and grpcurl (test_grpcurl.py) both
send to the shared server."""

from __future__ import annotations

from genproto.embedding.v1 import embedding_pb2 as pb

__all__ = ["INVALID_ARGUMENT", "ids"]


def ids(*values: int) -> pb.TokenIds:
    return pb.TokenIds(ids=list(values))


INVALID_ARGUMENT: list[tuple[pb.EmbedRequest, str]] = [
    (pb.EmbedRequest(), "input is empty: set text or token_ids"),
    (pb.EmbedRequest(text=""), "input is empty: give text or token_ids with at least 1 token"),
    (pb.EmbedRequest(token_ids=ids()), "input is empty: give text or token_ids with at least "
                                       "1 token"),
    (pb.EmbedRequest(token_ids=ids(5, -1)),
     "input.token_ids.ids[1]=-1 is out of range [0, 50257) for model 'tiny'"),
    (pb.EmbedRequest(token_ids=ids(50257)),
     "input.token_ids.ids[0]=50257 is out of range [0, 50257) for model 'tiny'"),
    # Above 64 ids the range check takes numpy's path (below, Python's min/max).
    (pb.EmbedRequest(token_ids=ids(*[1] * 70, 50300)),
     "input.token_ids.ids[70]=50300 is out of range [0, 50257) for model 'tiny'"),
    (pb.EmbedRequest(token_ids=ids(*[1] * 65)),
     "input: start_position (0) + T (65) = 65 exceeds max_seq_len 64 of model 'tiny' "
     "(or set truncate)"),
    (pb.EmbedRequest(token_ids=ids(1, 2, 3), start_position=62),
     "input: start_position (62) + T (3) = 65 exceeds max_seq_len 64 of model 'tiny' "
     "(or set truncate)"),
    (pb.EmbedRequest(token_ids=ids(1), start_position=64),
     "input: start_position=64 must be < max_seq_len 64 of model 'tiny'"),
    (pb.EmbedRequest(token_ids=ids(1), compose=7),  # type: ignore[arg-type]
     "compose=7 is not a valid Compose (COMPOSE_TOKEN_PLUS_POSITION, COMPOSE_TOKEN_ONLY, "
     "COMPOSE_POSITION_ONLY)"),
    (pb.EmbedRequest(token_ids=ids(1), dtype=9),  # type: ignore[arg-type]
     "dtype=9 is not a valid DType (DTYPE_FLOAT32, DTYPE_FLOAT16, DTYPE_BFLOAT16)"),
    (pb.EmbedRequest(token_ids=ids(1), truncate=3),  # type: ignore[arg-type]
     "truncate=3 is not a valid Truncate (TRUNCATE_NONE, TRUNCATE_RIGHT, TRUNCATE_LEFT)"),
]

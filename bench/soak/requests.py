"""The soak's requests: random valid ones (with what to expect) and invalid ones (with the
code). A valid request names the default model's newest version; its answer names the
version, whose tables the oracle checks it against. An invalid one breaks one rule.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import grpc

from genproto.embedding.v1 import embedding_pb2 as pb

__all__ = ["MODEL", "Expected", "Item", "RequestMaker"]

MODEL = "soak"
_WORDS = ("the", "embedding", "service", "soak", " test", "hello", "world", "π", "naïve",
          "<|endoftext|>", "tokens", "über", "🙂", "rows", "\n", "  ", "42", "version")
_DTYPES = (pb.DTYPE_FLOAT32, pb.DTYPE_FLOAT16, pb.DTYPE_BFLOAT16)
_COMPOSES = (pb.COMPOSE_TOKEN_PLUS_POSITION, pb.COMPOSE_TOKEN_ONLY, pb.COMPOSE_POSITION_ONLY)


@dataclass(frozen=True)
class Item:
    """One sequence of a valid request: ids or text, and its start position."""

    ids: tuple[int, ...] | None
    text: str | None
    start: int


@dataclass(frozen=True)
class Expected:
    """What a request must get: ``code`` OK with rows per ``items``, or that error code."""

    code: grpc.StatusCode
    items: tuple[Item, ...] = ()
    compose: int = pb.COMPOSE_TOKEN_PLUS_POSITION
    dtype: int = pb.DTYPE_FLOAT32
    truncate: int = pb.TRUNCATE_NONE
    allow_special: bool = False
    why: str = ""  # the broken rule, for invalid requests


def _set_enums(msg: Any, compose: int, dtype: int, truncate: int) -> Any:
    # Plain ints, also out-of-range ones (protobuf keeps unknown enum values as numbers).
    msg.compose, msg.dtype, msg.truncate = compose, dtype, truncate
    return msg


class RequestMaker:
    """Seeded random requests for a model of ``vocab_size`` ids and ``max_seq_len`` positions."""

    def __init__(self, rng: random.Random, vocab_size: int, max_seq_len: int,
                 encode: Callable[[str, bool], list[int]], max_t: int = 48) -> None:
        self.rng, self.vocab, self.L, self.max_t = rng, vocab_size, max_seq_len, max_t
        self.encode = encode  # the model's tokenizer: text items are sized to fit

    def _text(self, limit: int, special: bool) -> str:
        text = self.rng.choice(_WORDS)
        while True:
            longer = text + self.rng.choice(_WORDS)
            if len(self.encode(longer, special)) > limit or self.rng.random() < 0.1:
                return text if len(self.encode(text, special)) <= limit else "a"
            text = longer

    def _item(self, truncate: int, special: bool) -> Item:
        r = self.rng
        start = r.randrange(self.L // 2) if r.random() < 0.5 else 0
        room = self.L - start
        if truncate != pb.TRUNCATE_NONE and r.random() < 0.5:
            t = room + r.randint(1, 8)  # too long: the server must cut it
        else:
            t = r.randint(1, min(self.max_t, room))
        if r.random() < 0.3 and truncate == pb.TRUNCATE_NONE:
            return Item(None, self._text(min(t, room), special), start)
        return Item(tuple(r.randrange(self.vocab) for _ in range(t)), None, start)

    def _options(self) -> tuple[int, int, int, bool]:
        r = self.rng
        compose = r.choices(_COMPOSES, weights=(6, 2, 1))[0]
        truncate = r.choices((pb.TRUNCATE_NONE, pb.TRUNCATE_RIGHT, pb.TRUNCATE_LEFT),
                             weights=(6, 1, 1))[0]
        return compose, r.choice(_DTYPES), truncate, r.random() < 0.2

    @staticmethod
    def _input(item: Item) -> dict[str, object]:
        if item.text is not None:
            return {"text": item.text}
        return {"token_ids": pb.TokenIds(ids=item.ids)}

    def embed(self, request_id: str) -> tuple[pb.EmbedRequest, Expected]:
        """A valid EmbedRequest and its expectation."""
        compose, dtype, truncate, special = self._options()
        item = self._item(truncate, special)
        req = pb.EmbedRequest(start_position=item.start, allow_special_tokens=special,
                              request_id=request_id, **self._input(item))  # type: ignore[arg-type]
        _set_enums(req, compose, dtype, truncate)
        return req, Expected(grpc.StatusCode.OK, (item,), compose, dtype, truncate, special)

    def batch(self, request_id: str) -> tuple[pb.EmbedBatchRequest, Expected]:
        """A valid EmbedBatchRequest of 1..6 inputs and its expectation."""
        compose, dtype, truncate, special = self._options()
        items = tuple(self._item(truncate, special) for _ in range(self.rng.randint(1, 6)))
        inputs = [pb.EmbedInput(start_position=i.start, **self._input(i))  # type: ignore[arg-type]
                  for i in items]
        req = pb.EmbedBatchRequest(inputs=inputs, allow_special_tokens=special,
                                   request_id=request_id)
        _set_enums(req, compose, dtype, truncate)
        return req, Expected(grpc.StatusCode.OK, items, compose, dtype, truncate, special)

    def bad_embed(self, request_id: str) -> tuple[pb.EmbedRequest, Expected]:
        """An EmbedRequest that breaks one rule, and the code it must get."""
        r = self.rng
        invalid, not_found = grpc.StatusCode.INVALID_ARGUMENT, grpc.StatusCode.NOT_FOUND
        ids = pb.TokenIds(ids=[r.randrange(self.vocab) for _ in range(r.randint(1, 8))])
        cases: list[tuple[pb.EmbedRequest, grpc.StatusCode, str]] = [
            (pb.EmbedRequest(token_ids=pb.TokenIds(ids=[1, self.vocab])), invalid, "id=vocab"),
            (pb.EmbedRequest(token_ids=pb.TokenIds(ids=[-1])), invalid, "id<0"),
            (pb.EmbedRequest(), invalid, "empty"),
            (pb.EmbedRequest(token_ids=pb.TokenIds(ids=[7] * 4), start_position=self.L - 2),
             invalid, "too long"),
            (_set_enums(pb.EmbedRequest(token_ids=ids), 7, 0, 0), invalid, "compose=7"),
            (_set_enums(pb.EmbedRequest(token_ids=ids), 0, 9, 0), invalid, "dtype=9"),
            (pb.EmbedRequest(token_ids=ids, model="nope"), not_found, "model"),
            (pb.EmbedRequest(token_ids=ids, version=10**6), not_found, "version"),
        ]
        req, code, why = r.choice(cases)
        req.request_id = request_id
        return req, Expected(code, why=why)

    def bad_batch(self, request_id: str) -> tuple[pb.EmbedBatchRequest, Expected]:
        """An EmbedBatchRequest with one bad input (or none), and the code it must get."""
        req, _ = self.batch(request_id)
        if self.rng.random() < 0.2:
            del req.inputs[:]
            return req, Expected(grpc.StatusCode.INVALID_ARGUMENT, why="no inputs")
        k = self.rng.randrange(len(req.inputs))
        req.inputs[k].ClearField("text")
        req.inputs[k].token_ids.ids[:] = [0, self.vocab + self.rng.randrange(1000)]
        return req, Expected(grpc.StatusCode.INVALID_ARGUMENT, why=f"inputs[{k}] id")

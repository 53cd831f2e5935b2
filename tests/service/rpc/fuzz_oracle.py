"""An independent oracle for the fuzz tests: the status and the exact answer for a request,
and the checks that hold a server's answer to it.

Written from the contract (ARCHITECTURE.md's status table, docs/service.md, the proto), not
from ``service/``: it never calls the service's validation, tokenizer or tables code. The
tokenizer is a fresh ``tiktoken.Encoding`` over the ranks file parsed here; the rows come
from ``tiny_tables(seed)`` added and cast in numpy (bf16 by explicit round-to-nearest-even),
so a torch or codec cast bug cannot hide behind the same bug in the oracle.

Precedence when one request breaks several rules (the order the contract reads in: who
serves it, what is asked, can this model do it, then the inputs):
transport size → NOT_FOUND → unknown enum (INVALID_ARGUMENT) → FAILED_PRECONDITION →
the request's declared size (INVALID_ARGUMENT: number of inputs; each text's bytes then the
running sum, in input order; with TRUNCATE_NONE the token ids' count) → the inputs
(INVALID_ARGUMENT) → the shared-memory output (none is registered here).
"""

from __future__ import annotations

import base64
import hashlib
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import grpc
import numpy as np
import tiktoken
from grpc import StatusCode as Code

from genproto.embedding.v1 import embedding_pb2 as pb
from genproto.embedding.v1 import embedding_pb2_grpc as pb_grpc
from tests.tiny_model import DIM, MAX_SEQ_LEN, TRAINED_ROWS, VOCAB_SIZE, tiny_tables

# The fuzz server's limits: small enough that every limit is reachable by a cheap example.
MAX_TEXT_BYTES = 256
MAX_TOKENS = 48  # < MAX_SEQ_LEN, so both length limits can be the one that bites
MAX_MESSAGE_BYTES = 8192  # gRPC's receive cap; every response here is < 5 KB
MAX_INPUTS = 4  # EmbedBatch inputs: the strategies draw up to 5
MAX_REQUEST_TEXT_BYTES = 512  # texts summed: two texts at MAX_TEXT_BYTES fit, three may not
# A 1 ms batch delay makes requests in flight together share a batch (mixed models, dtypes,
# composes): with 0, each of 10 concurrent requests got a batch of its own (measured).
SERVER_CONFIG = {"max_text_bytes": MAX_TEXT_BYTES, "max_tokens_per_request": MAX_TOKENS,
                 "max_message_bytes": MAX_MESSAGE_BYTES, "max_batch_delay_us": 1000,
                 "max_inputs_per_request": MAX_INPUTS,
                 "max_request_text_bytes": MAX_REQUEST_TEXT_BYTES}

DEFAULT_MODEL = "tiny"
MODEL_SEEDS = {"tiny": 0, "rope": 1}  # conftest.tiny_repo: "rope" has no position table
VERSION = 1
# r50k_base == gpt2 (tiktoken_ext.openai_public), written out here rather than imported.
# fmt: off
PAT_STR = r"""'(?:[sdmt]|ll|ve|re)| ?\p{L}++| ?\p{N}++| ?[^\s\p{L}\p{N}]++|\s++$|\s+(?!\S)|\s"""
# fmt: on
ENDOFTEXT_ID = 50256
ENUMS = {"compose": (0, 1, 2), "dtype": (0, 1, 2), "truncate": (0, 1, 2)}


@dataclass(frozen=True)
class Seq:
    """One answered sequence: the ids after truncation, its first position, what was cut."""

    ids: tuple[int, ...]
    start: int
    truncated: int

    @property
    def untrained(self) -> list[int]:
        """Indices whose row was never updated (conftest marks rows >= TRAINED_ROWS)."""
        return [i for i, t in enumerate(self.ids) if t >= TRAINED_ROWS]


@dataclass(frozen=True)
class Outcome:
    """What the server must answer: a code; when not OK, fragments one of which the
    message contains; when OK, the model and the sequences."""

    code: Code
    hints: tuple[str, ...] = ()
    model: str = ""
    seqs: tuple[Seq, ...] = field(default_factory=tuple)


class Refused(Exception):
    """The oracle's verdict for a request the server must refuse."""

    def __init__(self, code: Code, *hints: str) -> None:
        super().__init__(code, hints)
        self.code, self.hints = code, hints


class Oracle:
    """Expected status and bytes for requests to a server over conftest's ``tiny_repo``."""

    def __init__(self, ranks_path: Path, repo: Path) -> None:
        ranks: dict[bytes, int] = {}
        for line in ranks_path.read_bytes().splitlines():
            if line:
                token, rank = line.split()
                ranks[base64.b64decode(token)] = int(rank)
        self.encoding = tiktoken.Encoding("oracle-gpt2", pat_str=PAT_STR, mergeable_ranks=ranks,
                                          special_tokens={"<|endoftext|>": ENDOFTEXT_ID})
        assert self.encoding.n_vocab == VOCAB_SIZE
        self.tables: dict[str, tuple[np.ndarray, np.ndarray | None]] = {}
        self.checkpoint_ids: dict[str, str] = {}
        for name, seed in MODEL_SEEDS.items():
            token_table, position_table = tiny_tables(seed)
            self.tables[name] = (token_table.numpy(),  # (TABLE_ROWS, C)
                                 None if name == "rope" else position_table.numpy())  # (L, C)
            manifest = repo / name / str(VERSION) / "manifest.json"
            self.checkpoint_ids[name] = hashlib.sha256(manifest.read_bytes()).hexdigest()

    # -- what the server must answer --------------------------------------------------------

    def embed(self, req: pb.EmbedRequest, wire_size: int | None = None) -> Outcome:
        """Outcome of ``Embed(req)``; ``wire_size``: the bytes sent, if not req's own size."""
        try:
            name = self._header(req, req.ByteSize() if wire_size is None else wire_size)
            self._size([("input", req)], req.truncate)
            seq = self._fit(self._tokens(req, req.allow_special_tokens, "input"),
                            req.start_position, req.truncate, "input")
            self._output(req)
        except Refused as r:
            return Outcome(r.code, r.hints)
        return Outcome(Code.OK, model=name, seqs=(seq,))

    def batch(self, req: pb.EmbedBatchRequest) -> Outcome:
        """Outcome of ``EmbedBatch(req)``: one job, all or nothing."""
        try:
            name = self._header(req, req.ByteSize())
            if not req.inputs:
                raise Refused(Code.INVALID_ARGUMENT, "inputs is empty")
            self._size([(f"inputs[{i}]", inp) for i, inp in enumerate(req.inputs)],
                       req.truncate)
            seqs: list[Seq] = []
            hints: list[str] = []  # every faulty input: the contract does not say which one wins
            for i, inp in enumerate(req.inputs):
                try:
                    seqs.append(self._fit(self._tokens(inp, req.allow_special_tokens,
                                                       f"inputs[{i}]"),
                                          inp.start_position, req.truncate, f"inputs[{i}]"))
                except Refused as r:
                    hints.extend(r.hints)
            if hints:
                raise Refused(Code.INVALID_ARGUMENT, *hints)
            total = sum(len(s.ids) for s in seqs)
            if total > MAX_TOKENS:  # the cap is per request: a batch is one request
                raise Refused(Code.INVALID_ARGUMENT, f"inputs have {total} tokens in all")
            self._output(req)
        except Refused as r:
            return Outcome(r.code, r.hints)
        return Outcome(Code.OK, model=name, seqs=tuple(seqs))

    def stream(self, reqs: list[pb.EmbedRequest]) -> tuple[list[Outcome], Outcome]:
        """The answers a stream delivers, and how it ends: at the first refused request."""
        answered: list[Outcome] = []
        for req in reqs:
            outcome = self.embed(req)
            if outcome.code != Code.OK:
                return answered, outcome
            answered.append(outcome)
        return answered, Outcome(Code.OK)

    # -- the rules ---------------------------------------------------------------------------

    def _header(self, req: pb.EmbedRequest | pb.EmbedBatchRequest, wire_size: int) -> str:
        if wire_size > MAX_MESSAGE_BYTES:  # gRPC refuses it before the service sees it
            raise Refused(Code.RESOURCE_EXHAUSTED,
                          f"Received message larger than max ({wire_size} vs. "
                          f"{MAX_MESSAGE_BYTES})")
        name = req.model or DEFAULT_MODEL
        if name not in MODEL_SEEDS:
            raise Refused(Code.NOT_FOUND, f"model {name!r} is not loaded")
        if req.version not in (0, VERSION):
            raise Refused(Code.NOT_FOUND, f"version {req.version} of model {name!r}")
        for enum_field, valid in ENUMS.items():
            value = getattr(req, enum_field)
            if value not in valid:
                raise Refused(Code.INVALID_ARGUMENT, f"{enum_field}={value} is not a valid")
        if req.compose == pb.COMPOSE_POSITION_ONLY and self.tables[name][1] is None:
            raise Refused(Code.FAILED_PRECONDITION, f"model {name!r} has position 'none'")
        return name

    @staticmethod
    def _size(inputs: list[tuple[str, pb.EmbedRequest | pb.EmbedInput]], truncate: int) -> None:
        """The request's size from what it declares, before any input is looked into."""
        if len(inputs) > MAX_INPUTS:
            raise Refused(Code.INVALID_ARGUMENT, f"has {len(inputs)} sequences; "
                                                 f"max_inputs_per_request is {MAX_INPUTS}")
        running = 0
        for where, inp in inputs:  # in input order: the first input past a limit decides
            if inp.WhichOneof("input") != "text":
                continue
            n = len(inp.text.encode("utf-8"))
            if n > MAX_TEXT_BYTES:
                raise Refused(Code.INVALID_ARGUMENT, f"{where}.text is {n} bytes")
            running += n
            if running > MAX_REQUEST_TEXT_BYTES:
                raise Refused(Code.INVALID_ARGUMENT, f"hold {running} bytes of text in all; "
                              f"max_request_text_bytes is {MAX_REQUEST_TEXT_BYTES}")
        if truncate != pb.TRUNCATE_NONE:
            return
        declared = sum(len(inp.token_ids.ids) for _, inp in inputs
                       if inp.WhichOneof("input") == "token_ids")
        if declared > MAX_TOKENS:  # every id would be kept: certain to be refused
            raise Refused(Code.INVALID_ARGUMENT,
                          f"has T={declared} tokens; max_tokens_per_request is {MAX_TOKENS}"
                          if len(inputs) == 1 else f"inputs have {declared} tokens in all")

    def _tokens(self, inp: pb.EmbedRequest | pb.EmbedInput, allow_special: bool,
                where: str) -> list[int]:
        kind = inp.WhichOneof("input")
        if kind is None:
            raise Refused(Code.INVALID_ARGUMENT, f"{where} is empty")
        if kind == "text":
            n = len(inp.text.encode("utf-8"))
            if n > MAX_TEXT_BYTES:
                raise Refused(Code.INVALID_ARGUMENT, f"{where}.text is {n} bytes")
            if allow_special:
                return self.encoding.encode(inp.text, allowed_special="all")
            # Special tokens in user text are plain text: never refused, never id 50256.
            return self.encoding.encode(inp.text, allowed_special=set(), disallowed_special=())
        ids = list(inp.token_ids.ids)
        for j, v in enumerate(ids):
            if not 0 <= v < VOCAB_SIZE:  # padding rows 50257..50303 are never served
                raise Refused(Code.INVALID_ARGUMENT,
                              f"{where}.token_ids.ids[{j}]={v} is out of range")
        return ids

    @staticmethod
    def _output(req: pb.EmbedRequest | pb.EmbedBatchRequest) -> None:
        # The fuzz server has no shared-memory region registered: any named one is unknown.
        if req.HasField("output"):
            if not req.output.region:
                raise Refused(Code.INVALID_ARGUMENT, "output.region")
            raise Refused(Code.NOT_FOUND, f"region {req.output.region!r} is not registered")

    @staticmethod
    def _fit(ids: list[int], start: int, truncate: int, where: str) -> Seq:
        T = len(ids)
        if T == 0:
            raise Refused(Code.INVALID_ARGUMENT, f"{where} is empty")
        if start >= MAX_SEQ_LEN:
            raise Refused(Code.INVALID_ARGUMENT, f"start_position={start} must be < max_seq_len")
        keep = min(MAX_SEQ_LEN - start, MAX_TOKENS)
        if keep < T:
            if truncate == pb.TRUNCATE_NONE:
                hint = (f"has T={T} tokens; max_tokens_per_request is {MAX_TOKENS}"
                        if T > MAX_TOKENS else
                        f"start_position ({start}) + T ({T}) = {start + T} exceeds max_seq_len")
                raise Refused(Code.INVALID_ARGUMENT, hint)
            ids = ids[:keep] if truncate == pb.TRUNCATE_RIGHT else ids[T - keep:]
        return Seq(tuple(ids), start, T - len(ids))

    # -- the bytes ---------------------------------------------------------------------------

    def rows(self, model: str, seq: Seq, compose: int) -> np.ndarray:
        """The fp32 rows: token row + position row, each looked up, added in fp32."""
        token_table, position_table = self.tables[model]
        tokens = token_table[list(seq.ids)]  # (T, C)
        if position_table is None:  # RoPE: no position rows to add
            return tokens
        positions = position_table[seq.start: seq.start + len(seq.ids)]  # (T, C)
        if compose == pb.COMPOSE_TOKEN_ONLY:
            return tokens
        if compose == pb.COMPOSE_POSITION_ONLY:
            return positions
        return (tokens + positions).astype(np.float32)  # (T, C), the fp32 sum


def wire_bytes(rows: np.ndarray, dtype: int) -> bytes:
    """The little-endian bytes of ``rows`` (fp32) cast to ``dtype``."""
    assert rows.dtype == np.float32
    assert np.isfinite(rows).all()  # the bf16 rounding below is for finite values only
    if dtype == pb.DTYPE_FLOAT32:
        return rows.astype("<f4").tobytes()
    if dtype == pb.DTYPE_FLOAT16:
        return rows.astype("<f2").tobytes()  # IEEE round to nearest even
    # bfloat16: the top 16 bits of the fp32 pattern, rounded to nearest even (finite input).
    bits = rows.view(np.uint32).astype(np.uint64)
    rounded = (bits + 0x7FFF + ((bits >> 16) & 1)) >> 16
    return rounded.astype("<u2").tobytes()


# -- holding the server's answers to the oracle -----------------------------------------

GOOD = pb.EmbedRequest(text="hello world", start_position=3, request_id="good")
SERVICE = "/embedding.v1.EmbeddingService/"


def raw_rpc(channel: grpc.Channel, method: str) -> Callable[..., bytes]:
    """A unary call that sends and returns bytes as they are (no protobuf on our side)."""
    return channel.unary_unary(SERVICE + method, request_serializer=lambda b: b,
                               response_deserializer=lambda b: b)


def refused(err: grpc.RpcError, outcome: Outcome) -> None:
    """The status is the oracle's and the message names what was wrong."""
    assert err.code() == outcome.code, (err.details(), outcome)
    assert any(hint in err.details() for hint in outcome.hints), (err.details(), outcome.hints)


def answered(resp: pb.EmbedResponse, req: pb.EmbedRequest, outcome: Outcome,
             oracle: Oracle) -> None:
    """An OK Embed answer equals the oracle's, field by field and byte by byte."""
    assert outcome.code == Code.OK, (outcome, resp.token_ids)
    (seq,) = outcome.seqs
    assert list(resp.token_ids) == list(seq.ids)
    assert (resp.start_position, resp.truncated_tokens) == (seq.start, seq.truncated)
    assert list(resp.untrained_token_indices) == seq.untrained
    assert (resp.model, resp.version, resp.checkpoint_id, resp.request_id) == (
        outcome.model, VERSION, oracle.checkpoint_ids[outcome.model], req.request_id)
    assert list(resp.embeddings.shape) == [len(seq.ids), DIM]
    assert resp.embeddings.dtype == req.dtype
    assert resp.embeddings.data == wire_bytes(oracle.rows(outcome.model, seq, req.compose),
                                              req.dtype)
    assert resp.timing.total_ns > 0


def still_serves(stub: pb_grpc.EmbeddingServiceStub, oracle: Oracle) -> None:
    """A known-good request after the example gets the right bytes."""
    answered(stub.Embed(GOOD, timeout=10), GOOD, oracle.embed(GOOD), oracle)

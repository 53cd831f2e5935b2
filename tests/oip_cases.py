"""The shared table of OIP infer requests (``tests/vectors/oip_cases.json``), its servers
and its oracle: what every stock peer (tritonclient.grpc, tritonclient.http, curl,
grpcurl) must get for each row.

A peer's test parametrizes over ``CASES``, sends each row its own way (to
``case_servers[case.server]``, a fixture of tests/conftest.py) and hands back an
``Outcome``; ``check`` holds it to the row: a refusal's gRPC or HTTP status and whole
message, or an answer's shape, sequence lengths and bytes, which are the native
``Embed`` of each sequence, zero-padded to the longest, read from the same server.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import grpc

from genproto.embedding.v1 import embedding_pb2 as pb
from genproto.embedding.v1 import embedding_pb2_grpc as pb_grpc

__all__ = ["CASES", "COMPOSE", "DATATYPES", "SERVERS", "OipCase", "Outcome", "check",
           "expected", "native_rows"]

TABLE = Path(__file__).with_name("vectors") / "oip_cases.json"
_DOC = json.loads(TABLE.read_text())
SERVERS: dict[str, dict[str, Any]] = _DOC["servers"]
# The OIP parameters' values as the native API's enums, for the native answer a peer's equals.
COMPOSE = {"token_plus_position": pb.COMPOSE_TOKEN_PLUS_POSITION,
           "token_only": pb.COMPOSE_TOKEN_ONLY, "position_only": pb.COMPOSE_POSITION_ONLY}
DATATYPES = {"FP32": pb.DTYPE_FLOAT32, "FP16": pb.DTYPE_FLOAT16, "BF16": pb.DTYPE_BFLOAT16}
_ITEMSIZE = {"FP32": 4, "FP16": 2, "BF16": 2}


@dataclass(frozen=True)
class OipCase:
    """One row: where it is sent, the request, and the refusal expected (None: an answer)."""

    name: str
    server: str
    token: str | None
    request: dict[str, Any]
    error: dict[str, Any] | None

    @property
    def model(self) -> str:
        return str(self.request.get("model", "tiny"))

    @property
    def version(self) -> str:
        return str(self.request.get("version", ""))

    @property
    def headers(self) -> dict[str, str]:
        return {"authorization": f"Bearer {self.token}"} if self.token is not None else {}

    def texts(self) -> list[bytes]:
        """The ``texts`` as the bytes each peer sends (a ``{"hex": ...}`` item raw)."""
        return [t.encode() if isinstance(t, str) else bytes.fromhex(t["hex"])
                for t in self.request["texts"]]


def _load() -> list[OipCase]:
    cases = []
    for row in _DOC["cases"]:
        assert ("ok" in row) != ("error" in row), row["name"]
        assert row.get("server", "tiny") in SERVERS, row["name"]
        assert ("ids" in row["request"]) != ("texts" in row["request"]), row["name"]
        cases.append(OipCase(row["name"], row.get("server", "tiny"), row.get("token"),
                             row["request"], row.get("error")))
    assert len({c.name for c in cases}) == len(cases), "row names must be unique"
    return cases


CASES = _load()


@dataclass
class Outcome:
    """What a peer got: ``code`` (a gRPC status name, or an HTTP status) and ``message``
    for a refusal; else each output's shape and bytes (little-endian)."""

    code: str | int | None = None
    message: str | None = None
    shapes: dict[str, list[int]] = field(default_factory=dict)
    data: dict[str, bytes] = field(default_factory=dict)


def expected(target: str, case: OipCase) -> tuple[list[int], list[int], bytes]:
    """A valid row's answer from the native API of the same server: the embeddings' shape
    [B, T, C], the sequence lengths, and the rows (each sequence zero-padded to T)."""
    params = dict(case.request.get("parameters", {}))
    datatype = params.pop("datatype", "FP32")
    fields: dict[str, Any] = {"model": case.model, "dtype": DATATYPES[datatype],
                              "version": int(case.version or 0),
                              "start_position": params.pop("start_position", 0),
                              "compose": COMPOSE[params.pop("compose", "token_plus_position")]}
    assert not params, f"{case.name}: the oracle does not know parameters {sorted(params)}"
    sequences: list[dict[str, Any]] = (
        [{"token_ids": pb.TokenIds(ids=ids)} for ids in case.request["ids"]]
        if "ids" in case.request else [{"text": t.decode()} for t in case.texts()])
    metadata = [("authorization", f"Bearer {case.token}")] if case.token else None
    with grpc.insecure_channel(target) as channel:
        stub = pb_grpc.EmbeddingServiceStub(channel)
        answers = [stub.Embed(pb.EmbedRequest(**fields, **s), metadata=metadata)
                   for s in sequences]
    lengths = [a.embeddings.shape[0] for a in answers]
    T, C = max(lengths), answers[0].embeddings.shape[1]
    rows = b"".join(a.embeddings.data + bytes((T - n) * C * _ITEMSIZE[datatype])
                    for a, n in zip(answers, lengths, strict=True))
    return [len(answers), T, C], lengths, rows


def native_rows(stub: pb_grpc.EmbeddingServiceStub, sequences: Iterable[Sequence[int]],
                **fields: Any) -> bytes:
    """The native Embed of each sequence of ids with ``fields``, the rows one after another:
    the bytes an infer of those sequences (all of one length) must return."""
    return b"".join(stub.Embed(pb.EmbedRequest(token_ids=pb.TokenIds(ids=ids), **fields)
                               ).embeddings.data for ids in sequences)


def check(target: str, case: OipCase, got: Outcome, http: bool) -> None:
    """Hold a peer's outcome to the row (``http``: statuses as HTTP numbers)."""
    if case.error is not None:
        want = case.error["http"] if http else case.error["grpc"]
        assert (got.code, got.message) == (want, case.error["message"]), case.name
        return
    assert (got.code, got.message) == (None, None), case.name
    shape, lengths, rows = expected(target, case)
    names = case.request.get("outputs") or ["embeddings", "sequence_lengths"]
    assert sorted(got.shapes) == sorted(names), case.name
    assert (got.shapes["embeddings"], got.data["embeddings"]) == (shape, rows), case.name
    if "sequence_lengths" in names:
        assert got.shapes["sequence_lengths"] == [shape[0]], case.name
        assert got.data["sequence_lengths"] == b"".join(
            n.to_bytes(8, "little", signed=True) for n in lengths), case.name

"""Item 2: one frame for every RPC of every front, against a real server with a token.

Every method is taken from the service descriptors (so an RPC added later is covered
without touching this file): without the token each answers UNAUTHENTICATED, and only
``grpc.health.v1`` and reflection answer. With the token, hostile values in every string
and integer field never produce INTERNAL or UNKNOWN, a traceback, a filesystem path, or a
message longer than a short prefix of what was sent.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import pytest
from google.protobuf.descriptor import FieldDescriptor, MethodDescriptor
from google.protobuf.message import Message
from google.protobuf.message_factory import GetMessageClass
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection_pb2, reflection_pb2_grpc

from genproto.embedding.v1 import embedding_pb2 as pb
from genproto.embedding.v1 import embedding_pb2_grpc as pb_grpc
from genproto.inference.v2 import grpc_service_pb2 as oip
from genproto.inference.v2 import grpc_service_pb2_grpc as oip_grpc
from service.errors import MAX_MESSAGE_CHARS
from service.local import ServerHandle
from tests.security.conftest import AUTH, still_serves
from tests.tiny_model import MakeCheckpoint, start

Code = grpc.StatusCode
SERVICES = [pb.DESCRIPTOR.services_by_name["EmbeddingService"],
            oip.DESCRIPTOR.services_by_name["GRPCInferenceService"]]
METHODS = [m for s in SERVICES for m in s.methods]
UNAUTH = "missing or invalid 'authorization: Bearer <token>'"


def _name(method: MethodDescriptor) -> str:
    return f"{method.containing_service.name}.{method.name}"


def invoke(channel: grpc.Channel, method: MethodDescriptor, request: Message,
           metadata: Any = None) -> Any:
    """Call ``method`` with ``request`` (one item for a stream); the response(s)."""
    path = f"/{method.containing_service.full_name}/{method.name}"
    out = GetMessageClass(method.output_type).FromString
    if method.client_streaming:
        call = channel.stream_stream(path, request_serializer=lambda m: m.SerializeToString(),
                                     response_deserializer=out)
        return list(call(iter([request]), metadata=metadata, timeout=10))
    call = channel.unary_unary(path, request_serializer=lambda m: m.SerializeToString(),
                               response_deserializer=out)
    return call(request, metadata=metadata, timeout=10)


@pytest.mark.parametrize("method", METHODS, ids=_name)
def test_every_rpc_needs_the_token(channel: grpc.Channel, method: MethodDescriptor) -> None:
    request = GetMessageClass(method.input_type)()
    for metadata in (None, (("authorization", "Bearer wrong"),),
                     (("authorization", "s3cret-token"),)):  # no "Bearer "
        with pytest.raises(grpc.RpcError) as info:
            invoke(channel, method, request, metadata)
        assert (info.value.code(), info.value.details()) == (Code.UNAUTHENTICATED, UNAUTH)


def test_oip_health_rpcs_need_the_token(inference: oip_grpc.GRPCInferenceServiceStub) -> None:
    """The issue's list, named: these answered without the token before the frame."""
    for rpc, request in [("ServerLive", oip.ServerLiveRequest()),
                         ("ServerReady", oip.ServerReadyRequest()),
                         ("ModelReady", oip.ModelReadyRequest(name="tiny")),
                         ("ServerMetadata", oip.ServerMetadataRequest()),
                         ("RepositoryIndex", oip.RepositoryIndexRequest())]:
        with pytest.raises(grpc.RpcError) as info:
            getattr(inference, rpc)(request, timeout=10)
        assert info.value.code() == Code.UNAUTHENTICATED, rpc
        assert getattr(inference, rpc)(request, metadata=AUTH, timeout=10) is not None


def test_only_health_and_reflection_answer_without_it(channel: grpc.Channel) -> None:
    health = health_pb2_grpc.HealthStub(channel)
    for service in ("", "embedding.v1.EmbeddingService", "inference.GRPCInferenceService"):
        assert health.Check(health_pb2.HealthCheckRequest(service=service),
                            timeout=10).status == health_pb2.HealthCheckResponse.SERVING
    reflection = reflection_pb2_grpc.ServerReflectionStub(channel)
    (answer,) = reflection.ServerReflectionInfo(
        iter([reflection_pb2.ServerReflectionRequest(list_services="")]), timeout=10)
    names = {s.name for s in answer.list_services_response.service}
    assert {"embedding.v1.EmbeddingService", "inference.GRPCInferenceService"} <= names


# -- hostile values in every field: never INTERNAL/UNKNOWN, no path, no traceback ------------

HOSTILE_STRINGS = {
    "nul": "a\x00b",
    "superscript-two": "²",
    "5000-digits": "9" * 5000,
    "200kB": "m" * 200_000,
    "newline": "x\n2026-01-01 00:00:00 ERROR forged: line",
    "escape": "\x1b[31mred\x1b[0m",
    "path": "../../../../etc/passwd",
    "absolute": "/dev/shm/../../etc/shadow",
    "separator": "a\u2028b",
}
HOSTILE_INTS = {"min": -(2**63), "max": 2**63 - 1, "minus-one": -1}


def _fill(message: Message, value: Any, kind: str) -> Message:
    """``message`` with every top-level string (or integer) field set to ``value``, and the
    same one level down in singular message fields (EmbedRequest.output, region...)."""
    for field in message.DESCRIPTOR.fields:
        if field.is_repeated:
            continue
        if field.type == FieldDescriptor.TYPE_MESSAGE:
            _fill(getattr(message, field.name), value, kind)
        elif kind == "string" and field.type == FieldDescriptor.TYPE_STRING:
            setattr(message, field.name, value)
        elif kind == "int" and field.type in (FieldDescriptor.TYPE_INT64,
                                              FieldDescriptor.TYPE_INT32):
            bits = 63 if field.type == FieldDescriptor.TYPE_INT64 else 31
            setattr(message, field.name, max(-(2**bits), min(2**bits - 1, value)))
    return message


CASES = [(m, "string", v) for m in METHODS for v in HOSTILE_STRINGS] + [
    (m, "int", v) for m in METHODS for v in HOSTILE_INTS]


@pytest.mark.parametrize(("method", "kind", "value"), CASES,
                         ids=[f"{_name(m)}-{v}" for m, _, v in CASES])
def test_hostile_fields_get_a_clean_status(
        guarded: ServerHandle, security_repo: Path, channel: grpc.Channel,
        native: pb_grpc.EmbeddingServiceStub, caplog: pytest.LogCaptureFixture,
        method: MethodDescriptor, kind: str, value: str) -> None:
    raw = HOSTILE_STRINGS[value] if kind == "string" else HOSTILE_INTS[value]
    request = _fill(GetMessageClass(method.input_type)(), raw, kind)
    if method.name == "ModelInfer":  # reach past the tensor checks too: one valid input
        request.inputs.add(name="input_ids", datatype="INT64", shape=[1, 2]).contents \
            .int64_contents.extend([1, 2])
    with caplog.at_level(logging.INFO):
        try:
            invoke(channel, method, request, AUTH)
        except grpc.RpcError as e:
            code, details = e.code(), str(e.details())
            assert code not in (Code.INTERNAL, Code.UNKNOWN), details
            assert len(details) <= MAX_MESSAGE_CHARS + 64, len(details)
            assert "Traceback" not in details
            assert str(security_repo) not in details
            assert "/tmp" not in details, details
            if kind == "string" and len(str(raw)) > 100:
                assert str(raw)[:100] not in details  # a short prefix at most
    assert not [r for r in caplog.records if r.levelno >= logging.ERROR or r.exc_info], \
        [r.getMessage()[:200] for r in caplog.records]
    still_serves(native)


def test_model_version_edge_cases(inference: oip_grpc.GRPCInferenceServiceStub) -> None:
    """Versions are ASCII digits within int64: "²" (``isdigit`` but not ``int``), 5,000
    digits (past int()'s limit), int64 + 1, a sign, spaces: INVALID_ARGUMENT, quoted short."""
    tensor = oip.ModelInferRequest.InferInputTensor(
        name="input_ids", datatype="INT64", shape=[1, 1],
        contents=oip.InferTensorContents(int64_contents=[1]))
    for version in ("²", "9" * 5000, str(2**63), "+1", " 1", "0", "١"):
        for rpc, request in [
                ("ModelInfer", oip.ModelInferRequest(model_name="tiny", model_version=version,
                                                     inputs=[tensor])),
                ("ModelMetadata", oip.ModelMetadataRequest(name="tiny", version=version))]:
            with pytest.raises(grpc.RpcError) as info:
                getattr(inference, rpc)(request, metadata=AUTH, timeout=10)
            assert info.value.code() == Code.INVALID_ARGUMENT, (version[:8], rpc)
            assert len(info.value.details()) < 200
        ready = inference.ModelReady(oip.ModelReadyRequest(name="tiny", version=version),
                                     metadata=AUTH, timeout=10)
        assert not ready.ready
    assert inference.ModelReady(oip.ModelReadyRequest(name="tiny", version="1"),
                                metadata=AUTH, timeout=10).ready


def test_a_huge_model_name_is_not_found_with_a_short_prefix(
        native: pb_grpc.EmbeddingServiceStub) -> None:
    """A 200 kB name: NOT_FOUND (not RESOURCE_EXHAUSTED from the client's trailer limit),
    quoting 64 characters of it and its length."""
    with pytest.raises(grpc.RpcError) as info:
        native.Embed(pb.EmbedRequest(model="m" * 200_000, text="x"), metadata=AUTH,
                     timeout=10)
    assert info.value.code() == Code.NOT_FOUND
    assert info.value.details().startswith(f"model {'m' * 64!r}... (200000 characters) is "
                                           f"not loaded")


def test_a_nul_in_a_shared_memory_key_is_invalid_argument(
        native: pb_grpc.EmbeddingServiceStub, caplog: pytest.LogCaptureFixture) -> None:
    region = pb.SharedMemoryRegion(name="r", key="/abc\x00def", byte_size=64)
    with caplog.at_level(logging.INFO), pytest.raises(grpc.RpcError) as info:
        native.RegisterSharedMemory(pb.RegisterSharedMemoryRequest(region=region),
                                    metadata=AUTH, timeout=10)
    assert info.value.code() == Code.INVALID_ARGUMENT, info.value.details()
    assert not [r for r in caplog.records if r.exc_info]


# -- the repository index: why a version was refused, without the server's paths ------------

@pytest.fixture
def repo_with_bad_version(tmp_path: Path, make_checkpoint: MakeCheckpoint
                          ) -> Iterator[ServerHandle]:
    repo = tmp_path / "models"
    make_checkpoint(repo, "tiny")
    bad = make_checkpoint(repo, "tiny", version=2)
    (bad / "embeddings.safetensors").write_bytes(b"not what the manifest hashed")
    gone = make_checkpoint(repo, "tiny", version=3)
    (gone / "tokenizer.tiktoken").unlink()
    handle = start(repo, auth_token="t")
    yield handle
    handle.stop()


def test_repository_index_reasons_carry_no_filesystem_path(
        repo_with_bad_version: ServerHandle, tmp_path: Path) -> None:
    with grpc.insecure_channel(repo_with_bad_version.target) as ch:
        index = oip_grpc.GRPCInferenceServiceStub(ch).RepositoryIndex(
            oip.RepositoryIndexRequest(), metadata=(("authorization", "Bearer t"),),
            timeout=10)
    rows = {(m.name, m.version): (m.state, m.reason) for m in index.models}
    assert rows[("tiny", "1")] == ("READY", "")
    for version in ("2", "3"):
        state, reason = rows[("tiny", version)]
        assert state == "UNAVAILABLE", reason
        assert reason
        assert str(tmp_path) not in reason, reason
        assert "/tmp" not in reason, reason
        assert not any(part.startswith("/") for part in reason.split()), reason
    assert rows[("tiny", "2")][1].startswith("tiny/2/"), rows[("tiny", "2")][1]


# -- the REST face: the same frame on every /v2 route -----------------------------------------

REST = [("GET", "/v2/health/live"), ("GET", "/v2/health/ready"), ("GET", "/v2"),
        ("GET", "/v2/models/tiny"), ("GET", "/v2/models/tiny/ready"),
        ("POST", "/v2/models/tiny/infer"), ("POST", "/v2/models/tiny/tokenize"),
        ("POST", "/v2/repository/index"), ("POST", "/v2/cudasharedmemory/region/g/register"),
        ("GET", "/v2/cudasharedmemory/status"), ("POST", "/v2/cudasharedmemory/unregister")]


def _rest(handle: ServerHandle, method: str, path: str, body: bytes | None = None,
          token: str | None = None) -> tuple[int, bytes]:
    import urllib.error
    import urllib.request
    headers = {"content-type": "application/json"}
    if token is not None:
        headers["authorization"] = f"Bearer {token}"
    request = urllib.request.Request(f"http://127.0.0.1:{handle.http_port}{path}",
                                     data=body if method == "POST" else None,
                                     headers=headers, method=method)
    try:
        with urllib.request.urlopen(request, timeout=10) as reply:
            return reply.status, reply.read()
    except urllib.error.HTTPError as e:
        return e.code, e.read()


def test_every_rest_route_needs_the_token(guarded: ServerHandle) -> None:
    assert len(REST) == len(guarded.server.http.routes)  # a new route must be listed here
    for method, path in REST:
        status, body = _rest(guarded, method, path, b"{}")
        assert status == 401, (path, status, body[:200])
        status, _ = _rest(guarded, method, path, b"{}", token="s3cret-token")
        assert status != 401, path


@pytest.mark.parametrize("value", sorted(HOSTILE_STRINGS))
def test_rest_hostile_model_names_and_shapes(guarded: ServerHandle, security_repo: Path,
                                             value: str) -> None:
    import json
    import urllib.parse
    name = urllib.parse.quote(HOSTILE_STRINGS[value][:2000], safe="")
    for method, path, body in [
            ("GET", f"/v2/models/{name}", None),
            ("POST", f"/v2/models/{name}/infer", b"{}"),
            ("POST", "/v2/models/tiny/infer", json.dumps({"inputs": [
                {"name": "input_ids", "datatype": "INT64", "shape": [1_000_000, 0],
                 "data": []}]}).encode())]:
        status, reply = _rest(guarded, method, path, body, token="s3cret-token")
        assert 400 <= status < 500, (path[:80], status, reply[:200])
        text = reply.decode("utf-8", "replace")
        assert "Traceback" not in text
        assert str(security_repo) not in text
        assert len(text) <= MAX_MESSAGE_CHARS + 200

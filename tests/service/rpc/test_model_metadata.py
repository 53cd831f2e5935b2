"""ModelMetadata states what ModelInfer returns, on both OIP wires, for every rule: one
builder (``oip_tensors.model_metadata``) for gRPC and REST, and the ``embeddings`` width it
states is the width infer's rows have, also where the token table is narrower than the
served rows (OPT's ``project_in``)."""

from __future__ import annotations

import http.client
import json
from collections.abc import Iterator

import grpc
import numpy as np
import pytest
import torch
from google.protobuf import json_format

from genproto.inference.v2 import grpc_service_pb2 as oip
from genproto.inference.v2 import grpc_service_pb2_grpc as oip_grpc
from service.local import ServerHandle
from tests.hf_models import HIDDEN, served_models

# model -> (family in tests/hf_models.py, the width of its served rows, of its token rows)
MODELS = {"gpt2": (HIDDEN, HIDDEN), "opt-proj": (HIDDEN, 8), "bert": (HIDDEN, HIDDEN),
          "llama": (HIDDEN, HIDDEN), "qwen3": (HIDDEN, HIDDEN)}  # qwen3: by discovery
IDS = [5, 17, 0, 95, 42]


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerHandle]:
    with served_models(tmp_path_factory.mktemp("metadata"),
                       {name: (name, torch.float32) for name in MODELS}, "gpt2") as (handle, _):
        yield handle


def _rest(handle: ServerHandle, method: str, path: str, body: object = None
          ) -> tuple[int, dict[str, str], bytes]:
    conn = http.client.HTTPConnection("127.0.0.1", handle.http_port, timeout=30)
    try:
        conn.request(method, path, None if body is None else json.dumps(body).encode())
        r = conn.getresponse()
        return r.status, {k.lower(): v for k, v in r.getheaders()}, r.read()
    finally:
        conn.close()


def _grpc(handle: ServerHandle) -> oip_grpc.GRPCInferenceServiceStub:
    return oip_grpc.GRPCInferenceServiceStub(grpc.insecure_channel(handle.target))


@pytest.mark.parametrize("name", list(MODELS))
def test_both_wires_state_the_same_metadata(server: ServerHandle, name: str) -> None:
    status, _, body = _rest(server, "GET", f"/v2/models/{name}")
    assert status == 200
    rest = json.loads(body)
    reply = _grpc(server).ModelMetadata(oip.ModelMetadataRequest(name=name), timeout=30)
    as_json = json_format.MessageToDict(reply, preserving_proto_field_name=True)
    params = {k: next(iter(v.values())) for k, v in as_json.pop("parameters").items()}
    params["hidden_size"] = int(params["hidden_size"])  # int64 is a JSON string in proto3
    for tensor in (*as_json["inputs"], *as_json["outputs"]):
        tensor["shape"] = [int(d) for d in tensor["shape"]]
    assert rest == {**as_json, "parameters": params}
    width, _ = MODELS[name]
    assert rest["outputs"][0] == {"name": "embeddings", "datatype": "FP32",
                                  "shape": [-1, -1, width]}
    assert rest["parameters"]["hidden_size"] == width


@pytest.mark.parametrize("name", list(MODELS))
@pytest.mark.parametrize("compose", ["token_plus_position", "token_only"])
def test_infer_returns_the_width_metadata_states(server: ServerHandle, name: str,
                                                 compose: str) -> None:
    width, token_width = MODELS[name]
    if compose == "token_only":
        width = token_width  # token-only rows are the table's own: narrower with project_in
    body = {"inputs": [{"name": "input_ids", "datatype": "INT64", "shape": [1, len(IDS)],
                        "data": IDS}],
            "parameters": {"compose": compose}, "outputs": [{"name": "embeddings"}]}
    status, _, data = _rest(server, "POST", f"/v2/models/{name}/infer", body)
    assert status == 200, data
    (out,) = json.loads(data)["outputs"]
    assert out["shape"] == [1, len(IDS), width]
    request = oip.ModelInferRequest(model_name=name, raw_input_contents=[
        np.asarray([IDS], dtype="<i8").tobytes()])
    request.inputs.add(name="input_ids", datatype="INT64", shape=[1, len(IDS)])
    request.parameters["compose"].string_param = compose
    reply = _grpc(server).ModelInfer(request, timeout=30)
    assert list(reply.outputs[0].shape) == [1, len(IDS), width]
    assert len(reply.raw_output_contents[0]) == len(IDS) * width * 4
    rows = np.frombuffer(reply.raw_output_contents[0], dtype="<f4").reshape(-1, width)
    assert np.array_equal(rows, np.asarray(out["data"], dtype=np.float32).reshape(-1, width))


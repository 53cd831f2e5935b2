"""The REST front with the real ``tritonclient.http`` (2.73.0), in this process, every row of
the shared request table (``tests/vectors/oip_cases.json``) included: it speaks
HTTP/JSON with geventhttpclient and registers no protobuf, so it lives beside genproto
(unlike tritonclient.grpc, see tests/oip/triton_driver.py)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
import tritonclient.http as th
from tritonclient.utils import InferenceServerException

from genproto.embedding.v1 import embedding_pb2 as pb
from genproto.embedding.v1 import embedding_pb2_grpc as pb_grpc
from service.local import ServerHandle
from tests.oip_cases import CASES, COMPOSE, DATATYPES, OipCase, Outcome, check, native_rows
from tests.service.rpc.http.conftest import TINY_METADATA
from tests.tiny_model import DIM, start

IDS = np.array([[31373, 995, 0, 50256, 7], [1, 2, 3, 4, 5]], dtype=np.int64)


@pytest.fixture(scope="module")
def client(server: ServerHandle) -> Iterator[th.InferenceServerClient]:
    c = th.InferenceServerClient(f"127.0.0.1:{server.http_port}")
    yield c
    c.close()


def ids_input(ids: np.ndarray, binary: bool = True) -> th.InferInput:
    inp = th.InferInput("input_ids", list(ids.shape), "INT64" if ids.dtype == np.int64
                        else "INT32")
    inp.set_data_from_numpy(ids, binary_data=binary)
    return inp


def test_health_and_metadata(client: th.InferenceServerClient) -> None:
    assert client.is_server_live()
    assert client.is_server_ready()
    assert client.is_model_ready("tiny")
    assert client.is_model_ready("tiny", "1")
    assert not client.is_model_ready("nope")
    assert client.get_model_metadata("tiny") == TINY_METADATA
    assert client.get_server_metadata()["extensions"] == ["parameters", "binary_tensor_data"]


@pytest.mark.parametrize("datatype", list(DATATYPES))
@pytest.mark.parametrize("compose", list(COMPOSE))
def test_binary_infer_equals_native(client: th.InferenceServerClient,
                                    native: pb_grpc.EmbeddingServiceStub, datatype: str,
                                    compose: str) -> None:
    result = client.infer("tiny", [ids_input(IDS)], request_id="r-7",
                          outputs=[th.InferRequestedOutput("embeddings", binary_data=True),
                                   th.InferRequestedOutput("sequence_lengths")],
                          parameters={"start_position": 3, "compose": compose,
                                      "datatype": datatype})
    x = result.as_numpy("embeddings")
    assert x is not None
    assert x.shape == (2, 5, DIM)
    assert x.tobytes() == native_rows(native, IDS.tolist(), start_position=3,
                                      compose=COMPOSE[compose], dtype=DATATYPES[datatype])
    assert result.as_numpy("sequence_lengths").tolist() == [5, 5]
    response = result.get_response()
    assert response["id"] == "r-7"
    assert response["parameters"]["start_position"] == 3


@pytest.mark.parametrize("compose", list(COMPOSE))
def test_json_infer_fp32_equals_native(client: th.InferenceServerClient,
                                       native: pb_grpc.EmbeddingServiceStub,
                                       compose: str) -> None:
    result = client.infer("tiny", [ids_input(IDS.astype(np.int32), binary=False)],
                          model_version="1",
                          outputs=[th.InferRequestedOutput("embeddings", binary_data=False)],
                          parameters={"compose": compose})
    x = result.as_numpy("embeddings")
    assert x is not None
    assert x.dtype == np.float32
    assert x.tobytes() == native_rows(native, IDS.tolist(), compose=COMPOSE[compose])


def test_default_outputs_and_text(client: th.InferenceServerClient,
                                  native: pb_grpc.EmbeddingServiceStub) -> None:
    text = th.InferInput("text", [1], "BYTES")
    text.set_data_from_numpy(np.array([b"hello world"], dtype=object))
    result = client.infer("tiny", [text])  # no outputs: all of them, binary
    expected = native.Embed(pb.EmbedRequest(text="hello world")).embeddings.data
    assert result.as_numpy("embeddings").tobytes() == expected
    assert result.as_numpy("sequence_lengths").tolist() == [2]


def test_json_half_precision_is_refused(client: th.InferenceServerClient) -> None:
    """REST only (JSON has no 16-bit floats); the refusals both forms share are the table's."""
    with pytest.raises(InferenceServerException) as info:
        client.infer("tiny", [ids_input(IDS)], parameters={"datatype": "FP16"},
                     outputs=[th.InferRequestedOutput("embeddings", binary_data=False)])
    assert (info.value.status(), info.value.message()) == (
        "400", "sending FP16 data via JSON is not supported: ask for output 'embeddings' "
        "with parameters {\"binary_data\": true} (the binary tensor data extension)")
    assert client.infer("tiny", [ids_input(IDS)]).as_numpy("embeddings").shape == (2, 5, DIM)


_WIRE = {"INT64": np.int64, "INT32": np.int32, "FP32": np.float32}  # input_ids as sent


def table_outcome(port: int, case: OipCase) -> Outcome:
    """One row of the shared table through tritonclient.http (binary tensors both ways)."""
    if "ids" in case.request:
        wire = case.request.get("datatype", "INT64")
        data = np.array(case.request["ids"], dtype=_WIRE[wire])
        inp = th.InferInput("input_ids", list(data.shape), wire)
    else:
        data = np.array(case.texts(), dtype=object)
        inp = th.InferInput("text", list(data.shape), "BYTES")
    inp.set_data_from_numpy(data, binary_data=True)
    outputs = [th.InferRequestedOutput(n, binary_data=True)
               for n in case.request.get("outputs", [])] or None
    c = th.InferenceServerClient(f"127.0.0.1:{port}")
    try:
        result = c.infer(case.model, [inp], model_version=case.version, outputs=outputs,
                         request_id=case.request.get("id", ""),
                         parameters=case.request.get("parameters"), headers=case.headers)
    except InferenceServerException as e:
        return Outcome(int(str(e.status())), e.message())
    finally:
        c.close()
    names = [o["name"] for o in result.get_response()["outputs"]]
    return Outcome(shapes={n: result.get_output(n)["shape"] for n in names},
                   data={n: result.as_numpy(n).tobytes() for n in names})


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.name)
def test_table_row(case_servers: dict[str, ServerHandle], case: OipCase) -> None:
    handle = case_servers[case.server]
    check(handle.target, case, table_outcome(handle.http_port, case), http=True)


def test_token_and_limits(tiny_repo: Path) -> None:
    handle = start(tiny_repo, auth_token="t0ken", max_message_bytes=2000)
    c = th.InferenceServerClient(f"127.0.0.1:{handle.http_port}")
    try:
        with pytest.raises(InferenceServerException) as info:
            c.infer("tiny", [ids_input(IDS)])
        assert (info.value.status(), info.value.message()) == (
            "401", "missing or invalid 'authorization: Bearer <token>'")
        assert not c.is_server_ready()
        auth = {"Authorization": "Bearer t0ken"}
        assert c.is_server_ready(headers=auth)
        with pytest.raises(InferenceServerException) as info:
            c.infer("tiny", [ids_input(np.arange(20).reshape(1, 20))], headers=auth)
        assert info.value.status() == "429"
        assert info.value.message().endswith("the largest T that fits is 12")
        assert c.infer("tiny", [ids_input(IDS)], headers=auth).as_numpy(
            "sequence_lengths").tolist() == [5, 5]
    finally:
        c.close()
        handle.stop()

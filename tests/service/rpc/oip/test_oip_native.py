"""The OIP face through its own generated stubs: typed contents, one batcher shared with
the native API, the repository index and reflection."""

from __future__ import annotations

import asyncio
import urllib.request
from pathlib import Path

import grpc
import numpy as np
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection_pb2, reflection_pb2_grpc

from genproto.embedding.v1 import embedding_pb2 as pb
from genproto.embedding.v1 import embedding_pb2_grpc as pb_grpc
from genproto.inference.v2 import grpc_service_pb2 as oip
from genproto.inference.v2 import grpc_service_pb2_grpc as oip_grpc
from service.local import ServerHandle
from tests.tiny_model import DIM, MakeCheckpoint, start

IDS = [31373, 995, 0, 50256]


def infer_request(**fields: object) -> oip.ModelInferRequest:
    tensor = oip.ModelInferRequest.InferInputTensor
    return oip.ModelInferRequest(model_name="tiny", inputs=[tensor(
        name="input_ids", datatype="INT64", shape=[1, len(IDS)],
        contents=oip.InferTensorContents(int64_contents=IDS))], **fields)  # type: ignore[arg-type]


def test_typed_contents_equal_raw_and_native(server: ServerHandle) -> None:
    with grpc.insecure_channel(server.target) as channel:
        typed = oip_grpc.GRPCInferenceServiceStub(channel).ModelInfer(infer_request())
        request = infer_request()
        request.inputs[0].ClearField("contents")
        request.raw_input_contents.append(np.asarray(IDS, "<i8").tobytes())
        raw = oip_grpc.GRPCInferenceServiceStub(channel).ModelInfer(request)
        native = pb_grpc.EmbeddingServiceStub(channel).Embed(
            pb.EmbedRequest(token_ids=pb.TokenIds(ids=IDS)))
        health = health_pb2_grpc.HealthStub(channel).Check(
            health_pb2.HealthCheckRequest(service="inference.GRPCInferenceService"))
    assert health.status == health_pb2.HealthCheckResponse.SERVING
    assert typed.raw_output_contents[0] == raw.raw_output_contents[0] == native.embeddings.data
    assert [(o.name, o.datatype, list(o.shape)) for o in typed.outputs] == [
        ("embeddings", "FP32", [1, len(IDS), DIM]), ("sequence_lengths", "INT64", [1])]
    assert np.frombuffer(typed.raw_output_contents[1], "<i8").tolist() == [len(IDS)]


def test_oip_and_native_requests_share_one_batch(tiny_repo: Path) -> None:
    handle = start(tiny_repo, max_batch_delay_us=200_000)  # both arrive within the delay

    async def both() -> tuple[bytes, bytes]:
        async with grpc.aio.insecure_channel(handle.target) as channel:
            native, infer = await asyncio.gather(
                pb_grpc.EmbeddingServiceStub(channel).Embed(
                    pb.EmbedRequest(token_ids=pb.TokenIds(ids=IDS[:3]))),
                oip_grpc.GRPCInferenceServiceStub(channel).ModelInfer(infer_request()))
        return native.embeddings.data, infer.raw_output_contents[0]

    try:
        native, infer = asyncio.run(both())
        url = f"http://127.0.0.1:{handle.server.metrics_port}/metrics"
        with urllib.request.urlopen(url, timeout=10) as response:
            text = response.read().decode()
    finally:
        handle.stop()
    lines = dict(line.rsplit(" ", 1) for line in text.splitlines()
                 if line.startswith(("embed_batch_requests_", "embed_batch_tokens_")))
    # One batch of two requests (3 + 4 tokens): the fronts were coalesced.
    assert (lines["embed_batch_requests_count"], lines["embed_batch_requests_sum"]) == \
        ("1.0", "2.0")
    assert lines["embed_batch_tokens_sum"] == "7.0"
    assert len(native) == 3 * DIM * 4
    assert len(infer) == 4 * DIM * 4
    assert 'embed_requests_total{code="OK",model="tiny",rpc="ModelInfer"} 1.0' in text


def test_repository_index_and_reflection(tmp_path: Path, make_checkpoint: MakeCheckpoint) -> None:
    make_checkpoint(tmp_path, "tiny", version=1)
    make_checkpoint(tmp_path, "tiny", version=2, seed=3)
    bad = make_checkpoint(tmp_path, "tiny", version=3, seed=4)
    (bad / "embeddings.safetensors").write_bytes(b"not the file the manifest hashed")
    handle = start(tmp_path)
    try:
        with grpc.insecure_channel(handle.target) as channel:
            index = oip_grpc.GRPCInferenceServiceStub(channel).RepositoryIndex(
                oip.RepositoryIndexRequest())
            ready = oip_grpc.GRPCInferenceServiceStub(channel).RepositoryIndex(
                oip.RepositoryIndexRequest(ready=True))
            reflect = reflection_pb2_grpc.ServerReflectionStub(channel)
            (answer,) = reflect.ServerReflectionInfo(iter([
                reflection_pb2.ServerReflectionRequest(list_services="")]))
    finally:
        handle.stop()
    rows = [(m.name, m.version, m.state) for m in index.models]
    assert rows == [("tiny", "1", "AVAILABLE"), ("tiny", "2", "READY"),
                    ("tiny", "3", "UNAVAILABLE")]
    assert "sha256" in index.models[2].reason
    assert [(m.name, m.version) for m in ready.models] == [("tiny", "2")]
    services = sorted(s.name for s in answer.list_services_response.service)
    assert services == ["embedding.v1.EmbeddingService", "grpc.health.v1.Health",
                        "grpc.reflection.v1alpha.ServerReflection",
                        "inference.GRPCInferenceService"]

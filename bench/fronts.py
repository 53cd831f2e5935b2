"""Load for the other ways out of the service: the OIP face and shared-memory output.

``oip``: ModelInfer with ``input_ids`` INT64 [1, T] in raw_input_contents and only the
``embeddings`` output requested; each reply's raw_output_contents[0] decoded to numpy.
``shm``: each in-flight slot owns a /dev/shm region registered with the service; Embed
names it as the output, and each reply's rows are read back as a numpy view of the region
(no copy), so the bytes never cross the transport. Both are measured against the same
transport ceiling as unary Embed (a precomputed [T, C] reply over gRPC).
"""

from __future__ import annotations

import asyncio
import time

import grpc
import numpy as np

from bench.window import Window
from client.shm import SharedMemoryRegion, rows_from_region
from genproto.embedding.v1 import embedding_pb2 as pb
from genproto.inference.v2 import grpc_service_pb2 as oip
from service.rpc.oip_tensors import DATATYPES

__all__ = ["OIP_DATATYPES", "oip_request", "run_oip", "run_shm"]

OIP_DATATYPES = DATATYPES  # proto DType → OIP datatype name, as the server maps them
_NP = {"FP32": np.float32, "FP16": np.float16, "BF16": np.uint16}


def oip_request(request: pb.EmbedRequest) -> oip.ModelInferRequest:
    """The ModelInfer equivalent of an ids-only Embed request."""
    ids = np.asarray(request.token_ids.ids, dtype="<i8")
    tensor = oip.ModelInferRequest.InferInputTensor(name="input_ids", datatype="INT64",
                                                    shape=[1, len(ids)])
    out = oip.ModelInferRequest(
        model_name=request.model, inputs=[tensor], raw_input_contents=[ids.tobytes()],
        outputs=[oip.ModelInferRequest.InferRequestedOutputTensor(name="embeddings")])
    out.parameters["datatype"].string_param = OIP_DATATYPES[request.dtype]
    return out


def _decode_oip(resp: oip.ModelInferResponse) -> np.ndarray:
    out = resp.outputs[0]
    shape = tuple(out.shape)[1:]  # (T, C) of the [1, T, C] output
    return np.frombuffer(resp.raw_output_contents[0], dtype=_NP[out.datatype]).reshape(shape)


async def run_oip(channel: grpc.aio.Channel, requests: list[pb.EmbedRequest],
                  concurrency: int, window: Window) -> None:
    """``concurrency`` coroutines, each one ModelInfer at a time."""
    call = channel.unary_unary("/inference.GRPCInferenceService/ModelInfer",
                               request_serializer=oip.ModelInferRequest.SerializeToString,
                               response_deserializer=oip.ModelInferResponse.FromString)
    infer = [oip_request(r) for r in requests]

    async def worker(offset: int) -> None:
        i = offset
        while (sent := time.perf_counter_ns()) < window.end:
            resp = await call(infer[i % len(infer)])
            window.done(sent, _decode_oip(resp))
            i += 1

    async with asyncio.TaskGroup() as tg:
        for k in range(concurrency):
            tg.create_task(worker(k))


async def run_shm(channel: grpc.aio.Channel, requests: list[pb.EmbedRequest],
                  concurrency: int, window: Window, row_bytes: int) -> None:
    """``concurrency`` coroutines, each with its own region, one Embed at a time."""
    embed = channel.unary_unary("/embedding.v1.EmbeddingService/Embed",
                                request_serializer=pb.EmbedRequest.SerializeToString,
                                response_deserializer=pb.EmbedResponse.FromString)
    register = channel.unary_unary(
        "/embedding.v1.EmbeddingService/RegisterSharedMemory",
        request_serializer=pb.RegisterSharedMemoryRequest.SerializeToString,
        response_deserializer=pb.RegisterSharedMemoryResponse.FromString)
    unregister = channel.unary_unary(
        "/embedding.v1.EmbeddingService/UnregisterSharedMemory",
        request_serializer=pb.UnregisterSharedMemoryRequest.SerializeToString,
        response_deserializer=pb.UnregisterSharedMemoryResponse.FromString)
    size = max(len(r.token_ids.ids) for r in requests) * row_bytes
    regions = [SharedMemoryRegion(f"bench{k}", size) for k in range(concurrency)]

    async def worker(k: int) -> None:
        region = regions[k]
        await register(pb.RegisterSharedMemoryRequest(region=region.region_message()))
        try:
            mine = [pb.EmbedRequest() for _ in requests]
            for m, r in zip(mine, requests):
                m.CopyFrom(r)
                m.output.CopyFrom(pb.SharedMemoryOutput(region=region.name))
            i = k
            while (sent := time.perf_counter_ns()) < window.end:
                resp = await embed(mine[i % len(mine)])
                rows = rows_from_region(region, resp.embeddings, resp.output,
                                        raw_bfloat16=True)  # (T, C) view, no copy
                window.done(sent, rows)
                del rows
                i += 1
        finally:
            await unregister(pb.UnregisterSharedMemoryRequest(name=region.name))

    try:
        async with asyncio.TaskGroup() as tg:
            for k in range(concurrency):
                tg.create_task(worker(k))
    finally:
        for region in regions:
            region.close()
